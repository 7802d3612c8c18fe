"""``vlmspec profile``: measure a profile's models on this hardware and write the numbers as
a hardware profile (the ``hardware:`` section) that other profiles can ``include:``."""

from __future__ import annotations

import datetime
import os
import platform
import random
import statistics
import time
from typing import Callable

import torch
import transformers

from vlmspec_cli.runtime.fast.latency import (LatencyTables, eq1_speedup, measure_tables, median_ms,
                                              remarks, time_extend, time_widths)
from vlmspec_cli.runtime.limits import position_limit, prompt_tokens
from vlmspec_cli.runtime.request import Message, Request
from vlmspec_cli.runtime.round.round_timing import time_rounds
from vlmspec_cli.runtime.threads import ThreadPlan
from vlmspec_cli.tasks.hwprofile_checks import Steps, check_eq1, check_verify
from vlmspec_cli.tasks.probe_media import VIDEO_SECONDS, probe_frames, probe_image

TAUS = (2.0, 3.0, 4.0)


def sample_request(profile, seed: int = 0, frames: int | None = None) -> Request:
    """A representative request for the profile's task and prompt: one image (caption), or
    one video of ``frames`` frames (video; default the profile's video.frames), drawn by
    tasks/probe_media.py."""
    rng = random.Random(seed)
    if profile.task == "video":
        from vlmspec_cli.tasks.video_io import clip_from_arrays

        k = frames or profile.video.frames or 8
        clip = clip_from_arrays(probe_frames(rng, k), fps=k / VIDEO_SECONDS)
        return Request([Message("user", profile.generation.prompt, videos=(clip,))],
                       max_new_tokens=profile.generation.max_new_tokens, seed=seed)
    image = probe_image(rng)
    return Request([Message("user", profile.generation.prompt, (image,))],
                   max_new_tokens=profile.generation.max_new_tokens, seed=seed)


def device_name(device: torch.device, session_threads=None) -> str:
    """The device, and on a CPU the thread plan the measurements ran under (or the count)."""
    if device.type == "cuda":
        return f"{device} ({torch.cuda.get_device_name(device)})"
    cpu = platform.processor() or platform.machine()
    plan = session_threads.describe() if session_threads is not None else ""
    if plan:   # e.g. "CPU threads: 1 decoding, 2 prefilling"
        return f"{device.type} ({cpu}, threads: {plan.removeprefix('CPU threads: ')})"
    n = torch.get_num_threads()
    return f"{device.type} ({cpu}, {n} thread{'s' if n > 1 else ''})"


def draft_rows(profile) -> int:
    """Rows the draft runs per step (the method's: one per drafting input for tabed)."""
    from vlmspec_cli.drafters import method_class

    return method_class(profile.method).draft_rows(profile)


# positions left free above a timed context S for the tokens verified there (up to 64)
VERIFY_ROOM = 80


def context_range(target) -> tuple[int, int]:
    """The context lengths S the target can be timed at."""
    return 8, (position_limit(target) or 4096) - VERIFY_ROOM


def check_contexts(target, extra: list[int] | None) -> tuple[list[int] | None, str]:
    """The context lengths to time for ``extra`` (--contexts), and a note ("" if none): one
    longer than the target can be timed at is timed at the longest it can (the note says
    so); ValueError for one shorter than the shortest. Numbers are written without
    thousands separators: in a comma-separated option "1,024" reads as two values."""
    if not extra:
        return extra, ""
    lo, hi = context_range(target)
    short = [s for s in extra if s < lo]
    if short:
        raise ValueError(f"--contexts {short[0]}: context lengths run from {lo} (the target "
                         f"has {hi + VERIFY_ROOM} positions, {VERIFY_ROOM} kept free for the "
                         f"tokens verified, so at most {hi})")
    long = [s for s in extra if s > hi]
    note = ""
    if long:
        note = (f"--contexts {' '.join(map(str, long))}: the target has {hi + VERIFY_ROOM} "
                f"positions and {VERIFY_ROOM} stay free for the tokens verified, so "
                f"{'this is' if len(long) == 1 else 'these are'} timed at S = {hi}")
    return sorted({min(s, hi) for s in extra}), note


def context_lengths(target, prompt_len: int, extra: list[int] | None) -> list[int]:
    lo, hi = context_range(target)
    wanted = [prompt_len] + list(extra or [256, 512])
    return sorted({s for s in wanted if lo <= s <= hi})


def run_profile(session, *, contexts: list[int] | None = None, verify_tokens: list[int] | None = None,
                batches: list[int] | None = None, warmup: int = 3, repeats: int = 15,
                tau: float | None = None, progress: Callable[[str], None] | None = None,
                compile_steps: bool = False, frames: list[int] | None = None,
                threads: list[int] | None = None) -> dict:
    """Measure everything; returns the ``hardware`` section as a plain dict. First the CPU
    thread count (``threads``: the counts to try), which then stays set for every other
    measurement. With ``compile_steps`` also the compiled steps (runtime.compile) and their
    warm-up; for a video profile also prefill, target step and drafting as the video grows
    (``frames``). ``progress`` hears "step i/N, ETA ~Xs: …" before each step
    (tasks/hwprofile_checks.py); the T_p(k) and Eq. 1 found off are timed again and what
    stays off is listed as ``measurements.suspect``."""
    profile = session.profile
    target, draft = session.target, session.draft
    gamma, width = session.method.gamma(profile), session.method.round_width(profile)
    rows = draft_rows(profile)
    counts = thread_counts(threads)
    frames = (frames or [4, 8, 16, 32]) if profile.task == "video" else None
    steps = Steps(plan_steps(session, contexts, batches, counts, compile_steps, frames), progress)
    make_request, remeasure = _samplers(session, warmup, repeats)
    by_threads = measure_threads(session, make_request, counts, steps)
    if profile.task == "image":   # guided two-row forwards of image tokens
        from vlmspec_cli.tasks.hwprofile_image import image_tables

        tables = image_tables(session, warmup, repeats, steps)
        prompt_len = s0 = next(iter(tables.target_verify_ms))
    else:
        tables, prompt_len, s0 = text_tables(session, contexts, verify_tokens, batches, warmup,
                                             repeats, steps)
    wide = target.fast is not None and target.fast.wide is not None
    suspect = check_verify(tables.target_verify_ms, wide, remeasure, steps)
    t_p = tables.target_ms(s0, 1)
    t_verify = tables.target_ms(s0, width)   # a round as the method feeds it (chain: γ + 1)
    t_q = tables.draft_step_ms[rows][s0] if draft is not None else None
    ratio = t_q / t_p if t_q is not None else None
    rounds = measure_rounds(session, t_p, make_request, steps)
    if ratio is None and rounds and rounds.get("draft_ms_per_level") is not None:
        # no separate draft model (a hidden-state head, a twig): its drafting per level
        ratio = rounds["draft_ms_per_level"] / t_p
    expected = expected_speedups(tau, gamma, ratio, t_verify / t_p)
    suspect += check_eq1(expected, wide, t_verify / t_p, width)
    compiled = (measure_compiled(session, s0, rows, warmup, repeats, steps)
                if compile_steps else {})
    by_frames = (measure_frames(session, frames, warmup, repeats, steps)
                 if profile.task == "video" else None)
    return {
        "latency_ratio": round(ratio, 4) if ratio is not None else None,
        "device": device_name(target.device, session.threads),
        "dtype": str(target.dtype).replace("torch.", ""),
        "torch": str(torch.__version__), "transformers": str(transformers.__version__),
        "date": datetime.date.today().isoformat(),
        "target_ms": round(t_p, 4),
        "target_verify_ms": round(t_verify, 4),
        "draft_ms": round(t_q, 4) if t_q is not None else None,
        "prefill_ms": round(tables.prefill_ms, 4),
        **compiled,
        "threads": by_threads["best"] if by_threads else None,
        "prefill_threads": by_threads["best_prefill"] if by_threads else None,
        "measurements": {
            "profile": profile.name, "target": profile.target.model, "draft": profile.draft.model,
            "method": profile.method, "gamma": gamma, "draft_rows": rows, "prompt_tokens": prompt_len,
            "warmup": warmup, "repeats": repeats,
            **({"round_width": width} if width != gamma + 1 else {}),   # a tree's round
            **tables_dict(tables),
            "expected_speedup": expected,
            # T_p(round width)/T_p(1): what verifying a round costs in target steps
            "verify_over_step": round(t_verify / t_p, 4),
            "rounds": rounds,
            **({"frames": by_frames} if by_frames is not None else {}),
            **({"threads_job_ms": by_threads["job_ms"],
                "threads_prefill_ms": by_threads["prefill_ms"]} if by_threads else {}),
            # timings still off after a second measurement (tasks/hwprofile_checks.py)
            "suspect": suspect,
        },
    }


def _samplers(session, warmup: int, repeats: int):
    """(make_request(seed), remeasure(S, widths)) of the profile's task: its sample
    requests, and T_p(k) timed again as its tables time it."""
    profile, target = session.profile, session.target
    if profile.task == "image":
        from vlmspec_cli.tasks.hwprofile_image import image_request, time_guided_extend

        return (lambda seed: image_request(target, seed),
                lambda s, ks: time_guided_extend(target, ks, warmup, repeats)[1])
    return (lambda seed: sample_request(profile, seed),
            lambda s, ks: time_widths(target, s, ks, 1, warmup, repeats))


def tables_dict(tables: LatencyTables) -> dict:
    """The latency tables and TABED's remarks, rounded, as the YAML keeps them."""
    return {
        "target_verify_ms": {s: {k: round(v, 4) for k, v in row.items()}
                             for s, row in tables.target_verify_ms.items()},
        "draft_step_ms": {b: {s: round(v, 4) for s, v in row.items()}
                          for b, row in tables.draft_step_ms.items()},
        "target_batch_ms": {b: {k: round(v, 4) for k, v in row.items()}
                            for b, row in tables.target_batch_ms.items()},
        "remarks": remarks(tables),
    }


def expected_speedups(tau: float | None, gamma: int, ratio: float | None,
                      verify_over_step: float) -> dict:
    """Eq. 1 at each τ of TAUS (and ``tau``): with T_p(γ) ≈ T_p, and with the measured one."""
    if ratio is None:
        return {}
    return {str(t): {"eq1": round(eq1_speedup(t, gamma, ratio), 3),
                     "eq1_measured_verify": round(eq1_speedup(t, gamma, ratio, verify_over_step), 3)}
            for t in sorted(set(TAUS) | ({tau} if tau else set()))}


def plan_steps(session, contexts: list[int] | None, batches: list[int] | None,
               counts: list[int], compile_steps: bool, frames: list[int] | None) -> list[str]:
    """The kinds of run_profile's steps, in order (Steps weighs them): one per progress
    call the measurements make."""
    profile, target = session.profile, session.target
    kinds = ["threads"] * len(counts) if target.device.type == "cpu" else []
    if profile.task == "image":
        kinds += ["image"] + ["draft"] * (session.draft is not None) + ["prefill"]
    else:
        prompt_len = prompt_tokens(target, sample_request(profile).messages)
        n_s = len(context_lengths(target, prompt_len, contexts))
        n_b = len(set(batches or [1, 2, 3, 4]) | {draft_rows(profile)})
        kinds += ["prefill"] + ["verify"] * n_s + ["batch"] * n_b
        kinds += ["draft"] * (n_s * n_b if session.draft is not None else 0)
    kinds += ["rounds"] * bool(session.method.drafts)
    if compile_steps:
        draft = session.draft
        kinds += ["compile", "compiled"] + ["compiled"] * (draft is not None and draft.fast is not None)
    return kinds + ["frames"] * len(frames or [])


def thread_counts(given: list[int] | None) -> list[int]:
    """The CPU thread counts to try: ``given``, or 1, 2, 4, … and this machine's cores."""
    if given:
        return sorted(set(given))
    cores, n, out = os.cpu_count() or 1, 1, []
    while n < cores:
        out.append(n)
        n *= 2
    return out + [cores]


def measure_threads(session, make_request: Callable[[int], Request], counts: list[int],
                    progress: Callable[[str], None] | None = None, requests: int = 3) -> dict | None:
    """Per CPU thread count, the profile's own method decoding ``requests`` sample requests
    end to end: median wall time and prefill time (ms) of three passes after a warm one.
    The rounds' count (``threads``) is the one with the least wall minus prefill, the
    prefill's (``prefill_threads``) the one with the least prefill: small models' decoding
    operators take microseconds and threads can cost more than they save, while a long
    prompt's prefill gains from every core. Leaves the session on those counts (for the
    measurements after this one). None on an accelerator (threads only run the host's
    side there)."""
    if session.target.device.type != "cpu":
        return None
    sample = [make_request(seed) for seed in range(requests)]
    session.set_threads(ThreadPlan())          # each count for both phases while timing
    job, prefill = {}, {}
    for n in counts:
        torch.set_num_threads(n)
        if progress:
            progress(f"decoding {requests} sample requests on {n} CPU thread{'s' if n > 1 else ''}")
        walls, prefills = [], []
        for rep in range(4):                    # pass 0 warms up
            t0, pre = time.perf_counter(), 0.0
            for request in sample:
                pre += session.engine.generate(request).state.stats.prefill_s
            if rep:
                walls.append(time.perf_counter() - t0)
                prefills.append(pre)
        job[n], prefill[n] = statistics.median(walls) * 1e3, statistics.median(prefills) * 1e3
    best = min(counts, key=lambda n: job[n] - prefill[n])
    best_prefill = min(counts, key=prefill.get)
    session.set_threads(ThreadPlan(prefill=best_prefill, decode=best))
    session.threads.enter("decode")
    return {"job_ms": {n: round(v, 3) for n, v in job.items()},
            "prefill_ms": {n: round(v, 3) for n, v in prefill.items()},
            "best": best, "best_prefill": best_prefill}


def text_tables(session, contexts: list[int] | None, verify_tokens: list[int] | None,
                batches: list[int] | None, warmup: int, repeats: int,
                progress: Callable[[str], None] | None = None) -> tuple[LatencyTables, int, int]:
    """The latency tables of a caption or video profile, timed at the sample request's
    prompt length and ``contexts``; that length, and the context S the headline numbers
    are read at (the smallest timed)."""
    profile, target = session.profile, session.target
    request = sample_request(profile)
    baseline = session.baseline_engine()
    prompt_len = prompt_tokens(target, request.messages)
    if progress:
        progress("target prefill of a sample request")
    prefill = median_ms(lambda: baseline.finish(baseline.start(request)), target.device, warmup,
                        repeats)
    contexts = context_lengths(target, prompt_len, contexts)
    verify_tokens = sorted(set(verify_tokens or [1, 2, 4, 8, 16, 32, 64])
                           | {1, session.method.round_width(profile)})
    batches = sorted(set(batches or [1, 2, 3, 4]) | {draft_rows(profile)})
    tables = measure_tables(target, session.draft, contexts, verify_tokens, batches, warmup,
                            repeats, progress)
    tables.prefill_ms = prefill
    return tables, prompt_len, contexts[0]


def check_frames(session, frames: list[int] | None) -> None:
    """ValueError for a --frames length describe-video would not decode: past
    ``video.max_frames``, or more positions than the target has (--frames 100000 grew past
    12 GB building its sample; 1000 was timed at 8011 positions on a 4096-position target)."""
    cap, limit = session.profile.video.max_frames, position_limit(session.target)
    for k in sorted(frames or []):
        if cap and k > cap:
            raise ValueError(f"--frames {k}: more than video.max_frames ({cap}), the most frames "
                             "describe-video decodes (--set video.max_frames=N raises it)")
        s = prompt_tokens(session.target, sample_request(session.profile, 0, k).messages)
        if limit and s > limit - VERIFY_ROOM:
            raise ValueError(f"--frames {k}: a video of {k} frames takes {s} positions, more than "
                             f"the target's {limit} (with room to decode)")


def measure_frames(session, frames: list[int], warmup: int, repeats: int,
                   progress: Callable[[str], None] | None = None) -> dict:
    """Per video length (frames): the prompt's positions, the target's prefill, one target
    step after that many positions, and the profile's method drafting per level on one
    request of that length (a hidden-state head's cost should not grow with the video; a
    draft that reads the video grows like the target)."""
    baseline = session.baseline_engine()
    lo, hi = context_range(session.target)
    out = {}
    for k in frames:
        request = sample_request(session.profile, 0, k)
        s = prompt_tokens(session.target, request.messages)
        if progress:
            progress(f"video of {k} frames ({s} positions)")
        row = {"prompt_tokens": s,
               "prefill_ms": round(median_ms(lambda: baseline.finish(baseline.start(request)),
                                             session.target.device,
                                             min(warmup, 1), max(3, repeats // 5)), 4)}
        if lo <= s <= hi:
            row["target_step_ms"] = round(time_extend(session.target, s, 1, 1, warmup, repeats), 4)
        if session.method.drafts:
            r = time_rounds(session.engine, [request], warmup=0).summary()
            row["draft_ms_per_level"] = r.get("draft_ms_per_level")
        out[k] = row
    return out


def measure_rounds(session, t_p: float, make_request: Callable[[int], Request],
                   progress: Callable[[str], None] | None = None, requests: int = 3) -> dict | None:
    """The profile's own method decoding sample requests, every round timed
    (runtime/round/round_timing.py): its drafting cost per round and per level, whatever drafts
    (a draft model, a tree, an ensemble, a hidden-state head, a twig). None for method none."""
    profile = session.profile
    if not session.method.drafts:
        return None
    if progress:
        progress(f"{profile.method}: timing decoding rounds on {requests} sample requests")
    timed = time_rounds(session.engine, [make_request(seed) for seed in range(requests)])
    out = timed.summary()
    if out.get("draft_ms_per_level") is not None:   # against one target step T_p(1)
        out["draft_per_level_over_target_step"] = round(out["draft_ms_per_level"] / t_p, 4)
    return {"method": profile.method, "requests": requests, **out}


def measure_compiled(session, context: int, rows: int, warmup: int, repeats: int,
                     progress: Callable[[str], None] | None = None) -> dict:
    """The fast path's steps compiled (runtime.compile): the warm-up of the buckets the
    profile's method uses, then one target step and one draft step, timed as the eager
    ones were. The models are left uncompiled."""
    from vlmspec_cli.runtime.fast.compiled_step import set_compiled

    models = [lm for lm in (session.target, session.draft) if lm is not None and lm.fast is not None]
    if session.target.fast is None:
        raise ValueError("--compile times the fast path's compiled steps, and the target is "
                         f"not on the fast path ({session.target.fast_off_reason})")
    try:
        for lm in models:
            set_compiled(lm.fast)
        if progress:
            progress("compile warm-up")
        seconds = session.warm_up()
        if progress:
            progress("target: compiled step")
        target_ms = time_extend(session.target, context, 1, 1, warmup, repeats)
        draft_ms = None
        if session.draft is not None and session.draft.fast is not None:
            if progress:
                progress("draft: compiled step")
            draft_ms = time_extend(session.draft, context, 1, rows, warmup, repeats)
    finally:
        for lm in models:
            set_compiled(lm.fast, False)
    return {"compiled_target_ms": round(target_ms, 4),
            "compiled_draft_ms": None if draft_ms is None else round(draft_ms, 4),
            "compile_warmup_s": round(seconds, 4)}
