"""``tree``: a separate draft model proposes a draft *tree* (EAGLE-2 dynamic expansion,
runtime/round/tree.py) instead of a chain; the target verifies every branch in one forward.

The draft reads the request through one drafting input (inputs.py: M, T, C or P) and keeps
its own KV cache: the prompt and the committed tokens it has read. Each expansion level
feeds the frontier nodes in one forward, at positions base + depth, with a 4-D mask that
lets a node see the cache, its ancestors and itself (runtime/round/tree_growth.py
``FrontierFeed``). After verification the cache keeps the prompt, the committed tokens
and the accepted path's nodes it fed (moved down after them), so the next round starts
from a plain prefix again.

In a batch (generation.batch_size > 1) each row keeps its own ``TreeState`` and the draft
grows the rows' trees one row at a time (``propose_rows``' default: the draft is the cheap
model); the target verifies every row's tree in the engine's one ragged forward.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

import torch

from vlmspec_cli.drafters.base import (DraftingMethod, draft_line, first_input, one_input, register,
                                      tree_section)
from vlmspec_cli.drafters.draft_model import draft_model_names, load_draft
from vlmspec_cli.drafters.inputs import check_inputs, prefill_input
from vlmspec_cli.drafting_inputs import DRAFTING_INPUTS
from vlmspec_cli.runtime.adapters.base import cache_length, keep_branch
from vlmspec_cli.runtime.round.engine import eos_token_ids
from vlmspec_cli.runtime.round.draft import DraftCursor, Verdict
from vlmspec_cli.runtime.request import DecodeState
from vlmspec_cli.runtime.round.tree import DraftTree, attention_for
from vlmspec_cli.runtime.round.tree_growth import FrontierFeed, expand_tree, tree_nodes
from vlmspec_cli.runtime.round.tree_shape import AdjacencyAdaptive, AdtBounds, FixedShape, RoundLog, TreeRound
from vlmspec_cli.runtime.round.verify import SamplingParams

TREE_POLICIES = ("dynamic", "static")


@dataclass
class TreeState:
    cache: Any
    cursor: DraftCursor = field(default_factory=DraftCursor)   # committed tokens it read
    next_logits: torch.Tensor | None = None   # after prefill
    feed: FrontierFeed = field(default_factory=FrontierFeed)   # this round's fed nodes
    tree: DraftTree | None = None
    shape: tuple[int, int] = (0, 0)           # this round's (depth, top_k)
    log: RoundLog = field(default_factory=RoundLog)
    shape_generator: torch.Generator | None = None   # ADT's random initialisation only


@register("tree")
class TreeDrafter(DraftingMethod):
    tasks = ("caption", "image")
    # rows of a batch: the draft grows each row's tree alone (its own cache; the draft is
    # the cheap model), the target verifies every row's tree in one ragged forward
    batches = True
    relaxes = True     # acceptance: relaxed judges tree nodes (image codes)
    trees = True
    help = "EAGLE-2 or static draft trees, section tree:"
    search_rank = 3
    late_prefill = True   # prefill: the request only; propose catches up on the tokens

    @classmethod
    def models(cls, profile) -> list[tuple[str, str | None]]:
        return draft_model_names(profile)

    @classmethod
    def label(cls, profile) -> str:
        t = profile.tree
        return (f"tree {t.policy} ({cls._depth(profile)}, top_k={t.top_k}, "
                f"total_tokens={t.total_tokens})")

    @classmethod
    def _depth(cls, profile) -> str:
        """The depth as a line names it: "depth=5", or "depth auto ≤ 5" when chosen per round
        (drafting.length auto caps each round's tree)."""
        auto = cls.draft_length(profile) == "auto"
        return f"depth auto ≤ {profile.tree.depth}" if auto else f"depth={profile.tree.depth}"

    @classmethod
    def record_fields(cls, profile, task: str) -> dict:
        if task == "image":
            return {"draft_length": cls.draft_length(profile),
                    "tree": tree_section(profile, policy=True)}
        # γ 0: a tree has no chain length (its section says its shape)
        return {"drafting_inputs": cls.drafting_inputs(profile), "gamma": 0,
                "draft_length": cls.draft_length(profile), "tree": tree_section(profile)}

    @classmethod
    def tree_size(cls, profile) -> tuple[int, int]:
        """(nodes a round verifies at most, rows the draft expands at once)."""
        return profile.tree.total_tokens, profile.tree.top_k

    @classmethod
    def round_width(cls, profile) -> int:
        return cls.tree_size(profile)[0] + 1   # the pending token and the tree's nodes

    @classmethod
    def compile_plan(cls, profile) -> list[tuple[str, int, str, int | None]]:
        frontier = cls.tree_size(profile)[1]
        return [("target", 1, "causal", None), ("target", cls.round_width(profile), "tree", None),
                ("draft", 2, "causal", None), ("draft", frontier, "tree", None)]

    @classmethod
    def own_probe(cls, profile) -> tuple[bool, int, tuple[int, int, int] | None]:
        t = profile.tree
        return False, (t.top_k if profile.task == "caption" else 0), (t.depth, t.top_k, t.total_tokens)

    def __init__(self, draft, sampling: SamplingParams, drafting_input: str = "multimodal",
                 depth: int = 5, top_k: int = 4, total_tokens: int = 20,
                 image_token: str | None = None, captioner=None, eos_ids=(),
                 policy: str = "dynamic", shape=None, per_token: bool = False) -> None:
        if drafting_input not in DRAFTING_INPUTS:
            raise ValueError(f"{self.name} drafting supports inputs {DRAFTING_INPUTS}, not "
                             f"'{drafting_input}'")
        check_inputs([drafting_input], draft, captioner)
        if min(depth, top_k, total_tokens) < 1:
            raise ValueError("tree.depth, tree.top_k and tree.total_tokens must be >= 1")
        if policy not in TREE_POLICIES:
            raise ValueError(f"tree.policy must be one of {TREE_POLICIES}, not '{policy}'")
        self.draft = draft
        self.sampling = sampling
        self.drafting_input = drafting_input
        self.depth, self.top_k, self.total_tokens = depth, top_k, total_tokens
        self.static = policy == "static"
        # what sizes each round's tree: FixedShape, or AdjacencyAdaptive (method adt)
        self.shape = shape or FixedShape(depth, top_k)
        self.policy = policy
        self.per_token = per_token     # report each token's acceptance length (images)
        self.image_token = image_token
        self.captioner = captioner
        self.eos_ids = set(eos_ids)

    # -- from a profile --------------------------------------------------------------
    @classmethod
    def check(cls, profile) -> None:
        if profile.task != "image":
            one_input(profile)

    @classmethod
    def beside(cls, profile, shipped: tuple[str, ...] = ()) -> dict:
        return first_input(profile) if profile.task != "image" else {}

    @classmethod
    def from_profile(cls, profile, target, sampling, trace=None) -> "TreeDrafter":
        m = load_draft(profile, target)
        image = profile.task == "image"
        t = profile.tree
        return cls(m.draft, sampling, m.inputs[0] if image else one_input(profile),
                   depth=t.depth, top_k=t.top_k, total_tokens=t.total_tokens, policy=t.policy,
                   per_token=image, eos_ids=eos_token_ids(target), image_token=m.image_token,
                   captioner=m.captioner, **cls._shape_settings(profile, target))

    @classmethod
    def _shape_settings(cls, profile, target) -> dict:
        """Keyword settings of the tree's shape policy beyond section tree:."""
        return {}

    @classmethod
    def gamma(cls, profile) -> int:
        # a tree's depth bounds the tokens a round can accept, as γ bounds a chain's
        return profile.tree.depth

    @classmethod
    def describe(cls, profile) -> str:
        t = profile.tree
        return (f", draft {profile.draft.model} {list(profile.drafting.inputs)} tree "
                f"{cls._depth(profile)} top_k={t.top_k} total_tokens={t.total_tokens}")

    # -- decoding --------------------------------------------------------------------
    def feed_size(self, k: int) -> int:
        """The pending token and the nodes of a tree k levels deep (drafting.length auto
        prices a round by it): this tree's node count at the shape policy's width."""
        return tree_nodes(k, self.shape.width, self.total_tokens, self.sampling.greedy,
                          self.static) + 1

    def prefill(self, state: DecodeState) -> None:
        cache, logits = prefill_input(self.draft, state, self.drafting_input, self.image_token,
                                      self.captioner)
        shape_gen = torch.Generator(device="cpu").manual_seed(state.request.seed + 0x5EED)
        state.drafter_state = TreeState(cache, next_logits=logits, shape_generator=shape_gen)

    def propose(self, state: DecodeState, max_tokens: int) -> DraftTree:
        st: TreeState = state.drafter_state
        lm = self.draft
        unseen = st.cursor.unseen(state.tokens)
        if unseen:  # committed tokens the draft has not read (last round's target token …)
            ids = torch.tensor([unseen], device=lm.device)
            root = lm.adapter.extend(lm, ids, st.cache)[0, -1]
            st.cursor.read(state.tokens)
        else:
            root = st.next_logits
        st.next_logits = None
        st.feed.start(cache_length(st.cache))

        def step(tree: DraftTree, nodes: list[int]) -> torch.Tensor:
            # feed the frontier nodes: each sees the prefix, its ancestors (all fed at
            # earlier levels) and itself, at position prefix + depth
            ids, pos, allowed = st.feed.feed(tree, nodes)
            return lm.adapter.extend(lm, ids.to(lm.device), st.cache,
                                     attention_mask=attention_for(lm, allowed, st.cache),
                                     position_ids=pos.to(lm.device))[0]

        depth, top_k = self.shape.choose(st.log, len(state.tokens), st.shape_generator)
        depth = min(depth, max_tokens)
        st.shape = (depth, top_k)
        st.tree = expand_tree(root, step, depth, top_k, self.total_tokens, self.sampling,
                              state.draft_generator, self.eos_ids, static=self.static)
        return st.tree

    def accept(self, state: DecodeState, verdict: Verdict) -> None:
        st: TreeState = state.drafter_state
        tree = st.tree
        if tree is None:  # no tree this round (the token budget allowed no proposal)
            return
        # keep the prefix and the accepted nodes the draft fed, in path order (fed nodes
        # off the path stay past the cache's length, unread)
        fed_path = st.feed.slots(tree, verdict.path or [])
        keep_branch(st.cache, st.feed.prefix, fed_path)
        st.cursor.covered += len(fed_path)
        st.tree = None
        depth, top_k = st.shape
        n = len(verdict.accepted)
        st.log.add(TreeRound(len(state.tokens) - n - 1, depth, top_k, n))

    def finish(self, state: DecodeState) -> None:
        summary = state.drafter_state.log.summary(len(state.tokens))
        if not self.per_token:
            del summary["accept_lengths"]
        state.stats.trees = {"policy": self.policy, **summary}



@register("adt")
class AdtDrafter(TreeDrafter):
    """ADT-Tree: EAGLE-2 dynamic trees whose depth and width follow the image region
    (tree_shape.AdjacencyAdaptive; ``adaptive``: its keyword settings, ``cols``: tokens
    per image row)."""

    tasks = ("image",)
    # generate-image decodes one image at a time (a guided target runs two rows per image,
    # the conditional and the guiding one, which a ragged batch's rows are not)
    batches = False
    help = "ADT-Tree: trees adapted per image region"
    searched_first = ("image",)
    search_rank = 2       # (image: ADT-Tree before fixed trees)

    @classmethod
    def label(cls, profile) -> str:
        a = profile.adaptive_tree
        auto = " (capped per round: auto)" if cls.draft_length(profile) == "auto" else ""
        return (f"adt {a.init} β={a.beta} l_d={a.step_depth} l_k={a.step_top_k} "
                f"depth {a.min_depth}-{a.max_depth}{auto} top_k {a.min_top_k}-{a.max_top_k}")

    @classmethod
    def drafting_inputs(cls, profile) -> list[str]:
        return []   # it drafts image codes from the prompt alone

    @classmethod
    def record_fields(cls, profile, task: str) -> dict:
        return super().record_fields(profile, task) | {"adaptive_tree": vars(profile.adaptive_tree).copy()}

    @classmethod
    def tree_size(cls, profile) -> tuple[int, int]:
        a = profile.adaptive_tree
        return a.max_depth * a.max_top_k, a.max_top_k

    @classmethod
    def own_probe(cls, profile) -> tuple[bool, int, tuple[int, int, int] | None]:
        return False, 0, None

    def __init__(self, draft, sampling: SamplingParams, drafting_input: str = "multimodal",
                 cols: int = 1, adaptive=None, depth: int = 4, top_k: int = 4, **kwargs) -> None:
        shape = AdjacencyAdaptive(cols, depth=depth, top_k=top_k, **(adaptive or {}))
        kwargs.pop("policy", None)
        super().__init__(draft, sampling, drafting_input, depth=depth, top_k=top_k, shape=shape,
                         **kwargs)
        self.policy = "adt"

    @classmethod
    def task_error(cls, task: str, methods: list[str]) -> str:
        if task != "caption":
            return super().task_error(task, methods)
        return ("method 'adt' adapts trees to an image-token grid: it is for "
                "generate-image; use method 'tree' here")

    @classmethod
    def _shape_settings(cls, profile, target) -> dict:
        a = asdict(profile.adaptive_tree)
        bounds = AdtBounds(*(a.pop(k) for k in ("min_depth", "max_depth", "min_top_k", "max_top_k")))
        return dict(cols=target.adapter.image_grid(target)[1], adaptive=dict(a, bounds=bounds))

    @classmethod
    def gamma(cls, profile) -> int:
        return profile.adaptive_tree.max_depth

    @classmethod
    def describe(cls, profile) -> str:
        return draft_line(profile)
