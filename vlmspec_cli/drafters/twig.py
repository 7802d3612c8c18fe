"""``twig``: self-speculation on the target's own first K layers (TwigVLM, Alg. 1).

The draft is layers[:K] of the target + a small *twig* (T decoder layers, trained on top
of X^(K) with the LM loss, its own norm and head) — or, with ``twig.model: none``, plain
layer-skip: layers[:K] + the target's own norm and head (training-free).

Sharing (trunk.py): every token runs through layers[:K] once. While drafting, the pending
token and x_1..x_{n-1} go through layers[:K] (into the target's cache) and the twig; at
verification only x_n still needs layers[:K], then layers[K:] run on the stored X^(K) of
pending, x_1..x_n. After verification the engine crops every target layer back to the
accepted prefix; the twig's own cache is cropped to match, and an accepted x_n that the
twig never read is fed to it (from its stored X^(K)) with the next token. On the fast path
the trunk's and the rest's layers write static buffers (trunk.py ``SegmentedCache``) and so
do the twig's own layers, after the prompt (``FastDecoder`` over the twig's stack).

Drafting stops after δ = drafting.gamma tokens, or early (θ = twig.threshold) after a
token whose draft probability is below θ. The stop depends only on the draft, so
verification stays exact: without pruning the output is the target's, token for token
at T = 0 and in distribution at T > 0.

Twig-guided pruning (TTP, opt-in, lossy): at prefill the last twig layer's attention
from text rows to visual rows picks the R visual tokens that layers[P:] keep (P >= K);
layers[K_f:] keep none (FinalWipe). The target being verified against is then the
pruned one, so records say ``lossless: false``.

Batches (generation.batch_size > 1, without pruning): each row is prefilled alone as
above and joins the batch's ragged target cache (ragged.py) with all its layers; the row
keeps its own copy of layers[:K]'s cache (its trunk, ``TwigState.trunk``) and its twig
cache, and drafts row by row from them exactly as the request alone does; the batch's
one target forward verifies every row over all the target's layers. So in a batch the
draft tokens run layers[:K] twice (drafting, in the row's trunk; verifying, in the
batch's cache) and each row holds layers[:K]'s keys twice: the trunk is no longer shared
with verification. After the verdict the row's trunk keeps the committed tokens (the
last accepted one, which drafting never lowered, is lowered then) and the twig reads what
it has not (``unread``), as alone. Pruning gives each layer its own rows, which the
batch's one cache cannot hold: pruned twigs decode one request at a time.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

import torch

from vlmspec_cli.drafters.base import DraftingMethod, gamma_text, register
from vlmspec_cli.runtime.adapters.base import TextStack
from vlmspec_cli.runtime.round.draft import Draft, Verdict
from vlmspec_cli.runtime.fast.fast_decoder import FastDecoder, follow_target
from vlmspec_cli.runtime.models.loading import load_twig
from vlmspec_cli.runtime.request import DecodeState
from vlmspec_cli.runtime.static_cache import StaticKVCache
from vlmspec_cli.runtime.fast.trunk import (SegmentedCache, SplitTarget, crop_layers,
                                            mean_retained_tokens, run_layers)
from vlmspec_cli.runtime.round.verify import SamplingParams, probabilities


PRUNED_ALONE = ("a pruned twig (prune.keep / prune.final_wipe) decodes one request at a time: "
                "its layers hold different rows, which a batch's one cache cannot")


@dataclass
class PrunePlan:
    keep: int | None = None          # R: visual tokens kept from layer `layer` on
    layer: int | None = None         # P (0-based index of the first pruned layer; default K)
    final_wipe: int | None = None    # K_f: layers from here on see no visual tokens

    @property
    def active(self) -> bool:
        return self.keep is not None or self.final_wipe is not None


@dataclass
class TwigState:
    twig_cache: Any                              # the twig layers' own cache (None: layer-skip)
    next_logits: torch.Tensor | None = None      # draft logits for the first proposal
    lowered: list[int] | None = None             # tokens through layers[:K] since verification
    lowered_states: torch.Tensor | None = None   # their X^(K), (1, n, H)
    verified_states: torch.Tensor | None = None  # X^(K) of the last verified feed
    verified_start: int = 0                      # position of its first row
    unread: torch.Tensor | None = None           # committed X^(K) the twig has not read yet
    pruning: dict | None = None                  # what pruning kept (for the record)
    rope_delta: int | None = None                # 3-D rope: the prompt's delta (trunk.PromptRun)
    trunk: Any = None                            # a batch's row: its own layers[:K] cache
    prompt_len: int = 0                          # a batch's row: its prompt's positions


def select_visual_rows(attention: torch.Tensor, visual: torch.Tensor, keep: int) -> torch.Tensor:
    """TwigVLM Eq. 3/5: rank visual tokens by the attention the text rows pay them,
    sum_i A[i, v] over text rows i (and heads), keep the top ``keep``.
    ``attention``: (1, heads, S, S) of the last twig layer; ``visual``: bool (S,).
    Returns a bool (S,) mask of the rows that go on: all text rows + the kept visual ones."""
    text = ~visual
    after = torch.arange(visual.shape[0], device=visual.device) > int(visual.nonzero()[0])
    # the text rows after the first image (the instruction); earlier rows cannot see images
    score = attention[0].float().sum(0)[text & after][:, visual].sum(0)      # (M,)
    kept = visual.clone()
    if keep < int(visual.sum()):
        order = score.argsort(descending=True)
        chosen = torch.zeros_like(score, dtype=torch.bool)
        chosen[order[:keep]] = True
        kept[visual] = chosen
    return text | kept


@register("twig")
class TwigDrafter(DraftingMethod):
    runs_target = True     # the engine lets this drafter run the target's forwards
    prunes = True
    batches = True         # without pruning (each row drafts from its own trunk copy)
    uses_draft = False
    help = "self-speculation on the target's first layers"

    def __init__(self, target, sampling: SamplingParams, layers: int, twig=None,
                 threshold: float = 0.0, prune: PrunePlan | None = None) -> None:
        self.target = target
        self.sampling = sampling
        self.split = SplitTarget(target, layers)
        self.twig = twig                       # a *ForCausalLM with T layers, or None
        self.threshold = float(threshold)
        self.prune = dataclasses.replace(prune) if prune is not None and prune.active else None
        if twig is not None:
            hidden = self.split.stack.config.hidden_size
            if twig.config.hidden_size != hidden:
                raise ValueError(f"twig hidden size {twig.config.hidden_size} does not match the "
                                 f"target's {hidden}")
            trained_on = getattr(twig.config, "twig_from_layer", None)
            if trained_on is not None and int(trained_on) != layers:
                raise ValueError(f"the twig was trained on layer {trained_on} of its target, but "
                                 f"twig.layers is {layers}; set twig.layers: {trained_on}")
        if self.prune is not None:
            self._check_prune(self.prune)
        self.lossless = self.prune is None
        self._twig_fast: FastDecoder | None = None   # the twig's fast path, made on first use

    # -- from a profile --------------------------------------------------------------
    @classmethod
    def check(cls, profile) -> None:
        if _no_twig(profile.twig.model) and profile.twig.layers is None:
            raise ValueError("twig.model: none (layer-skip) needs twig.layers: K, the number "
                             "of target layers the draft runs")
        if _no_twig(profile.twig.model) and profile.prune.active:
            raise ValueError("prune needs a twig (its attention ranks the visual tokens); "
                             "set twig.model")
        if profile.prune.active and profile.generation.rows > 1:
            raise ValueError(PRUNED_ALONE + " (use --batch-size 1, or remove prune.keep / "
                             "prune.final_wipe)")

    @classmethod
    def models(cls, profile) -> list[tuple[str, str | None]]:
        return [] if _no_twig(profile.twig.model) else [("twig", profile.twig.model)]

    @classmethod
    def from_profile(cls, profile, target, sampling, trace=None) -> "TwigDrafter":
        """The twig (if any) loads next to the target, on its device and dtype."""
        twig = None if _no_twig(profile.twig.model) else load_twig(profile.twig.model, target)
        layers = profile.twig.layers
        if layers is None:
            layers = getattr(twig.config, "twig_from_layer", None)
            if layers is None:
                raise ValueError(f"twig '{profile.twig.model}' does not say which target layer "
                                 "it grows from (config twig_from_layer); set twig.layers: K")
        p = profile.prune
        plan = PrunePlan(keep=p.keep, layer=p.layer, final_wipe=p.final_wipe)
        return cls(target, sampling, int(layers), twig=twig, threshold=profile.twig.threshold,
                   prune=plan)

    @classmethod
    def beside(cls, profile, shipped: tuple[str, ...] = ()) -> dict:
        """The twig shipped for this target, on the layer it grows from."""
        return {"twig.model": shipped[0], "twig.layers": None} if shipped else {}

    @classmethod
    def untrained_hint(cls, profile) -> str:
        return ("draft with the target's own first layers and head instead (layer-skip, no "
                "training): --set twig.model=none --set twig.layers=K")

    @classmethod
    def drafting_inputs(cls, profile) -> list[str]:
        return []   # it drafts from the target's own layer-K states

    @classmethod
    def own_probe(cls, profile) -> tuple[bool, int, tuple[int, int, int] | None]:
        return True, 0, None

    @classmethod
    def describe(cls, profile) -> str:
        twig = profile.twig
        delta = gamma_text(cls, profile).replace("γ", "δ")
        text = f", twig {twig.model} on layers[:{twig.layers or 'K'}] {delta} θ={twig.threshold}"
        if profile.prune.active:
            text += (f", pruning keep={profile.prune.keep} layer={profile.prune.layer} "
                     f"final_wipe={profile.prune.final_wipe} (lossy)")
        return text

    def position_readers(self, profile) -> list[tuple[str, object]]:
        """The twig continues the target's own first layers, at the target's positions."""
        return [("twig", self.twig)] if self.twig is not None else []

    def _check_prune(self, plan: PrunePlan) -> None:
        k, n = self.split.k, self.split.num_layers
        if self.twig is None:
            raise ValueError("prune needs a twig (its last layer's attention ranks the visual "
                             "tokens); set twig.model")
        if plan.layer is None:
            plan.layer = k
        if not k <= plan.layer < n:
            raise ValueError(f"prune.layer must be in [{k}, {n - 1}] (pruning needs the twig's "
                             f"attention, computed on layer K={k}), got {plan.layer}")
        if plan.keep is not None and plan.keep < 0:
            raise ValueError(f"prune.keep must be >= 0, got {plan.keep}")
        if plan.final_wipe is not None and not plan.layer <= plan.final_wipe <= n:
            raise ValueError(f"prune.final_wipe must be in [{plan.layer}, {n}], got {plan.final_wipe}")
        # the twig must return its attention map: eager attention (twig layers only)
        self.twig.set_attn_implementation("eager")

    # -- target forwards (called by the engine) --------------------------------------
    def prefill(self, state: DecodeState) -> None:
        """Prompt → layers[:K] → (twig, for the first draft) and → layers[K:] (pruned as
        planned) for the target's first-token logits."""
        lm, split = self.target, self.split
        run = split.prompt(state.prompt, state.request.images, state.request.videos)
        positions, visual = run.positions, run.visual
        # the prompt goes through the layers in parts (pruning between them), over a
        # transformers cache; static_cache below moves it to the fast path's buffers
        state.target_cache = lm.adapter.new_cache(lm, static=False)
        hidden_k = split.lower(run.embeds, positions, state.target_cache, run.add_after)
        st = TwigState(twig_cache=None, rope_delta=run.rope_delta)
        attention = None
        if self.twig is not None:
            from transformers import DynamicCache   # (not at import: see adapters/base.py)

            st.twig_cache = DynamicCache(config=self.twig.config)
            logits, attention = self._twig_forward(st, hidden_k, positions,
                                                   want_attention=self.prune is not None)
            st.next_logits = logits[0, -1]
        else:
            st.next_logits = split.head(hidden_k[:, -1:])[0, -1]
        keep_from, st.pruning = self._prune_rows(attention, visual)
        state.target_next_logits = split.upper(hidden_k, positions, state.target_cache,
                                               keep_from, run.add_after)[0, -1]
        # on the fast path every later forward writes into static buffers (trunk.py)
        state.target_cache = split.static_cache(state.target_cache, keep_from)
        # (a batch's row keeps its prompt's rope offset: ragged.py reads it off the cache)
        state.target_cache.rope_delta = run.rope_delta or 0
        fast = None
        if st.twig_cache is not None:   # the twig's own layers follow the target onto the fast path
            fast = self._twig_fast = follow_target(self.target, self._twig_fast,
                                                   self._twig_stack, self.twig.config,
                                                   self.twig.dtype)
        if fast is not None:
            static = fast.new_cache()
            static.load(st.twig_cache)
            st.twig_cache = static
        state.drafter_state = st

    def extend_target(self, state: DecodeState, ids: torch.Tensor) -> torch.Tensor:
        """Target logits (1, n, V) for the fed tokens (pending + proposals), reusing the
        X^(K) the drafting already computed and running layers[:K] only on the rest."""
        st: TwigState = state.drafter_state
        split, cache = self.split, state.target_cache
        feed = ids[0].tolist()
        have = st.lowered or []
        if have[: len(feed)] != feed[: len(have)]:
            raise RuntimeError("twig: verification feed does not continue the drafted tokens")
        if len(have) > len(feed):  # the engine cut the draft (EOS): forget the extra rows
            extra = len(have) - len(feed)
            crop_layers(cache, split.lower_layers, extra)
            st.lowered_states = st.lowered_states[:, : len(feed)]
            have = have[: len(feed)]
        if len(feed) > len(have):
            self._lower(st, state, feed[len(have):])
        states = st.lowered_states
        start = int(cache.get_seq_length(0)) - len(feed)
        positions = split.positions(start, len(feed), st.rope_delta)
        st.verified_states, st.verified_start = states, start
        st.lowered, st.lowered_states = None, None
        return split.upper(states, positions, cache)

    # -- drafting ---------------------------------------------------------------------
    def propose(self, state: DecodeState, max_tokens: int) -> Draft:
        st: TwigState = state.drafter_state
        feed = list(state.target_pending)
        logits = st.next_logits
        st.next_logits = None
        tokens: list[int] = []
        qs: list[torch.Tensor] = []
        greedy = self.sampling.greedy
        early_exit = self.threshold > 0
        while len(tokens) < max_tokens:
            if feed:
                logits = self._draft_step(st, state, feed)
            # greedy without early exit needs no distribution, only the argmax
            q = None if greedy and not early_exit else probabilities(logits, self.sampling.scoring)
            if greedy:
                tok = int(logits.argmax())
            else:
                tok = int(torch.multinomial(q.cpu(), 1, generator=state.draft_generator))
                qs.append(q)
            tokens.append(tok)
            # early exit: stop after a token the draft itself is unsure of (top prob < θ)
            if early_exit and float(q.max()) < self.threshold:
                break
            feed = [tok]
        return Draft(tokens, torch.stack(qs) if qs else None)

    def _draft_step(self, st: TwigState, state: DecodeState, feed: list[int]) -> torch.Tensor:
        """Run ``feed`` through the shared layers[:K] (kept for verification) and the twig;
        the draft's logits (V,) for the token after it."""
        split = self.split
        h = self._lower(st, state, feed)
        if self.twig is None:
            return split.head(h[:, -1:])[0, -1]
        if st.unread is not None:  # committed tokens the twig has not read: feed them first
            h = torch.cat([st.unread, h], 1)
            st.unread = None
        # the twig's cache holds every token it read, so its length is the next position
        positions = split.positions(int(st.twig_cache.get_seq_length(0)), h.shape[1],
                                    st.rope_delta)
        logits, _ = self._twig_forward(st, h, positions)
        return logits[0, -1]

    def _lower(self, st: TwigState, state: DecodeState, tokens: list[int]) -> torch.Tensor:
        """X^(K) of new tokens: the shared layers[:K] (writing the target's cache; a
        batch's row: its own trunk), kept until verification runs layers[K:] on them."""
        split = self.split
        cache = state.target_cache if st.trunk is None else st.trunk
        # layer 0 is never pruned: its cache length is the number of tokens before them
        positions = split.positions(int(cache.get_seq_length(0)), len(tokens), st.rope_delta)
        h = split.lower(split.embed_tokens(tokens), positions, cache)
        st.lowered = (st.lowered or []) + tokens
        st.lowered_states = h if st.lowered_states is None else torch.cat([st.lowered_states, h], 1)
        return h

    def _twig_stack(self) -> TextStack:
        """The twig's layers, norm and head, over the target's rotary embedding."""
        twig = self.twig
        return TextStack(None, twig.model.layers, twig.model.norm, self.split.stack.rotary,
                         twig.lm_head, twig.config)

    @torch.inference_mode()
    def _twig_forward(self, st: TwigState, hidden_k: torch.Tensor, positions: torch.Tensor,
                      want_attention: bool = False):
        twig = self.twig
        if isinstance(st.twig_cache, StaticKVCache):
            out, _ = self._twig_fast.run(hidden_k, st.twig_cache, position_ids=positions)
            return twig.lm_head(out), None
        captured = {}
        hook = None
        if want_attention:
            def grab(_module, _args, output):
                captured["attention"] = output[1]
            hook = twig.model.layers[-1].self_attn.register_forward_hook(grab)
        try:
            hidden = run_layers(twig.model.layers, self.split.stack.rotary, hidden_k, positions,
                                st.twig_cache)
        finally:
            if hook is not None:
                hook.remove()
        return twig.lm_head(twig.model.norm(hidden)), captured.get("attention")

    def accept(self, state: DecodeState, verdict: Verdict) -> None:
        st: TwigState = state.drafter_state
        if st.trunk is not None:
            self._accept_row(st, state)
            return
        if self.twig is None or st.verified_states is None:
            return
        # the engine has cropped the target cache to the accepted prefix; the twig must
        # hold the same tokens: crop what it read beyond, queue what it has not read
        committed = int(state.target_cache.get_seq_length(0))
        have = int(st.twig_cache.get_seq_length(0))
        if have > committed:
            st.twig_cache.crop(-(have - committed))
            st.unread = None
        elif have < committed:
            # verified rows still committed: positions verified_start .. committed - 1
            rows = st.verified_states[:, : committed - st.verified_start]
            pool = rows if st.unread is None else torch.cat([st.unread, rows], 1)
            st.unread = pool[:, pool.shape[1] - (committed - have):]
        st.verified_states = None

    def finish(self, state: DecodeState) -> None:
        st = state.drafter_state
        if isinstance(st, TwigState) and st.pruning is not None:
            state.stats.pruning = st.pruning
        if isinstance(st, TwigState) and st.trunk is not None:   # a batch's row: its buffers
            for cache in (st.trunk, st.twig_cache):
                if isinstance(cache, (StaticKVCache, SegmentedCache)):
                    cache.recycle()

    # -- the rows of a batch ------------------------------------------------------------
    def check_batch(self) -> None:
        if self.prune is not None:
            raise ValueError(PRUNED_ALONE)

    def admit(self, state: DecodeState) -> None:
        """A row of a batch: prefilled alone with the target (``prefill``), whose cache the
        batch's now holds; the row keeps that cache's layers[:K] as its own trunk."""
        st: TwigState = state.drafter_state
        trunk, k = state.target_cache, self.split.k
        if isinstance(trunk, SegmentedCache):
            trunk.keep_below(k)
        else:   # a transformers cache (fast path off): a fresh one, of layers[:K] only
            lm, full = self.target, trunk
            trunk = lm.adapter.new_cache(lm, static=False)
            for i in range(k):
                trunk.update(full.layers[i].keys, full.layers[i].values, i)
        st.trunk, st.prompt_len = trunk, int(trunk.get_seq_length(0))

    def _accept_row(self, st: TwigState, state: DecodeState) -> None:
        """A batch's row after its verdict (the batch's cache rolled back apart): its trunk
        keeps the prompt and the committed tokens but ``pending`` (cut back, or the last
        accepted token, never drafted from, lowered now), and the twig's cache the same,
        as ``accept`` does alone."""
        split, trunk = self.split, st.trunk
        committed = st.prompt_len + len(state.tokens) - 1
        have = int(trunk.get_seq_length(0))
        start = have - len(st.lowered or [])            # position of this round's first fed
        states = [] if st.lowered_states is None else [st.lowered_states]
        if have > committed:
            crop_layers(trunk, split.lower_layers, have - committed)
        elif have < committed:
            missing = state.tokens[have - st.prompt_len: committed - st.prompt_len]
            positions = split.positions(have, len(missing), st.rope_delta)
            states.append(split.lower(split.embed_tokens(missing), positions, trunk))
        st.lowered, st.lowered_states = None, None
        if self.twig is None:
            return
        read = int(st.twig_cache.get_seq_length(0))
        if read > committed:
            st.twig_cache.crop(-(read - committed))
            st.unread = None
        elif read < committed:
            rows = torch.cat(states, 1)[:, : committed - start]
            pool = rows if st.unread is None else torch.cat([st.unread, rows], 1)
            st.unread = pool[:, pool.shape[1] - (committed - read):]

    # -- pruning ------------------------------------------------------------------------
    def _prune_rows(self, attention, visual: torch.Tensor):
        """Rows each pruned layer keeps ({layer index: bool mask over the prompt}) and the
        report for the record (Eq. 6's R̄ included)."""
        plan = self.prune
        if plan is None:
            return None, None
        n_layers = self.split.num_layers
        m = int(visual.sum())
        keep_from: dict[int, torch.Tensor] = {}
        kept = m
        if plan.keep is not None and m:
            keep_from[plan.layer] = select_visual_rows(attention, visual, plan.keep)
            kept = min(plan.keep, m)
        wipe = plan.final_wipe if plan.final_wipe is not None else n_layers
        if wipe < n_layers and m:
            keep_from[wipe] = ~visual
        report = {"visual_tokens": m, "kept": kept, "layer": plan.layer, "final_wipe": wipe,
                  "num_layers": n_layers,
                  "mean_retained": round(mean_retained_tokens(m, kept, plan.layer, wipe, n_layers), 3)}
        return keep_from or None, report



def _no_twig(model: str | None) -> bool:
    return model is None or str(model).lower() == "none"
