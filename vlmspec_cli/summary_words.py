"""The summary's drafting rows in words (ui.summary_table draws them; nothing here uses
rich, and no record changes: JSON keys stay ``mean_acceptance_length``, ``draft_length``…).

"mean acceptance length", "mean γ" and "cut by confidence" were the papers' words: τ is
the tokens each target forward gives, γ how many tokens the draft proposed per round, and a
round "cut by confidence" stopped drafting early because the draft was unsure of its next
token (runtime/length/draft_stop.py). The rows say so, with the symbols in brackets for
whoever reads the papers and the README.
"""

from __future__ import annotations


def acceptance_rows(stats) -> list[tuple[str, str]]:
    """τ, the share of drafted tokens accepted and the acceptance per draft position."""
    if not stats.num_draft_tokens:   # rounds that all decoded plain have no acceptance
        return []
    rates = " ".join(f"{c / stats.num_drafts:.2f}" for c in stats.accepted_per_pos)
    return [("tokens per target pass (τ)", f"{stats.mean_accept_len:.3f}"),
            ("drafted tokens accepted", f"{stats.draft_accept_rate:.1%}"),
            ("accepted at draft position 1, 2, …", rates)]


def length_rows(d: dict | None) -> list[tuple[str, str]]:
    """drafting.length auto (``stats.draft_length``): the draft length chosen per round (a
    chain the draft stopped early drafted fewer), the
    rounds that drafted (and stopped early), those the target decoded alone, and why
    drafting was off when it was."""
    if not d:
        return []
    chosen = (f"{d['mean_gamma']:.2f} per round on average (auto, at most {d['max']})"
              if d["rounds_drafted"] else f"none (auto, at most {d['max']})")
    stopped = d.get("rounds_stopped")
    rounds = (f"{d['rounds_drafted']} drafted"
              + (f" ({stopped} stopped early: draft unsure)" if stopped else "")
              + f", {d['rounds_plain']} by the target alone")
    rows = [("draft length chosen (γ)", chosen), ("rounds", rounds)]
    if d.get("off_reason"):
        rows.append(("drafting off", d["off_reason"]))
    return rows
