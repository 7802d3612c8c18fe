"""What ``vlmspec calibrate`` searches: per task, the probes (configurations decoded once on
the samples to measure acceptance) and the candidates each probe stands for.

A probe is a set of profile settings (dotted keys, as ``--set`` takes them) applied to the
base profile; the written winner is the base profile plus the same settings, so what was
measured is what the user runs. A probe of a chain-like method (a chain of the draft model,
a TABED ensemble, the hidden-state head's chain, the twig) decodes at the largest γ and
stands for every γ: at T = 0 a chain of γ drafts the first γ tokens of the longer chain,
so a round that accepted k of them accepts min(k, γ) (``tau_for_gamma``); the ensemble's
weights and the twig's early stop make that an estimate for them, which the finalists'
real decodes check. A tree cannot be replayed that way (which nodes a smaller tree keeps
changes what is accepted), nor can ADT-Tree's adaptive shapes: each of those shapes is its
own probe and its τ is measured.

Per task (the profile's ``task``):

- caption: chain × drafting input (M, T, C, P as the draft and captioner allow) × γ;
  TABED MT (grid weights) and MTCP (softmax); draft trees × TREE_SHAPES, dynamic and
  static; every hidden-state and EAGLE-3 head for this target (chain × γ, and trees); every twig for
  this target × θ ∈ TWIG_THRESHOLDS × γ (K is the layer each twig was trained on);
  ``--batch-size`` for folders is tried on the winner afterwards (tasks/calibrate.py).
- image: ADT-Tree bounds × β, and fixed draft trees (a chain is top_k 1).
- video: the plain draft's chain × γ, and every hidden-state and EAGLE-3 head for this
  target (chain × γ and trees).

The search takes them in the order ``next_probe`` chooses: every method family once, the
likeliest to win first, then the family modelled fastest so far (tasks/calibrate_plan.py
sizes each to the budget).

The profile's own configuration is always a probe, so it is always a candidate.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from vlmspec_cli.companions import SHIPPED_COMPANIONS
from vlmspec_cli.drafting_inputs import DRAFTING_INPUTS, letters

# (depth, top_k, total_tokens)
TREE_SHAPES = ((3, 2, 8), (4, 4, 12), (5, 4, 20), (6, 4, 30), (5, 8, 40))
HIDDEN_TREE_SHAPES = ((4, 4, 12), (5, 4, 20), (6, 4, 30))
IMAGE_TREE_SHAPES = ((8, 1, 8), (4, 4, 16), (6, 4, 32), (5, 8, 48))
ADT_BOUNDS = ((6, 6), (8, 10))          # (max_depth, max_top_k)
ADT_BETAS = (0.5, 1.0, 2.0)
TWIG_THRESHOLDS = (0.0, 0.3, 0.6, 0.8)

@dataclass(frozen=True)
class Probe:
    method: str
    settings: dict = field(hash=False)   # dotted profile keys set on the base profile
    label: str = ""
    replay: bool = False                 # chain-like: one decode at the largest γ stands for all
    rows: int = 0                        # draft-model rows per step; 0: no draft-model table
    tree: tuple[int, int, int] | None = None   # (depth, top_k, total_tokens) of a fixed tree


def short(model: str) -> str:
    return str(model).rstrip("/").rsplit("/", 1)[-1]


def companions(profile, kind: str, extra: tuple[str, ...] = ()) -> list[str]:
    """The hidden-state heads (kind "hidden") or twigs ("twig") to try with this target:
    those named on the command line, the profile's own when it uses that method, and the
    shipped ones trained on this target."""
    own = [getattr(profile, kind).model] if profile.method == kind else []
    shipped = SHIPPED_COMPANIONS.get(profile.target.model, {}).get(kind, ())
    return list(dict.fromkeys(m for m in [*extra, *own, *shipped] if m))


def _tree_probe(method: str, shape, extra: dict, label: str, rows: int, policy="dynamic") -> Probe:
    d, k, n = shape
    settings = {"method": method, **extra, "tree.depth": d, "tree.top_k": k,
                "tree.total_tokens": n, "tree.policy": policy}
    name = f"{label} d={d} k={k} n={n}" + (" static" if policy == "static" else "")
    return Probe(method, settings, name, rows=rows, tree=shape)


def _head_probes(kind: str, heads: list[str], shapes, pinned: dict) -> list[Probe]:
    """A target's own heads (``kind``: hidden or eagle3, the method and its section; ``pinned``:
    what else it sets): each as a chain (replayed for every γ) and as trees of ``shapes``."""
    out = []
    for head in heads:
        base = {f"{kind}.model": head, **pinned}
        out.append(Probe(kind, {"method": kind, **base, f"{kind}.tree": False},
                         f"{kind} {short(head)}", replay=True))
        out += [_tree_probe(kind, s, {**base, f"{kind}.tree": True}, f"{kind} {short(head)} tree",
                            rows=0) for s in shapes]
    return out


def _heads(profile, extra: dict) -> list[Probe]:
    """Every hidden-state and EAGLE-3 head for this target (``extra``: those named on the
    command line, by kind)."""
    # (a hidden head reads the layer it was trained on: the profile's may be another's)
    kinds = (("hidden", {"hidden.layer": None}), ("eagle3", {}))
    return [p for kind, pinned in kinds
            for p in _head_probes(kind, companions(profile, kind, tuple(extra.get(kind, ()))),
                                  HIDDEN_TREE_SHAPES, pinned)]


def caption_probes(profile, draft, captioner_ok: bool, heads: list[Probe], twigs: list[str]) -> list[Probe]:
    images = draft is not None and draft.adapter.takes_images
    singles = [i for i in DRAFTING_INPUTS
               if (i not in ("multimodal", "pooled") or images) and (i != "caption" or captioner_ok)]
    out = []
    if draft is not None:
        out += [Probe("chain", {"method": "chain", "drafting.inputs": [i]}, f"chain {letters([i])}",
                      replay=True, rows=1) for i in singles]
        ensembles = [(["multimodal", "text"], "grid")] if images else []
        if images and captioner_ok:
            ensembles.append((list(DRAFTING_INPUTS), "softmax"))
        out += [Probe("tabed", {"method": "tabed", "drafting.inputs": ins, "ensemble.policy": pol},
                      f"tabed {letters(ins)}*", replay=True, rows=len(ins)) for ins, pol in ensembles]
        tree_in = {"drafting.inputs": [tree_input(profile, draft)]}
        tag = f"tree {letters(tree_in['drafting.inputs'])}"
        for policy in ("dynamic", "static"):
            out += [_tree_probe("tree", s, tree_in, tag, rows=s[1], policy=policy) for s in TREE_SHAPES]
    out += heads
    for twig in twigs:
        out += [Probe("twig", {"method": "twig", "twig.model": twig, "twig.layers": None,
                               "twig.threshold": theta}, f"twig {short(twig)} θ={theta}", replay=True)
                for theta in TWIG_THRESHOLDS]
    return out


def image_probes(profile) -> list[Probe]:
    out = []
    for max_depth, max_top_k in ADT_BOUNDS:
        for beta in ADT_BETAS:
            # the node budget per round (tree.total_tokens) stays the profile's
            settings = {"method": "adt", "adaptive_tree.beta": beta,
                        "adaptive_tree.max_depth": max(max_depth, profile.adaptive_tree.min_depth),
                        "adaptive_tree.max_top_k": max(max_top_k, profile.adaptive_tree.min_top_k)}
            out.append(Probe("adt", settings, f"adt β={beta} depth≤{max_depth} top_k≤{max_top_k}"))
    # a guided draft step runs two rows per frontier node: timed from the rounds, not a table
    out += [_tree_probe("tree", s, {}, "tree", rows=0) for s in IMAGE_TREE_SHAPES]
    return out


def video_probes(profile, draft, heads: list[Probe]) -> list[Probe]:
    out = []
    if draft is not None:
        out.append(Probe("chain", {"method": "chain", "drafting.inputs": ["multimodal"]},
                         "chain M", replay=True, rows=1))
    return out + heads


def tree_input(profile, draft) -> str:
    """The drafting input trees use: the profile's own single input, else multimodal when the
    draft reads images, else text."""
    own = list(profile.drafting.inputs)
    if len(own) == 1:
        return own[0]
    return "multimodal" if draft.adapter.takes_images else "text"


def round_robin(items: list[Probe]) -> list[Probe]:
    """The first probe of every method, then the second of each, …: the order probes are
    listed in (``next_probe`` chooses among them as the search goes)."""
    seen: dict[str, int] = {}
    ranked = []
    for i, p in enumerate(items):
        ranked.append((seen.get(p.method, 0), i, p))
        seen[p.method] = seen.get(p.method, 0) + 1
    return [p for _, _, p in sorted(ranked, key=lambda r: r[:2])]


def next_probe(queue: list[Probe], probed: set[str], best: dict[str, float]) -> Probe:
    """What to probe next: a method family not probed yet, the likeliest to win first (the
    methods' declared ``search_rank``: a target's own heads, then a draft's chain, trees,
    ensembles, twigs), so that a budget cut short has tried every family; then the probes
    of the family whose candidates are modelled fastest so far (``best``: its best
    predicted speedup), in listed order within it."""
    from vlmspec_cli.drafters import method_class

    fresh = [p for p in queue if p.method not in probed]
    if fresh:
        return min(fresh, key=lambda p: (method_class(p.method).search_rank, queue.index(p)))
    return min(queue, key=lambda p: (-best.get(p.method, 0.0), queue.index(p)))


def probes(profile, draft, *, captioner_ok: bool, hidden=(), twigs=(), eagle3=()) -> list[Probe]:
    """Every probe for the profile's task, methods taking turns (``round_robin``), and the
    profile's own configuration last. ``draft``: the profile's draft model (loaded), or None
    when it names none: then only the methods without one are searched."""
    if profile.task == "image":
        out = image_probes(profile)
    elif profile.task == "video":
        out = video_probes(profile, draft, _heads(profile, {"hidden": hidden, "eagle3": eagle3}))
    else:
        out = caption_probes(profile, draft, captioner_ok,
                             _heads(profile, {"hidden": hidden, "eagle3": eagle3}),
                             companions(profile, "twig", tuple(twigs)))
    return round_robin(out) + [own_probe(profile)]


def own_probe(profile) -> Probe:
    """The base profile as it is (settings {}); a chain-like method replays its γ too
    (the method's ``own_probe``)."""
    from vlmspec_cli.drafters import method_class

    replay, rows, tree = method_class(profile.method).own_probe(profile)
    return Probe(profile.method, {}, f"{profile.name} (own) {profile.method}", replay=replay,
                 rows=rows, tree=tree)
