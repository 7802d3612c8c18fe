"""Engine fast path vs transformers' forward, every caption method, side by side in one run.

For each method (target-only, chain M, chain T, TABED MT, draft tree, twig) and each path
(``runtime.fast_path: off`` = transformers' forward over a DynamicCache, ``on`` = the
static-cache fast path, runtime/fast/fast_decoder.py, ``compiled`` = the fast path with
``runtime.compile: on``, runtime/fast/compiled_step.py), greedy, on the same fresh tinyworld
scenes, interleaved per input so load drift hits every row alike; plus HF ``generate()``
and HF assisted generation (the draft as assistant, constant γ).

Every model forward the engine makes is timed where the engine calls it (the adapter's
prefill / extend), so each row reports, besides tokens/s and τ:

* T_p(1): one target decoding step (the target-only row of the same path);
* T_p(k): the target's mean verification forward in this method (k tokens: pending +
  proposals, or a tree's nodes);
* T_q: the draft's mean forward (a step, or with compiled steps a whole greedy chain
  drafted in one call); q/round: draft forwards per round;
* Eq. 1' — the speedup Eq. 1 predicts with the measured costs:
  τ · T_p(1) / (q/round · T_q + T_p(k));
* measured ÷ Eq. 1' (the engine's efficiency), measured on the decode phase (wall time
  minus prefills, which Eq. 1 does not model; the end-to-end speedup is reported too), and
  the engine overhead per round: decode wall time minus the forwards' own time, per round,
  also as a fraction of T_p(1).

Compiled rows also report the compile warm-up (seconds, before the first request) and
the compiles that happened after it, per 100 rounds (0 when the buckets are right).

    python bench/engine.py [--n 12] [--max-new-tokens 48] [--threads 2] [--json out.json]
                           [--methods 'tree (M),twig'] [--paths off,on,compiled]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402

from benchlib import machine_info, print_table  # noqa: E402
from caption import hf_method, make_requests, sync  # noqa: E402  (bench/caption.py)
from vlmspec_cli.profile import load_profile  # noqa: E402
from vlmspec_cli.session import build_session  # noqa: E402

TIMED = ("prefill", "extend", "prefill_hidden", "extend_hidden", "greedy_chain")
PATHS = ("off", "on", "compiled")

METHODS = {   # row name: (profile, --set overrides)
    "target-only": ("tinyworld-caption", ["method=none"]),
    "chain (M)": ("tinyworld-caption", []),
    "chain (T)": ("tinyworld-caption", ["drafting.inputs=[text]"]),
    "tabed (MT)": ("tinyworld-tabed", []),
    "tree (M)": ("tinyworld-caption", ["method=tree"]),
    # the hidden-state head (HiViS/Sparrow): its forwards are timed as the draft's
    "hidden (chain)": ("tinyworld-hidden", []),
    # self-speculation: the drafter runs the target's layers itself, so its forwards are
    # not timed here (no T_p/T_q/overhead columns), only tokens/s and τ
    "twig": ("tinyworld-twig", []),
}


class TimedAdapter:
    """The model's own adapter, with its forwards timed (seconds and calls per kind)."""

    def __init__(self, inner, device, rename=None) -> None:
        self._inner, self._device = inner, device
        self._rename = rename or {}   # a method timed under one of TIMED's names
        self.seconds = {k: 0.0 for k in TIMED}
        self.calls = {k: 0 for k in TIMED}
        self.tokens = 0   # tokens fed by extend calls

    def reset(self) -> None:
        self.seconds = {k: 0.0 for k in TIMED}
        self.calls = {k: 0 for k in TIMED}
        self.tokens = 0

    def __getattr__(self, name):
        attr = getattr(self._inner, name)
        if name not in TIMED:
            return attr
        return self._timed(attr, name, lambda args: int(args[1].shape[-1]))

    def timed_method(self, name):
        """The inner object's own method ``name``, timed (the hidden head's ``_run``:
        (state, tokens, …))."""
        return self._timed(getattr(self._inner, name), self._rename[name],
                           lambda args: int(torch.as_tensor(args[1]).numel()))

    def _timed(self, attr, name, count):
        def timed(*args, **kwargs):
            sync(self._device)
            t0 = time.perf_counter()
            out = attr(*args, **kwargs)
            sync(self._device)
            self.seconds[name] += time.perf_counter() - t0
            self.calls[name] += 1
            if name.startswith("extend"):
                self.tokens += count(args)
            return out
        return timed


def build(method: str, path: str, args) -> dict:
    name, sets = METHODS[method]
    compiled = path == "compiled"
    prof = load_profile(name, [*sets, f"runtime.fast_path={'on' if compiled else path}",
                               f"runtime.compile={'on' if compiled else 'off'}",
                               f"generation.max_new_tokens={args.max_new_tokens}"])
    session = build_session(prof)
    warmup_s = None
    if session.plan_compile(args.n * args.max_new_tokens):
        warmup_s = session.warm_up()
    timers = {}
    for role, lm in (("target", session.target), ("draft", session.draft)):
        if lm is not None:
            lm.adapter = timers[role] = TimedAdapter(lm.adapter, lm.device)
    drafter = session.engine.drafter
    if session.draft is None and hasattr(drafter, "head"):   # the hidden head's forwards
        timers["draft"] = TimedAdapter(drafter, session.target.device, {"_run": "extend"})
        drafter._run = timers["draft"].timed_method("_run")
    return {"session": session, "timers": timers, "gamma": session.engine.gamma,
            "warmup_s": warmup_s}


def late_compiles(session) -> int:
    return sum(lm.fast.compiled.late_compiles for lm in (session.target, session.draft)
               if lm is not None and lm.fast is not None and lm.fast.compiled is not None)


def run_row(row: dict, req):
    for t in row["timers"].values():
        t.reset()
    sync(row["session"].target.device)
    t0 = time.perf_counter()
    res = row["session"].engine.generate(req)
    sync(row["session"].target.device)
    wall = time.perf_counter() - t0
    st = res.state.stats
    out = {"tokens": res.tokens, "wall": wall, "prefill": st.prefill_s, "rounds": st.num_drafts,
           "new_tokens": st.new_tokens}
    for role, t in row["timers"].items():
        out[role] = {"seconds": dict(t.seconds), "calls": dict(t.calls), "tokens": t.tokens}
    return out


def summarise(runs: list[dict], t_p1: float | None, reference: list[list[int]]) -> dict:
    wall = sum(r["wall"] for r in runs)
    tokens = sum(r["new_tokens"] for r in runs)
    rounds = sum(r["rounds"] for r in runs)
    prefill = sum(r["prefill"] for r in runs)
    tgt_s = sum(r["target"]["seconds"]["extend"] + r["target"]["seconds"]["extend_hidden"]
                for r in runs)
    tgt_n = sum(r["target"]["calls"]["extend"] + r["target"]["calls"]["extend_hidden"]
                for r in runs)
    tgt_tok = sum(r["target"]["tokens"] for r in runs)
    drafts = [r["draft"] for r in runs if "draft" in r]
    # a draft forward is a step, or a whole greedy chain drafted in one compiled call
    q_s = sum(d["seconds"]["extend"] + d["seconds"]["greedy_chain"] for d in drafts)
    q_n = sum(d["calls"]["extend"] + d["calls"]["greedy_chain"] for d in drafts)
    q_pre = sum(d["seconds"]["prefill"] for d in drafts)
    s = {"tokens_per_s": tokens / wall, "decode_tokens_per_s": tokens / (wall - prefill),
         "prefill_s": prefill, "tau": tokens / rounds if rounds else None,
         "rounds": rounds, "new_tokens": tokens, "wall_s": wall,
         "T_p_k_ms": 1e3 * tgt_s / tgt_n if tgt_n else None,
         "k": tgt_tok / tgt_n if tgt_n else None,
         "T_q_ms": 1e3 * q_s / q_n if q_n else None,
         "q_per_round": q_n / rounds if rounds else 0.0,
         # what the engine spends outside the models' forwards, per round (prefills,
         # including the draft's, are excluded: they are not part of a round)
         "overhead_ms_per_round": (1e3 * (wall - prefill - tgt_s - q_s) / rounds
                                   if rounds and tgt_n else None),
         "mismatches": sum(r["tokens"] != ref for r, ref in zip(runs, reference)),
         "draft_prefill_s": q_pre}
    if t_p1 and s["overhead_ms_per_round"] is not None:
        s["overhead_per_T_p1"] = s["overhead_ms_per_round"] / t_p1
        if s["tau"] and s["T_p_k_ms"]:
            s["eq1_prime"] = s["tau"] * t_p1 / (s["q_per_round"] * (s["T_q_ms"] or 0.0) + s["T_p_k_ms"])
    return s


def main() -> None:
    ap = argparse.ArgumentParser(description=" ".join(__doc__.split("\n\n")[0].split()))
    ap.add_argument("--n", type=int, default=12)
    ap.add_argument("--max-new-tokens", type=int, default=48)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--methods", default=",".join(METHODS),
                    help="rows to run, comma-separated (target-only is always run)")
    ap.add_argument("--paths", default=",".join(PATHS), help="paths to run, comma-separated")
    ap.add_argument("--json", type=Path)
    ap.add_argument("--markdown", action="store_true")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    methods = ["target-only"] + [m for m in args.methods.split(",") if m != "target-only"]
    paths = args.paths.split(",")
    unknown = [m for m in methods if m not in METHODS] + [p for p in paths if p not in PATHS]
    if unknown:
        ap.error(f"unknown row or path: {', '.join(unknown)}")
    rows = {(m, p): build(m, p, args) for m in methods for p in paths}
    base = rows[("target-only", paths[0])]["session"]
    # HF assisted generation uses chain (M)'s draft (the default profile's own)
    target = base.target
    chain = rows.get(("chain (M)", paths[0]))
    draft = (chain["session"] if chain else build_session(load_profile("tinyworld-caption"))).draft
    gc = draft.model.generation_config
    gc.num_assistant_tokens, gc.num_assistant_tokens_schedule = 5, "constant"
    gc.assistant_confidence_threshold = 0.0
    hf = {"hf generate": hf_method(target), "hf assisted": hf_method(target, assistant_model=draft.model)}
    requests = make_requests(args.n, args.seed, args.max_new_tokens)
    for row in rows.values():       # warm-up
        run_row(row, requests[0])
    late_before = {key: late_compiles(row["session"]) for key, row in rows.items()}
    runs = {key: [] for key in rows}
    hf_runs = {name: {"seconds": 0.0, "tokens": [], "forwards": 0} for name in hf}
    for req in requests:
        for key, row in rows.items():
            runs[key].append(run_row(row, req))
        for name, fn in hf.items():
            t0 = time.perf_counter()
            tokens, stats = fn(req)
            hf_runs[name]["seconds"] += time.perf_counter() - t0
            hf_runs[name]["tokens"].append(tokens)
            hf_runs[name]["forwards"] += stats.num_drafts
    reference = hf_runs["hf generate"]["tokens"]
    summary = {}
    for path in paths:
        only = runs[("target-only", path)]
        t_p1 = 1e3 * sum(r["target"]["seconds"]["extend"] for r in only) / max(
            1, sum(r["target"]["calls"]["extend"] for r in only))
        for m in methods:
            s = summarise(runs[(m, path)], t_p1, reference)
            s["T_p1_ms"] = t_p1
            row = rows[(m, path)]
            if row["warmup_s"] is not None:
                late = late_compiles(row["session"]) - late_before[(m, path)]
                s["compile_warmup_s"] = row["warmup_s"]
                s["late_compiles_per_100_rounds"] = 100 * late / max(1, s["rounds"])
            summary[f"{m} [{path}]"] = s
    for path in paths:
        base = summary[f"target-only [{path}]"]
        for m in methods:
            s = summary[f"{m} [{path}]"]
            s["speedup_same_path"] = s["tokens_per_s"] / base["tokens_per_s"]
            # Eq. 1 models decoding rounds, not prefills: compare it with the decode phase
            s["decode_speedup_same_path"] = s["decode_tokens_per_s"] / base["decode_tokens_per_s"]
            if s.get("eq1_prime"):
                s["measured_over_eq1_prime"] = s["decode_speedup_same_path"] / s["eq1_prime"]
    hf_rows = {}
    for name, h in hf_runs.items():
        tokens = sum(len(t) for t in h["tokens"])
        hf_rows[name] = {"tokens_per_s": tokens / h["seconds"], "tau": tokens / h["forwards"],
                         "mismatches": sum(t != r for t, r in zip(h["tokens"], reference))}
    hf_tps = hf_rows["hf generate"]["tokens_per_s"]
    for s in summary.values():
        s["speedup_vs_hf_generate"] = s["tokens_per_s"] / hf_tps
        s["speedup_vs_hf_assisted"] = s["tokens_per_s"] / hf_rows["hf assisted"]["tokens_per_s"]

    def f(x, fmt="{:.2f}"):
        return "-" if x is None else fmt.format(x)
    header = ["row", "tok/s", "×same path", "decode ×same path", "×HF gen", "τ", "T_p(1) ms", "k", "T_p(k) ms",
              "T_q ms", "q/round", "Eq.1'", "meas/Eq.1'", "overhead ms/round", "overhead/T_p(1)", "warm-up s", "late compiles/100 rounds", "≠ ref"]
    lines = [[k, f(s["tokens_per_s"], "{:.1f}"), f(s["speedup_same_path"]),
              f(s["decode_speedup_same_path"]),
              f(s["speedup_vs_hf_generate"]), f(s["tau"]), f(s["T_p1_ms"]), f(s["k"], "{:.1f}"),
              f(s["T_p_k_ms"]), f(s["T_q_ms"]), f(s["q_per_round"]), f(s.get("eq1_prime")),
              f(s.get("measured_over_eq1_prime")), f(s["overhead_ms_per_round"]),
              f(s.get("overhead_per_T_p1")), f(s.get("compile_warmup_s"), "{:.1f}"),
              f(s.get("late_compiles_per_100_rounds"), "{:.1f}"), str(s["mismatches"])]
             for k, s in summary.items()]
    lines += [[k, f(h["tokens_per_s"], "{:.1f}"), "-", "-", f(h["tokens_per_s"] / hf_tps), f(h["tau"]),
               *["-"] * 11, str(h["mismatches"])] for k, h in hf_rows.items()]
    print_table(f"engine fast path, {args.n} scenes, ≤{args.max_new_tokens} new tokens, greedy",
                header, lines, args.markdown)
    if args.json:
        cfg = {k: v for k, v in vars(args).items() if k != "json"}
        cfg["json"] = str(args.json)
        args.json.write_text(json.dumps({"machine": machine_info(target.device), "config": cfg,
                                         "rows": summary, "hf": hf_rows}, indent=1) + "\n")


if __name__ == "__main__":
    main()
