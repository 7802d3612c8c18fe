"""``eagle3``: a published EAGLE-3 head (the layout SpecForge writes and vLLM / SGLang load:
runtime/models/eagle3_format.py) drafting for the target it was trained on.

It is the hidden-state head's bookkeeping (drafters/hidden.py: the target's states of
verified rows are read in the next round, the head's speculative cache entries are cut
after verification, chains or EAGLE-2 trees) with EAGLE-3's reads:

* the target's states of three layers, concatenated (``hidden_layer`` is a tuple: the
  engine asks the target's forwards for them) and projected by the head's fc when they
  arrive (``_target_rows``); drafting on feeds the head's own outputs, unprojected;
* every prompt position, visual ones included, as the engines and SpecForge's training
  feed it: the pair (e(x_{t+1}), fc(g_t)) at the target's position t — its 3-D M-RoPE
  position for a head whose config has ``mrope_section`` (Qwen-VL targets); later
  positions are the cache index plus the target's rope offset;
* the draft vocabulary: the head's logits are put on the target's ids by d2t
  (verify.py ``draft_vocab_logits``: q = 0 off the mapped ids), so proposals, trees and
  verification all work over the target's vocabulary, and stay exact.

The first token of a reply is the target's own (q = p), as for the hidden head. Drafts are
verified by the target, so the method is lossless whatever the head.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from vlmspec_cli.drafters.base import register
from vlmspec_cli.drafters.hidden import HiddenDrafter, HiddenState, TreeSettings
from vlmspec_cli.runtime.models.eagle3_format import target_layers
from vlmspec_cli.runtime.round.engine import eos_token_ids
from vlmspec_cli.runtime.models.loading import load_eagle3_head
from vlmspec_cli.runtime.request import DecodeState
from vlmspec_cli.runtime.round.tree_shape import FixedShape
from vlmspec_cli.runtime.round.verify import SamplingParams, draft_vocab_logits


@dataclass
class Eagle3State(HiddenState):
    delta: int = 0     # an M-RoPE head: text positions after the prompt are index + delta


def check_target(head, target) -> int:
    """Refuse a head made for another target (one line); returns the target's layer count."""
    c = head.config
    width = int(target.model.get_input_embeddings().weight.shape[1])
    if c.vocab_size != target.vocab_size:
        raise ValueError(f"the EAGLE-3 head's config.json has vocab_size {c.vocab_size}, the "
                         f"target's vocabulary has {target.vocab_size} tokens: a head for another target")
    if c.target_hidden_size != width:
        raise ValueError(f"the EAGLE-3 head reads target states {c.target_hidden_size} wide "
                         f"(config.json target_hidden_size / hidden_size), the target's are {width}")
    if head.embed_tokens is None and c.hidden_size != width:
        raise ValueError(f"the EAGLE-3 head is {c.hidden_size} wide and ships no embed_tokens, "
                         f"so it cannot share the target's ({width} wide)")
    return int(target.model.config.get_text_config().num_hidden_layers)


@register("eagle3")
class Eagle3Drafter(HiddenDrafter):
    tasks = ("caption", "video")
    uses_draft = False
    help = "a published EAGLE-3 head (SpecForge/vLLM/SGLang layout)"
    searched_first = ()
    search_rank = 0       # probed first where one is shipped (the fastest on captions; on
                          # questions the caption-trained tinyworld head is not: calibrate
                          # ranks candidates by what it measures, docs/methods.md)
    head_kind = "EAGLE-3 head"

    def __init__(self, target, head, sampling: SamplingParams, eos_ids=(),
                 tree: TreeSettings | None = None) -> None:
        layers = check_target(head, target)
        self.target = target
        self.head = head
        self.sampling = sampling
        # hidden_states indices (low, mid, high) the target's forwards hand over, concatenated
        self.hidden_layer = target_layers(head.config, layers)
        self.embed = head.embed_tokens or target.model.get_input_embeddings()
        self.lm_head = None
        self.vocab = target.vocab_size
        self.eos_ids = set(eos_ids)
        self.tree = tree
        self.shape = FixedShape(tree.depth, tree.top_k) if tree else None
        self._fast = None

    # -- from a profile --------------------------------------------------------------
    @classmethod
    def check(cls, profile) -> None:
        if not profile.eagle3.model:
            raise ValueError("method 'eagle3' needs a head: set eagle3.model to an EAGLE-3 head "
                             "directory or hub id")

    @classmethod
    def from_profile(cls, profile, target, sampling, trace=None) -> "Eagle3Drafter":
        head = load_eagle3_head(profile.eagle3.model, target)
        return cls(target, head, sampling, eos_ids=eos_token_ids(target),
                   tree=cls.tree_settings(profile))

    @classmethod
    def beside(cls, profile, shipped: tuple[str, ...] = ()) -> dict:
        """The EAGLE-3 head shipped for this target (companions.py SHIPPED_COMPANIONS), as
        a chain: not the hidden head's settings it would inherit."""
        return {"eagle3.model": shipped[0], "eagle3.tree": False} if shipped else {}

    @classmethod
    def settings(cls, profile):
        return profile.eagle3    # the shape answers (γ, label, compile plan, …) read it

    @classmethod
    def record_fields(cls, profile, task: str) -> dict:
        return super().record_fields(profile, task) | {"eagle3": vars(profile.eagle3).copy()}

    @classmethod
    def untrained_hint(cls, profile) -> str:
        return ("train one for it (python -m vlmspec_cli.zoo.hidden --arch eagle3 --target "
                f"{profile.target.model} SAMPLES --out HEAD) and set eagle3.model to HEAD")

    # -- head forwards ----------------------------------------------------------------
    @torch.inference_mode()
    def _run(self, st: Eagle3State, tokens, hidden: torch.Tensor, step: int,
             positions: torch.Tensor | None = None, mask: torch.Tensor | None = None) -> torch.Tensor:
        """Feed pairs (tokens[i], hidden[i]) (hidden: fc(g) or the head's own outputs); the
        head's outputs h' (n, H). ``positions``: (1, n) cache indices (default: the next
        ones), or the prompt's (3, n) M-RoPE positions as they are."""
        dev = self.head.device
        ids = torch.as_tensor(tokens, device=dev).reshape(1, -1)
        if positions is None:
            start = st.cache.get_seq_length()
            positions = torch.arange(start, start + ids.shape[1])[None]
        positions = positions.to(dev)
        if positions.shape[0] != 3:
            positions = positions.reshape(1, -1).expand(3, -1) + st.delta
        out = self.head(self.embed(ids), hidden[None].to(dev), positions, st.cache, mask)
        return out[0]

    def _target_rows(self, hidden: torch.Tensor) -> torch.Tensor:
        with torch.inference_mode():
            return self.head.project(hidden.to(self.head.device))

    def _logits(self, h: torch.Tensor) -> torch.Tensor:
        with torch.inference_mode():
            return draft_vocab_logits(self.head.logits(h).float(), self.head.target_ids, self.vocab)

    # -- protocol -----------------------------------------------------------------------
    def prefill(self, state: DecodeState) -> None:
        f = state.features
        if f is None or f.ids is None:
            raise RuntimeError("eagle3 drafter: the engine gave no prefill hidden states")
        mrope = self.head.config.mrope_section is not None
        delta = int(state.target_cache.rope_delta) if mrope else 0
        st = Eagle3State(self.head.new_cache(), prompt_len=len(f.ids),
                         first_logits=state.target_next_logits, delta=delta)
        rows = self._target_rows(f.rows())   # the prompt's, then any plain rounds'
        n = len(f.ids) - 1
        if n > 0:   # every prompt position t < L - 1 pairs with x_{t+1}, visual ones too
            pos = f.positions[:, :n] if mrope and f.positions is not None else None
            self._run(st, f.ids[1:], rows[:n], step=0, positions=pos)
            st.committed = n
        # the last prompt position pairs with the first generated token, known only in a
        # late prefill: it and the plain rounds' rows are read at the next proposal
        st.rows, st.row_start = rows[n:], n
        state.drafter_state = st
