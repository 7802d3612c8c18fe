"""``eagle3`` over a whole decode: every round's first proposal is what the head reads off
the target's states of the whole sequence in one go (issue 60: the tinyworld head's τ ≈ 1
on MMSpec questions is the head's, not the bookkeeping's).

The reference is independent of the drafter: the target's own transformers forward over
prompt + answer (its ``hidden_states`` at the head's three layers; Qwen2.5-VL's 3-D
positions from its own ``get_rope_index`` over the whole sequence), and the head over all
the pairs (x_{t+1}, fc(g_t)) at once. The drafter instead feeds the prompt at prefill and
the verified rows round by round (after rejections, across the turns of a chat whose
later turns carry no image, and in a second request on the same session: a stale cache,
wrong positions, a wrong layer or an off-by-one row would each change some proposal)."""

from __future__ import annotations

import pytest
import torch
from PIL import Image

from test_eagle3 import _session, targets  # noqa: F401  (the module's fixture)
from vlmspec_cli.runtime.request import Message, Request
from vlmspec_cli.runtime.round.verify import draft_vocab_logits, probabilities


def _requests() -> list[Request]:
    """MMSpec's shape: an image with the first question, the answer fed back, a text-only
    follow-up; then a single question about another image."""
    red, green = Image.new("RGB", (100, 60), (200, 30, 30)), Image.new("RGB", (64, 120), (20, 160, 60))
    return [Request([Message("user", "what is in this image?", (red,)),
                     Message("assistant", "a red thing."),
                     Message("user", "which colour is it?")], max_new_tokens=16),
            Request([Message("user", "how many shapes are there?", (green,))], max_new_tokens=16)]


@torch.inference_mode()
def _whole_sequence_logits(session, request: Request, tokens: list[int]) -> tuple[torch.Tensor, int]:
    """The head's target-vocabulary logits at every position of prompt + answer (row t
    predicts the token at t + 2), read in one pass; and the prompt's length."""
    lm, drafter = session.target, session.engine.drafter
    head = drafter.head
    inputs = lm.adapter.encode(lm, lm.adapter.prompt_text(lm, request.messages), request.images)
    prompt = inputs["input_ids"].shape[1]
    fed = torch.tensor([tokens[:-1]], device=lm.device)        # the last token is never fed
    inputs["input_ids"] = torch.cat([inputs["input_ids"], fed], 1)
    if "mm_token_type_ids" in inputs:   # Qwen-VL: the whole sequence's 3-D positions
        inputs["mm_token_type_ids"] = torch.cat([inputs["mm_token_type_ids"], torch.zeros_like(fed)], 1)
        inputs["attention_mask"] = torch.ones_like(inputs["input_ids"])
        inputs = lm.adapter._with_positions(lm, inputs)
        positions = inputs["position_ids"][:, 0]
    else:
        inputs.pop("attention_mask", None)
        positions = torch.arange(inputs["input_ids"].shape[1])[None].expand(3, -1)
    inputs.pop("rope_deltas", None)
    states = lm.model(**inputs, output_hidden_states=True).hidden_states
    g = torch.cat([states[i][0] for i in drafter.hidden_layer], -1)
    ids = torch.cat([inputs["input_ids"][0], torch.tensor(tokens[-1:], device=lm.device)])
    out = head(drafter.embed(ids[None, 1:]), head.project(g)[None], positions, head.new_cache())[0]
    return draft_vocab_logits(head.logits(out).float(), head.target_ids, drafter.vocab), prompt


@pytest.mark.parametrize("family", ["llava", "qwen2_5_vl"])
@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_each_rounds_first_proposal_is_the_heads_reading_of_the_whole_sequence(targets, family,  # noqa: F811
                                                                               temperature):
    """T = 0: the proposed token is the whole-sequence argmax; T = 1: its q is the whole
    sequence's distribution (every key the head attends to counts, not only the argmax)."""
    target, head = targets[family]
    session = _session(target, head, "drafting.gamma=3", "drafting.length=fixed",
                       f"sampling.temperature={temperature}")
    drafter = session.engine.drafter
    rounds: list[tuple[int, int, torch.Tensor | None]] = []
    propose = drafter.propose

    def spy(state, max_tokens):
        from_head = state.drafter_state.first_logits is None   # round 1 proposes the target's own
        draft = propose(state, max_tokens)
        if from_head:
            rounds.append((len(state.tokens), draft.tokens[0], None if draft.probs is None else draft.probs[0]))
        return draft

    drafter.propose = spy
    checked = rejected = 0
    for request in _requests():
        rounds.clear()
        res = session.engine.generate(request)
        logits, prompt = _whole_sequence_logits(session, request, res.tokens)
        for j, proposed, q in rounds:   # answer token j, predicted at position prompt + j - 2
            row = logits[prompt + j - 2]
            where = (family, request.messages[-1].text, j)
            if q is None:
                assert row[proposed] >= row.max() - 1e-4, where
            else:
                torch.testing.assert_close(q.cpu(), probabilities(row, drafter.sampling).cpu(),
                                           rtol=1e-3, atol=1e-5, msg=lambda m: f"{where}: {m}")
            checked += 1
        rejected += res.state.stats.num_draft_tokens - res.state.stats.num_accepted_tokens
    assert checked >= 6 and rejected > 0   # rounds after rejections were checked too
