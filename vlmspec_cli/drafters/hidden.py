"""``hidden``: a draft head on the target's text-position hidden states (HiViS / Sparrow).

The head (runtime/models/hidden_head.py) reads pairs (e(x_{t+1}), h_t) of a token and the
target's hidden state one position before it, and only at text positions: its KV cache
never holds a visual position, so a draft step costs the same whatever the video length.

Bookkeeping, in target positions. After every verification the target has computed h_t
for every position in its cache; the token after the last cached position is the
pending token, so every cached position's pair is known. ``rows`` holds the target's
states not yet read by the head (from position ``row_start``). A round:

1. ``propose`` feeds those pairs (step 0, the target's own states) into the head's cache
   (``committed`` entries); the head's output on the last one, h', gives q(x_1);
2. each further proposal x_j is fed as (e(x_j), h') with h' the head's previous output
   (self-feedback, step j), as a chain, or as a tree (EAGLE-2 expansion, a node's pair is
   its token and its parent's output, 4-D mask over the node's ancestors);
3. ``accept`` cuts the head's cache back to ``committed`` (speculative entries go) and
   queues the target's states of the rows verification kept (``state.features``), as they
   came (``queued``): they are read as the head reads them (an EAGLE-3 head projects
   them) at the next ``propose``, all at once. While drafting is off (auto length), rounds
   only queue: a useless EAGLE-3 head projected every plain round's state and grew
   ``rows`` by one copy a round, 4-5% of a tiny target's plain rounds (profiled by hand,
   bench/useless_drafts.py's qwen25-vl-7b-eagle3 row).

The very first token has no head state yet: the target's own prefill distribution p is
used as q (x_1 ~ p, accepted with probability min(1, p/q) = 1), as EAGLE does.

Batches (generation.batch_size > 1, chains and trees): each row's ``HiddenState`` is its
own (its head cache, the target states it has not read), and the engine's one forward over
the batch's ragged target cache (a tree row's nodes after its own prefix, its own mask)
hands each row its states (``state.features``, a tree row's cut to its accepted path), so
a row proposes and accepts exactly as the request would alone. The head drafts row by row
(its forwards are small; the target's one forward for every row is what batching saves).

Drafts are verified by the target as usual, so the method is lossless.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from vlmspec_cli.drafters.base import DraftingMethod, gamma_text, register
from vlmspec_cli.runtime.round.draft import Draft, Verdict
from vlmspec_cli.runtime.round.engine import eos_token_ids
from vlmspec_cli.runtime.fast.fast_decoder import FastDecoder, follow_target
from vlmspec_cli.runtime.models.loading import load_hidden_head
from vlmspec_cli.runtime.request import DecodeState
from vlmspec_cli.runtime.static_cache import StaticKVCache
from vlmspec_cli.runtime.round.tree import DraftTree, attention_for
from vlmspec_cli.runtime.round.tree_growth import FrontierFeed, expand_tree
from vlmspec_cli.runtime.round.tree_shape import FixedShape, RoundLog, TreeRound
from vlmspec_cli.runtime.round.verify import SamplingParams, probabilities


@dataclass
class HiddenState:
    cache: Any                                 # the head's KV cache: text positions only
    committed: int = 0                         # entries read from the target's own states
    rows: torch.Tensor | None = None           # target states not yet read, (n, H)
    row_start: int = 0                         # target position of rows[0]
    queued: list = field(default_factory=list)   # after rows: as the target gave them
    queued_rows: int = 0
    prompt_len: int = 0
    first_logits: torch.Tensor | None = None   # the target's p(x_1), first round only
    tree: DraftTree | None = None
    shape: tuple[int, int] = (0, 0)
    log: RoundLog = field(default_factory=RoundLog)
    feed: FrontierFeed = field(default_factory=FrontierFeed)   # a tree round's fed nodes


@dataclass
class TreeSettings:
    depth: int = 5
    top_k: int = 4
    total_tokens: int = 20
    static: bool = False


@register("hidden")
class HiddenDrafter(DraftingMethod):
    tasks = ("caption", "video")
    uses_draft = False
    batches = True       # chains and EAGLE-2 trees (the head drafts row by row)
    # with auto length, prefilled at a request's first drafted round (if any) from the
    # prompt's states and the plain rounds' kept until then (TargetFeatures.later): a
    # useless EAGLE-3 head ran its prefill over every prompt position of every request
    late_prefill = True
    help = "HiViS/Sparrow head on the target's text hidden states"
    searched_first = ("video",)
    search_rank = 1       # a head trained on the target's own states

    def __init__(self, target, head, sampling: SamplingParams, eos_ids=(),
                 tree: TreeSettings | None = None) -> None:
        vocab = int(getattr(head.config, "vocab_size", 0) or 0)
        if vocab and vocab != target.vocab_size:
            raise ValueError(f"the hidden head was trained for a vocabulary of {vocab} tokens, "
                             f"the target has {target.vocab_size}: train a head for this target")
        if head.config.hidden_size != target.model.get_input_embeddings().weight.shape[1]:
            raise ValueError(f"hidden head width {head.config.hidden_size} does not match the "
                             f"target's hidden size")
        self.target = target
        self.head = head
        self.sampling = sampling
        self.hidden_layer = int(head.config.target_layer)
        self.embed = target.model.get_input_embeddings()
        self.lm_head = target.model.get_output_embeddings()
        self.eos_ids = set(eos_ids)
        self.tree = tree
        self.shape = FixedShape(tree.depth, tree.top_k) if tree else None
        self._fast: FastDecoder | None = None   # the head's fast path, made on first use

    # -- from a profile --------------------------------------------------------------
    @classmethod
    def check(cls, profile) -> None:
        if not profile.hidden.model:
            raise ValueError("method 'hidden' needs a trained head: set hidden.model")

    @classmethod
    def models(cls, profile) -> list[tuple[str, str | None]]:
        return [(cls.name, cls.settings(profile).model)]

    @classmethod
    def tree_settings(cls, profile) -> TreeSettings | None:
        """The tree: section as this head drafts it, or None when it drafts chains."""
        t = profile.tree
        return (TreeSettings(t.depth, t.top_k, t.total_tokens, static=t.policy == "static")
                if cls.settings(profile).tree else None)

    @classmethod
    def from_profile(cls, profile, target, sampling, trace=None) -> "HiddenDrafter":
        """HiViS / Sparrow: the head loads next to the target, on its device and dtype."""
        head = load_hidden_head(profile.hidden.model, target)
        trained = int(head.config.target_layer)
        layer = profile.hidden.layer
        if layer is not None and int(layer) != trained:
            raise ValueError(f"hidden head '{profile.hidden.model}' was trained on target layer "
                             f"{trained} (hidden_states[{trained}]), but hidden.layer is {layer}; "
                             f"set hidden.layer: {trained} or train a head for layer {layer}")
        return cls(target, head, sampling, eos_ids=eos_token_ids(target),
                   tree=cls.tree_settings(profile))

    @classmethod
    def beside(cls, profile, shipped: tuple[str, ...] = ()) -> dict:
        """The head shipped for this target (the profile's own hidden.model is for another
        one, or for none), at the layer it was trained on."""
        return {"hidden.model": shipped[0], "hidden.layer": None} if shipped else {}

    @classmethod
    def untrained_hint(cls, profile) -> str:
        return ("train one for it (python -m vlmspec_cli.zoo.hidden --target "
                f"{profile.target.model} SAMPLES --out HEAD) and set hidden.model to HEAD")

    head_kind = "hidden-state head"    # what describe() calls the head

    @classmethod
    def settings(cls, profile):
        """The profile section of this kind of head (hidden:; eagle3.py: eagle3:). The shape
        answers below (γ, label, compile plan, probe, line) read it, so a head kind that
        subclasses this one declares only its section."""
        return profile.hidden

    @classmethod
    def gamma(cls, profile) -> int:
        return profile.tree.depth if cls.settings(profile).tree else profile.drafting.gamma

    @classmethod
    def round_width(cls, profile) -> int:
        if not cls.settings(profile).tree:
            return super().round_width(profile)
        return profile.tree.total_tokens + 1   # the pending token and the tree's nodes

    @classmethod
    def draft_length(cls, profile) -> str:
        return "fixed" if cls.settings(profile).tree else super().draft_length(profile)

    @classmethod
    def label(cls, profile) -> str:
        if not cls.settings(profile).tree:
            return super().label(profile)
        t = profile.tree
        return f"{cls.name} tree (depth={t.depth}, top_k={t.top_k}, total_tokens={t.total_tokens})"

    @classmethod
    def drafting_inputs(cls, profile) -> list[str]:
        return []   # it reads the target's hidden states, not the request

    @classmethod
    def compile_plan(cls, profile) -> list[tuple[str, int, str, int | None]]:
        if not cls.settings(profile).tree:
            return [("target", cls.round_width(profile), "causal", None)]
        return [("target", 1, "causal", None), ("target", cls.round_width(profile), "tree", None)]

    @classmethod
    def own_probe(cls, profile) -> tuple[bool, int, tuple[int, int, int] | None]:
        t = profile.tree
        tree = cls.settings(profile).tree
        return (False, 0, (t.depth, t.top_k, t.total_tokens)) if tree else (True, 0, None)

    @classmethod
    def describe(cls, profile) -> str:
        h = cls.settings(profile)
        shape = (f"tree depth={profile.tree.depth} top_k={profile.tree.top_k}" if h.tree
                 else gamma_text(cls, profile))
        return f", {cls.head_kind} {h.model} {shape}"

    # -- head forwards ----------------------------------------------------------------
    @torch.inference_mode()
    def _run(self, st: HiddenState, tokens: list[int] | torch.Tensor, hidden: torch.Tensor,
             step: int, positions: torch.Tensor | None = None,
             mask: torch.Tensor | None = None) -> torch.Tensor:
        """Feed pairs (tokens[i], hidden[i]) to the head; its outputs h' (n, H).
        ``positions`` (1, n): default the next text positions after the head's cache."""
        dev = self.target.device
        ids = torch.as_tensor(tokens, device=dev).reshape(1, -1)
        if positions is None:
            start = int(st.cache.get_seq_length())
            positions = torch.arange(start, start + ids.shape[1])[None]
        pos = positions.to(dev)
        steps = torch.full_like(pos, step)
        if not isinstance(st.cache, StaticKVCache):
            out = self.head(self.embed(ids), hidden[None].to(dev), pos, st.cache,
                            attention_mask=mask, steps=steps)
        else:
            z = self.head.inputs(self.embed(ids), hidden[None].to(dev), steps)
            out, _ = self._fast.run(z, st.cache, attention_mask=mask, position_ids=pos)
        return out[0]

    def _target_rows(self, hidden: torch.Tensor) -> torch.Tensor:
        """The target's states as the head reads them (an EAGLE-3 head projects them)."""
        return hidden

    def _logits(self, h: torch.Tensor) -> torch.Tensor:
        # imported here: the head's module imports transformers' models, which profile
        # checks and --dry-run (they import every method) need not pay for
        from vlmspec_cli.runtime.models.hidden_head import head_logits

        with torch.inference_mode():
            return head_logits(self.head, self.lm_head, h).float()

    # -- protocol -----------------------------------------------------------------------
    def prefill(self, state: DecodeState) -> None:
        from vlmspec_cli.runtime.models.hidden_head import prompt_pairs   # as in _logits

        f = state.features
        if f is None or f.ids is None:
            raise RuntimeError("hidden drafter: the engine gave no prefill hidden states")
        # the head's layers follow the target onto the fast path
        fast = self._fast = follow_target(self.target, self._fast, self.head.decoder_stack,
                                          self.head.config.layer_config(), self.head.dtype)
        cache = self.head.new_cache() if fast is None else fast.new_cache()
        st = HiddenState(cache, prompt_len=len(f.ids), first_logits=state.target_next_logits)
        n = len(f.ids) - 1
        hidden = f.rows()    # the prompt's, then any plain rounds' (a late prefill)
        nxt, rows = prompt_pairs(f.ids, hidden[:n + 1], f.visual)
        if len(nxt):
            self._run(st, nxt, rows, step=0)
            st.committed = len(nxt)
        # the last prompt position pairs with the first generated token, known only in a
        # late prefill: it and the plain rounds' rows are read at the next proposal
        st.rows, st.row_start = hidden[n:], n
        state.drafter_state = st

    def _read_verified(self, st: HiddenState, state: DecodeState):
        """Feed the pairs whose next token is committed; returns (logits for the token after
        the pending one, the head state it came from, its step) — or, in the first round,
        the target's own p(x_1) and the target's last prompt state."""
        if st.queued:   # the states queued by ``accept`` as the head reads them, at once
            new = self._target_rows(torch.cat(st.queued))
            st.rows = new if st.rows is None else torch.cat([st.rows, new])
            st.queued, st.queued_rows = [], 0
        known = st.prompt_len + len(state.tokens) - 1 - st.row_start   # rows with a known next
        known = min(known, 0 if st.rows is None else st.rows.shape[0])
        if known > 0:
            first = st.row_start + 1 - st.prompt_len
            nxt = state.tokens[first: first + known]
            out = self._run(st, nxt, st.rows[:known], step=0)
            st.committed += known
            st.rows, st.row_start = st.rows[known:], st.row_start + known
            return self._logits(out[-1]), out[-1], 1
        if st.first_logits is None:
            raise RuntimeError("hidden drafter: nothing to draft from (no verified rows)")
        logits, st.first_logits = st.first_logits, None
        return logits.float(), st.rows[-1], 0

    def propose(self, state: DecodeState, max_tokens: int):
        st: HiddenState = state.drafter_state
        logits, h, step = self._read_verified(st, state)
        if self.tree is not None:
            return self._propose_tree(st, state, logits, h, step, max_tokens)
        tokens: list[int] = []
        qs: list[torch.Tensor] = []
        greedy = self.sampling.greedy
        while True:
            if greedy:
                tok = int(logits.argmax())
            else:
                q = probabilities(logits, self.sampling)
                tok = int(torch.multinomial(q.cpu(), 1, generator=state.draft_generator))
                qs.append(q)
            tokens.append(tok)
            if len(tokens) >= max_tokens or tok in self.eos_ids:
                break
            h = self._run(st, [tok], h[None], step=step)[-1]
            logits, step = self._logits(h), step + 1
        return Draft(tokens, torch.stack(qs) if qs else None)

    def _propose_tree(self, st: HiddenState, state: DecodeState, root_logits, root_h, step,
                      max_tokens: int) -> DraftTree:
        st.feed.start(int(st.cache.get_seq_length()))
        outputs: dict[int, torch.Tensor] = {-1: root_h}   # node -> its head state h'

        def expand(tree: DraftTree, nodes: list[int]) -> torch.Tensor:
            # node u's pair: its token and its parent's head state; it sees the committed
            # entries, its fed ancestors and itself, at position prefix + depth
            ids, pos, allowed = st.feed.feed(tree, nodes)
            parents = torch.stack([outputs[tree.parents[u]] for u in nodes])
            out = self._run(st, ids, parents, step=step + tree.depth[nodes[0]],
                            positions=pos, mask=attention_for(self.head, allowed, st.cache))
            outputs.update(zip(nodes, out))
            return self._logits(out)

        depth, top_k = self.shape.choose(st.log, len(state.tokens), None)
        depth = min(depth, max_tokens)
        st.shape = (depth, top_k)
        s = self.tree
        st.tree = expand_tree(root_logits, expand, depth, top_k, s.total_tokens, self.sampling,
                              state.draft_generator, self.eos_ids, static=s.static)
        return st.tree

    def accept(self, state: DecodeState, verdict: Verdict) -> None:
        st: HiddenState = state.drafter_state
        # speculative entries (the head's own states) go; the target's verified states of
        # the kept rows come in, to be read at the next proposal
        extra = int(st.cache.get_seq_length()) - st.committed
        if extra > 0:
            st.cache.crop(-extra)
        f = state.features
        end = st.row_start + (0 if st.rows is None else st.rows.shape[0]) + st.queued_rows
        if f is not None and f.ids is None and f.start == end:
            # the fed rows the target kept: all but a chain's rejected proposals (a tree's
            # were cut to its kept path in ``Verdict.roll_back``); a row of a batch has no
            # cache of its own to read this from. A copy: the forward's output may be a
            # buffer the next one writes
            kept = f.hidden[:f.hidden.shape[0] - verdict.rejected].clone()
            st.queued.append(kept)
            st.queued_rows += kept.shape[0]
        state.features = None
        if st.tree is not None:
            depth, top_k = st.shape
            n = len(verdict.accepted)
            st.log.add(TreeRound(len(state.tokens) - n - 1, depth, top_k, n))
            st.tree = None

    def finish(self, state: DecodeState) -> None:
        st = state.drafter_state
        if isinstance(st, HiddenState):
            # the head's cache: text positions only (Sparrow's VATA), for the record
            state.stats.draft_cache = {"entries": st.committed, "prompt_tokens": st.prompt_len}
            if self.tree is not None:
                summary = st.log.summary(len(state.tokens))
                del summary["accept_lengths"]
                state.stats.trees = {"policy": "static" if self.tree.static else "dynamic",
                                     **summary}

