"""What ``vlmspec profile`` shows of its numbers, in words (ui.latency_table draws the rows;
nothing here uses rich).

TABED's Remarks 1-3 are the paper's assumptions behind Eq. 1: verifying a few tokens costs
about one target step (1), and a draft step costs about the same at any context length (2)
and for any number of rows drafted together (3). A "does not hold" without those words
read as a fault; they are said as sentences, and only under -v: Eq. 1 with the measured
verification already accounts for Remark 1.
"""

from __future__ import annotations

# (key in measurements.remarks, what it assumes, what varies)
REMARKS = (
    ("remark1_target_vs_gamma", "verifying up to 10 tokens costs about one target step",
     "with the tokens verified"),
    ("remark2_draft_vs_S", "a draft step costs the same at any context length",
     "with the context length"),
    ("remark3_draft_vs_B", "drafting several rows at once costs about one row",
     "with the rows drafted together"),
)

Row = tuple[str, str, bool]   # (metric, value, flagged)


def remark_lines(remarks: dict) -> list[str]:
    """One sentence per TABED remark: what it assumes and how far this hardware is off."""
    out = []
    for n, (key, assumes, varies) in enumerate(REMARKS, 1):
        r = remarks.get(key, "absent")
        if r == "absent":
            continue
        if r is None:
            seen = "not measured here (one timing only)"
        else:
            pct = f"{r['max_rel_dev']:.0%}"
            seen = (f"holds here (within {pct})" if r["holds"]
                    else f"here it varies by up to {pct} {varies}")
        out.append(f"TABED's Remark {n}: {assumes}; {seen}.")
    return out


def suspect_line(hardware: dict) -> str | None:
    """One plain line naming the timings still off after a second measurement, or None."""
    suspect = hardware["measurements"].get("suspect") or []
    if not suspect:
        return None
    return (f"{len(suspect)} measurement(s) still off after timing them again (a busy "
            f"machine? rerun with more --repeats): {'; '.join(suspect)}")


def _eq1_value(tau: str, e: dict, verified: str) -> str:
    measured = e["eq1_measured_verify"]
    shown = (f"{measured:.2f}x" if measured <= float(tau) + 1e-9
             else "above τ, suspect")
    return f"{e['eq1']:.2f}x (with measured T_p({verified}): {shown})"


def latency_rows(hardware: dict) -> list[Row]:
    """The table's rows."""
    m = hardware["measurements"]
    rows: list[Row] = [("profile", f"{m['profile']} ({m['method']}, γ={m['gamma']}, "
                                   f"draft rows {m['draft_rows']})", False)]
    if m.get("threads_job_ms"):
        jobs = ", ".join(f"{n}: {ms:.0f} ms ({m['threads_prefill_ms'][n]:.0f} prefill)"
                         for n, ms in m["threads_job_ms"].items())
        rows += [("CPU threads: 3 sample requests", jobs, False),
                 ("CPU threads: fastest", f"{hardware['threads']} decoding, "
                                          f"{hardware['prefill_threads']} prefilling", False)]
    rows.append(("prefill (sample request)", f"{hardware['prefill_ms']:.2f} ms", False))
    rows.append(("target step T_p", f"{hardware['target_ms']:.3f} ms", False))
    verified = f"round={m['round_width']}" if "round_width" in m else f"γ+1={m['gamma'] + 1}"
    rows.append((f"target verify T_p({verified})", f"{hardware['target_verify_ms']:.3f} ms", False))
    if hardware.get("draft_ms") is not None:
        rows.append(("draft step T_q", f"{hardware['draft_ms']:.3f} ms", False))
        rows.append(("latency ratio T_q/T_p", f"{hardware['latency_ratio']:.3f}", False))
    if hardware.get("compiled_target_ms") is not None:
        rows.append(("target step T_p, compiled", f"{hardware['compiled_target_ms']:.3f} ms", False))
        if hardware.get("compiled_draft_ms") is not None:
            rows.append(("draft step T_q, compiled", f"{hardware['compiled_draft_ms']:.3f} ms", False))
        rows.append(("compile warm-up", f"{hardware['compile_warmup_s']:.1f} s", False))
    if m.get("verify_over_step") is not None:
        rows.append((f"T_p({verified.split('=')[0]}) / T_p(1)", f"{m['verify_over_step']:.2f}", False))
    rows += _round_rows(m.get("rounds") or {}) + _frame_rows(m.get("frames") or {})
    for tau, e in m["expected_speedup"].items():
        rows.append((f"Eq. 1 speedup at τ={tau}", _eq1_value(tau, e, verified.split("=")[1]),
                     e["eq1_measured_verify"] > float(tau) + 1e-9))
    return rows


def _round_rows(r: dict) -> list[Row]:
    if not r.get("rounds_drafting"):
        return []
    return [
        (f"{r['method']} rounds (sample requests)",
         f"{r['rounds_drafting']} drafting, {r['drafted_per_round']:.1f} proposals, "
         f"{r['levels_per_round']:.1f} levels each", False),
        (f"{r['method']}: drafting per round", f"{r['draft_ms_per_round']:.3f} ms", False),
        (f"{r['method']}: verifying + rest per round", f"{r['verify_ms_per_round']:.3f} ms", False),
        (f"{r['method']}: drafting per level / T_p",
         f"{r['draft_ms_per_level']:.3f} ms ({r['draft_per_level_over_target_step']:.3f})", False)]


def _frame_rows(frames: dict) -> list[Row]:
    rows = []
    for k, f in frames.items():
        parts = [f"{f['prompt_tokens']} positions", f"prefill {f['prefill_ms']:.1f} ms"]
        if f.get("target_step_ms") is not None:
            parts.append(f"step {f['target_step_ms']:.2f} ms")
        if f.get("draft_ms_per_level") is not None:
            parts.append(f"drafting {f['draft_ms_per_level']:.2f} ms/level")
        rows.append((f"video of {k} frames", ", ".join(parts), False))
    return rows
