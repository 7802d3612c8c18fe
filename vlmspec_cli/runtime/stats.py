"""Speculative-decoding counters and derived metrics (the records' ``stats``). No formatting here.

Records (``to_dict``) use vLLM's spec-decode metric names: a *draft* is one draft→verify
round; ``mean_acceptance_length`` counts the bonus/correction token (1 + accepted /
drafts); ``num_accepted_tokens_per_pos[i]`` counts rounds whose draft token i+1 was
accepted (unconditional); ``draft_acceptance_rate`` is accepted / drafted. Here the
attributes keep their short names (``mean_accept_len``, ``draft_accept_rate``,
``accepted_per_pos``), which records written before used and ``from_dict`` still reads.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field


@dataclass
class SpecStats:
    new_tokens: int = 0
    num_drafts: int = 0
    num_draft_tokens: int = 0
    num_accepted_tokens: int = 0
    accepted_per_pos: list[int] = field(default_factory=list)
    accept_len_hist: list[int] = field(default_factory=list)  # [k]: rounds with k accepted
    prefill_s: float = 0.0
    wall_s: float = 0.0
    caption_s: float = 0.0    # captioner time (caption drafting), overlapping the prefill
    # tabed: {"inputs": [...], "policy": ..., "block_weights": [[w_1..w_m] per block]}
    ensemble: dict | None = None
    # twig-guided pruning: visual tokens, kept R, layer, final_wipe, mean_retained (Eq. 6)
    pruning: dict | None = None
    # draft trees: policy, mean depth d̄ and width, per-round shapes (tree_shape.RoundLog)
    trees: dict | None = None
    # hidden-state drafts: entries in the head's cache (text positions only) vs the prompt
    draft_cache: dict | None = None
    # drafting.length auto: rounds drafted and plain, the γ chosen (draft_length.py)
    draft_length: dict | None = None

    def record_round(self, drafted: int, accepted: int, emitted: int,
                     positions: int | None = None) -> None:
        """One draft→verify round: ``drafted`` proposals, ``accepted`` of them kept, and
        ``emitted`` tokens added to the output (accepted + the target's own token).
        ``positions``: how deep the proposals reach (a tree's depth; a chain's length)."""
        self.num_drafts += 1
        self.num_draft_tokens += drafted
        self.num_accepted_tokens += accepted
        self.new_tokens += emitted
        positions = drafted if positions is None else positions
        if len(self.accepted_per_pos) < positions:
            self.accepted_per_pos.extend([0] * (positions - len(self.accepted_per_pos)))
        for i in range(accepted):
            self.accepted_per_pos[i] += 1
        if len(self.accept_len_hist) <= accepted:
            self.accept_len_hist.extend([0] * (accepted + 1 - len(self.accept_len_hist)))
        self.accept_len_hist[accepted] += 1

    def merge(self, other: "SpecStats") -> None:
        for name in ("new_tokens", "num_drafts", "num_draft_tokens", "num_accepted_tokens"):
            setattr(self, name, getattr(self, name) + getattr(other, name))
        self.prefill_s += other.prefill_s
        self.caption_s += other.caption_s
        self.wall_s += other.wall_s
        self.accepted_per_pos = _add_lists(self.accepted_per_pos, other.accepted_per_pos)
        self.accept_len_hist = _add_lists(self.accept_len_hist, other.accept_len_hist)
        self.draft_length = merge_length(self.draft_length, other.draft_length)

    @property
    def mean_accept_len(self) -> float:
        return 1.0 + self.num_accepted_tokens / self.num_drafts if self.num_drafts else 0.0

    @property
    def draft_accept_rate(self) -> float:
        return self.num_accepted_tokens / self.num_draft_tokens if self.num_draft_tokens else 0.0

    @property
    def decode_s(self) -> float:
        """Time after the prefill (drafting and verifying)."""
        return max(self.wall_s - self.prefill_s, 0.0)

    @property
    def prefill_share(self) -> float:
        """The prefill's share of the wall time (Sparrow Table 5: it grows with the video)."""
        return self.prefill_s / self.wall_s if self.wall_s > 0 else 0.0

    @property
    def tokens_per_s(self) -> float:
        return self.new_tokens / self.wall_s if self.wall_s > 0 else 0.0

    @classmethod
    def from_dict(cls, d: dict) -> "SpecStats":
        """A record's stats (vLLM's names, or the short ones of older records)."""
        d = {_SHORT.get(k, k): v for k, v in d.items()}
        names = ("new_tokens", "num_drafts", "num_draft_tokens", "num_accepted_tokens",
                 "accepted_per_pos", "accept_len_hist", "prefill_s", "wall_s", "caption_s",
                 "ensemble", "pruning", "trees", "draft_cache", "draft_length")
        return cls(**{k: d[k] for k in names if k in d})

    def to_dict(self) -> dict:
        d = {_RECORD.get(k, k): v for k, v in asdict(self).items()}
        d["mean_acceptance_length"] = round(self.mean_accept_len, 4)
        d["draft_acceptance_rate"] = round(self.draft_accept_rate, 4)
        d["tokens_per_s"] = round(self.tokens_per_s, 2)
        d["wall_s"] = round(self.wall_s, 4)
        d["prefill_s"] = round(self.prefill_s, 4)
        d["caption_s"] = round(self.caption_s, 4)
        d["decode_s"] = round(self.decode_s, 4)
        d["prefill_share"] = round(self.prefill_share, 4)
        for optional in ("ensemble", "pruning", "trees", "draft_cache", "draft_length"):
            if d[optional] is None:
                del d[optional]
        return d


# attribute -> record name (vLLM's), and back
_RECORD = {"accepted_per_pos": "num_accepted_tokens_per_pos",
           "mean_accept_len": "mean_acceptance_length", "draft_accept_rate": "draft_acceptance_rate"}
_SHORT = {record: short for short, record in _RECORD.items()}


def _add_lists(a: list[int], b: list[int]) -> list[int]:
    n = max(len(a), len(b))
    return [(a[i] if i < len(a) else 0) + (b[i] if i < len(b) else 0) for i in range(n)]


def length_section(ceiling: int, hist: list[int], probes: int,
                   rates: list[float] | None, off_reason: str | None = None,
                   stopped: int = 0) -> dict:
    """``stats.draft_length``: rounds that drafted and that decoded plain (``probes`` of
    the drafted ones tried drafting again after plain rounds), the γ chosen
    (``gamma_hist[k]``: rounds that chose k; 0: plain), its mean over drafted rounds,
    ``rounds_stopped`` (drafted rounds whose chain ended short of γ by the draft's
    confidence, draft_stop.py), and the per-position acceptance estimated at the end
    (``accept_rates``; not summed); ``off_reason``: why drafting was off from the start
    (draft_cost.py), when it was."""
    drafted = sum(hist[1:])
    mean = sum(k * n for k, n in enumerate(hist)) / drafted if drafted else 0.0
    return {"policy": "auto", "max": ceiling, "rounds_drafted": drafted,
            "rounds_plain": hist[0] if hist else 0, "probes": probes, "rounds_stopped": stopped,
            "mean_gamma": round(mean, 3), "gamma_hist": list(hist), "accept_rates": rates,
            **({"off_reason": off_reason} if off_reason else {})}


def merge_length(a: dict | None, b: dict | None) -> dict | None:
    """Two requests' ``draft_length`` as one (a summary over records; no rates)."""
    if a is None or b is None:
        return None if a is None and b is None else dict(a or b)
    return length_section(max(a["max"], b["max"]), _add_lists(a["gamma_hist"], b["gamma_hist"]),
                          a["probes"] + b["probes"], None,
                          a.get("off_reason") or b.get("off_reason"),
                          a.get("rounds_stopped", 0) + b.get("rounds_stopped", 0))
