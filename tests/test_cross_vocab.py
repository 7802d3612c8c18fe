"""Drafts of another vocabulary (issue 21 item 2), with the tinyworld 8-layer LLaVA target:

- another tokenizer: a text-only Llama draft whose token ids are all different (the
  tinyworld draft's language model with its vocabulary reversed: the same text, other
  ids), and a random draft with a byte-level tokenizer of its own. Method chain drafts
  through text (drafters/retokenized.py): T = 0 equals target-only; the reversed draft is
  accepted about as often as the same-tokenizer draft is; at T > 0 the first tokens follow
  the target's exact distribution; every other method or input is refused before the
  draft's weights load;
- the same tokenizer with a larger head (padding rows the draft would pick) or a smaller
  embedding table: T = 0 equals target-only, drafts are accepted.
"""

from __future__ import annotations

import json
import shutil

import pytest
import torch

from conftest import ROOT, fresh_scenes
from vlmspec_cli.profile import load_profile
from vlmspec_cli.runtime.models.loading import ModelLoadError
from vlmspec_cli.runtime.request import Message, Request
from vlmspec_cli.session import build_session

SOURCE = ROOT / "vlmspec_cli" / "zoo" / "weights" / "tinyworld" / "llava-draft"
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja")


def _text_lm(source=SOURCE):
    """A tinyworld LLaVA draft's language model and head as a LlamaForCausalLM (text only)."""
    from transformers import LlamaForCausalLM, LlavaForConditionalGeneration

    llava = LlavaForConditionalGeneration.from_pretrained(source)
    text = llava.config.text_config
    lm = LlamaForCausalLM(text).eval()
    lm.model.load_state_dict(llava.model.language_model.state_dict())
    lm.lm_head.load_state_dict(llava.lm_head.state_dict())
    return lm


def reversed_draft(folder, source=SOURCE):
    """The same text model with token id i stored as id V-1-i: tokenizer, embeddings,
    head and special ids all permuted, so no id means what it means to the target."""
    lm = _text_lm(source)
    vocab = lm.config.vocab_size
    flip = torch.arange(vocab - 1, -1, -1)
    with torch.no_grad():
        lm.model.embed_tokens.weight.copy_(lm.model.embed_tokens.weight[flip])
        lm.lm_head.weight.copy_(lm.lm_head.weight[flip])
    for key in ("bos_token_id", "eos_token_id", "pad_token_id"):
        value = getattr(lm.config, key)
        if value is not None:
            setattr(lm.config, key, vocab - 1 - value)
            setattr(lm.generation_config, key, vocab - 1 - value)
    folder.mkdir(parents=True)
    lm.save_pretrained(folder)
    for name in TOKENIZER_FILES:
        shutil.copy(source / name, folder / name)
    tok = json.loads((source / "tokenizer.json").read_text())
    tok["model"]["vocab"] = {t: vocab - 1 - i for t, i in tok["model"]["vocab"].items()}
    for added in tok["added_tokens"]:
        added["id"] = vocab - 1 - added["id"]
    (folder / "tokenizer.json").write_text(json.dumps(tok))
    return folder


def byte_draft(folder, seed: int = 5):
    """A random 1-layer Llama over a byte-level tokenizer with no merges (256 + 2 ids)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    alphabet = pre_tokenizers.ByteLevel.alphabet()
    vocab = {"<s>": 0, "</s>": 1} | {c: i + 2 for i, c in enumerate(sorted(alphabet))}
    tk = Tokenizer(models.BPE(vocab, merges=[]))
    tk.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tk.decoder = decoders.ByteLevel()
    tok = PreTrainedTokenizerFast(tokenizer_object=tk, bos_token="<s>", eos_token="</s>")
    torch.manual_seed(seed)
    config = LlamaConfig(vocab_size=len(vocab), hidden_size=32, intermediate_size=64,
                         num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=2,
                         bos_token_id=0, eos_token_id=1, pad_token_id=None)
    folder.mkdir(parents=True)
    LlamaForCausalLM(config).eval().save_pretrained(folder)
    tok.save_pretrained(folder)
    return folder


def resized_draft(folder, rows: int):
    """llava-draft's text model with ``rows`` vocabulary rows: extra head rows with large
    weights (the draft would always pick them) or a table cut short."""
    lm = _text_lm()
    old = lm.config.vocab_size
    lm.resize_token_embeddings(rows, mean_resizing=False)
    if rows > old:
        with torch.no_grad():
            lm.lm_head.weight[old:] = 50 * lm.lm_head.weight[:old].abs().max()
    folder.mkdir(parents=True)
    lm.save_pretrained(folder)
    for name in TOKENIZER_FILES:
        shutil.copy(SOURCE / name, folder / name)
    return folder


@pytest.fixture(scope="module")
def drafts(tmp_path_factory):
    root = tmp_path_factory.mktemp("cross_vocab")
    return {"reversed": reversed_draft(root / "reversed"), "bytes": byte_draft(root / "bytes"),
            "wide": resized_draft(root / "wide", 520), "narrow": resized_draft(root / "narrow", 300)}


def _requests(n: int = 3, tokens: int = 24) -> list[Request]:
    scenes = [image for _, image in fresh_scenes(n, seed=2111)]
    reqs = [Request([Message("user", "describe the image.", (im,))], max_new_tokens=tokens)
            for im in scenes]
    reqs.append(Request([Message("user", "what is in this image?", (scenes[0],)),
                         Message("assistant", "a red circle."),
                         Message("user", "and in this one?", (scenes[1],))], max_new_tokens=tokens))
    return reqs


def _session(draft, *sets: str):
    profile = load_profile("tinyworld-small", [f"draft.model={draft}", "drafting.inputs=[text]",
                                               "drafting.length=fixed", *sets])   # drafts every round
    return build_session(profile)


def _decode(session, requests):
    """(tokens per request, accepted proposals in all) with the session's engine."""
    out, accepted = [], 0
    for req in requests:
        res = session.engine.generate(req)
        out.append(res.tokens)
        accepted += res.state.stats.num_accepted_tokens
    return out, accepted


@pytest.mark.parametrize("name", ["reversed", "bytes", "wide", "narrow"])
def test_other_vocabularies_equal_target_only(drafts, name):
    session = _session(drafts[name])
    requests = _requests()
    tokens, accepted = _decode(session, requests)
    assert tokens == [session.baseline_engine().generate(r).tokens for r in requests]
    retokenized = type(session.engine.drafter).__name__ == "RetokenizedDrafter"
    assert retokenized == (name in ("reversed", "bytes"))
    if name != "bytes":                                   # a trained draft is accepted
        assert accepted > 0


def test_reversed_ids_are_accepted_like_the_same_tokenizer(drafts):
    """Through text, a draft whose ids are all different proposes what the same draft with
    the target's ids proposes: acceptance within 10% of it."""
    requests = _requests()
    _, same = _decode(_session("zoo:tinyworld/llava-draft"), requests)
    _, through_text = _decode(_session(drafts["reversed"]), requests)
    assert same > 20 and through_text >= 0.9 * same


@pytest.mark.parametrize("sets,match", [
    (["method=tabed", "drafting.inputs=[multimodal,text]"], "method 'tabed'"),
    (["method=tree"], "method 'tree'"),
    (["drafting.inputs=[multimodal]"], r"inputs \['multimodal'\]"),
])
def test_other_methods_are_refused_before_the_draft_loads(drafts, tmp_path, sets, match):
    """Refused from the tokenizer alone: the draft's weights are not its model's (one dummy
    tensor in a well-formed file, which the checks before loading accept), so loading it
    would fail."""
    from safetensors.torch import save_file

    folder = tmp_path / "draft"
    shutil.copytree(drafts["reversed"], folder)
    save_file({"dummy": torch.zeros(1)}, str(folder / "model.safetensors"))
    with pytest.raises(ModelLoadError, match=match):
        _session(folder, *sets)


def test_batches_are_refused_with_a_reason(drafts):
    session = _session(drafts["reversed"], "generation.batch_size=2")
    with pytest.raises(ValueError, match="another tokenizer.*batch-size 1"):
        session.batched_engine()


def test_first_tokens_follow_the_target_distribution(drafts):
    """T = 1: the first generated token of 300 seeded runs with the reversed draft
    against the target's exact distribution (from its prefill logits) (the test can fail: a uniform law over the same tokens is rejected)."""
    from scipy.stats import chisquare

    from vlmspec_cli.runtime.round.verify import SamplingParams, probabilities

    session = _session(drafts["reversed"], "sampling.temperature=1.0")
    image = next(iter(fresh_scenes(1, seed=77)))[1]
    runs = 300
    firsts = []
    for seed in range(runs):
        req = Request([Message("user", "describe the image.", (image,))], max_new_tokens=2, seed=seed)
        firsts.append(session.engine.generate(req).tokens[0])
    state = session.baseline_engine().start(Request([Message("user", "describe the image.", (image,))],
                                                    max_new_tokens=2))
    p = probabilities(state.target_next_logits.float(), SamplingParams(1.0)).cpu()
    keep = (p * runs >= 5).nonzero().flatten().tolist()
    observed = [sum(t == k for t in firsts) for k in keep] + [sum(t not in keep for t in firsts)]
    expected = [float(p[k]) * runs for k in keep] + [runs * (1 - float(p[keep].sum()))]
    if expected[-1] < 1e-6:
        observed, expected = observed[:-1], expected[:-1]
    expected = [e * sum(observed) / sum(expected) for e in expected]   # float rounding
    assert chisquare(observed, expected).pvalue > 1e-3
    uniform = [runs / len(observed)] * len(observed)      # a law that differs is rejected
    assert chisquare(observed, uniform).pvalue < 1e-3


def test_calibrate_lists_what_a_draft_of_another_tokenizer_cannot_run(drafts):
    """`vlmspec calibrate` with such a draft tries what it can (chains on text, heads,
    twigs) and names the probes it cannot run, with the reason, instead of failing."""
    from vlmspec_cli.tasks.calibrate import calibrate

    base = load_profile("tinyworld-small", [f"draft.model={drafts['reversed']}",
                                            "drafting.inputs=[text]", "generation.max_new_tokens=8"])
    request = Request([Message("user", "describe the image.", (fresh_scenes(1, seed=5)[0][1],))],
                      max_new_tokens=8)
    result = calibrate(base, [request], gammas=[2], budget_s=600)
    refused = [s for s in result.skipped if "another tokenizer" in s]
    assert len(refused) == 1 and "tree T" in refused[0]
    assert {"chain", "hidden"} <= {c.method for c in result.candidates}
