"""Issue 18's speed targets in one run: the five benches one after the other on this
machine, each writing its raw JSON and printed output into one folder, then one table of
every target against what that run measured.

    python bench/targets.py --out bench/runs/$(date -u +%F)/targets-cpu [--quick] [--force]
    python bench/targets.py --out bench/runs/2026-11-24/targets-cpu --summary-only   # re-read a finished run

The benches and their arguments are the ones bench/history/RESULTS-until-2026-12-07.md records (``COMMANDS``);
``--quick`` shrinks every sample to check the pipeline, not to measure. Each target is read
from the bench that measures it:

- chain ≥ 1.8x and best lossless caption method ≥ 2.2x: bench/caption.py (chain M, the
  hidden-state head profile, HF assisted generation) and bench/twig.py (the twig);
- TABED MT* ≥ chain M in wall time on the 2nd-turn and text-task columns: bench/tabed.py;
- ADT-Tree ≥ 2x: bench/image_gen.py;
- hidden head on video ≥ 2x decode speedup, per length, and its draft step within 1.1x of
  its 4-frame step at ≥ 8k video tokens: bench/video.py.

Every speedup is against vlmspec target-only decoding measured in the same bench process,
and every row must equal target-only (the benches count mismatches). Every engine runs
its profile's CPU thread plan (runtime.threads while decoding, runtime.prefill_threads
while prefilling), as the CLI runs it."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
DEEP = ["--target", "zoo:tinyworld/llava-target-deep", "--twig", "zoo:tinyworld/llava-deep-twig",
        "--layer-skip", "2,4,8"]
COMMANDS = {  # name -> (script, arguments, arguments with --quick)
    "caption": ("caption.py", ["--n", "20"], ["--n", "2", "--max-new-tokens", "8"]),
    "tabed": ("tabed.py", ["--n", "20", "--markdown"],
              ["--n", "1", "--max-new-tokens", "8", "--markdown"]),
    "twig": ("twig.py", [*DEEP, "--n", "20", "--markdown"],
             [*DEEP, "--n", "2", "--max-new-tokens", "8", "--latency-repeats", "2", "--markdown"]),
    "image_gen": ("image_gen.py", ["--n", "12", "--markdown"], ["--n", "1", "--markdown"]),
    "video": ("video.py", ["--n", "3", "--frames", "4,16,64,1024", "--markdown"],
              ["--n", "1", "--frames", "4,16", "--markdown"]),
}


def run_benches(out: Path, quick: bool, only: list[str]) -> dict:
    """Each bench as its own process (as a user runs it); stdout+stderr to NAME.txt."""
    times = {}
    for name in only:
        script, args, quick_args = COMMANDS[name]
        cmd = [sys.executable, str(HERE / script), *(quick_args if quick else args),
               "--json", str(out / f"{name}.json")]
        shown = " ".join([f"bench/{script}", *cmd[2:]])   # as run from the repository root
        print(f"[{time.strftime('%H:%M:%S')}] {shown}", flush=True)
        t0 = time.perf_counter()
        with open(out / f"{name}.txt", "w") as log:
            log.write(f"$ python {shown}\n")
            log.flush()
            rc = subprocess.call(cmd, stdout=log, stderr=subprocess.STDOUT)
        times[name] = round(time.perf_counter() - t0, 1)
        if rc != 0:
            sys.exit(f"bench/targets.py: {script} exited {rc}; see {out / (name + '.txt')}")
    return times


def _load(out: Path, name: str) -> dict | None:
    path = out / f"{name}.json"
    return json.loads(path.read_text()) if path.exists() else None


def caption_targets(cap: dict | None, twig: dict | None) -> list[dict]:
    if cap is None:
        return []
    rows = cap["methods"]
    chain = rows["vlmspec chain (M)"]
    lossless = {name: r["speedup"] for name, r in rows.items()
                if name.startswith("vlmspec") and r["mismatches"] == 0}
    if twig is not None:
        for name, r in twig["rows"].items():
            if name.startswith(("twig", "variant")) and r["mismatches"] == 0:
                lossless[f"bench/twig.py {name}"] = r["rel_spd"]
    best = max(lossless, key=lossless.get)
    return [
        {"target": "chain ≥ 1.8x over target-only", "value": chain["speedup"], "goal": 1.8,
         "detail": f"chain M, τ {chain['tau']:.2f}, {chain['mismatches']} ≠ generate()"},
        {"target": "best lossless caption method ≥ 2.2x", "value": lossless[best], "goal": 2.2,
         "detail": best},
    ]


def tabed_targets(tab: dict | None) -> list[dict]:
    if tab is None:
        return []
    rows = tab["rows"]
    out = []
    for column in ("2nd turn", "text task"):
        mt, m = rows["MT*"][column], rows["M"][column]
        out.append({"target": f"TABED MT* ≥ chain M, {column}", "value": mt["speedup"],
                    "goal": m["speedup"],
                    "detail": f"MT* {mt['speedup']:.2f}x τ {mt['tau']:.2f} vs M {m['speedup']:.2f}x "
                              f"τ {m['tau']:.2f}"})
    return out


def image_targets(img: dict | None) -> list[dict]:
    if img is None:
        return []
    rows = {r["label"]: r for r in img["rows"]}
    base = rows["vlmspec target-only"]["wall_s"]
    adt = rows["ADT-Tree (horizontal)"]
    return [{"target": "ADT-Tree ≥ 2x", "value": base / adt["wall_s"], "goal": 2.0,
             "detail": f"τ {adt['tau']:.2f}, {adt['differ']} ≠ target-only"}]


def video_targets(vid: dict | None) -> list[dict]:
    if vid is None:
        return []
    head = [r for r in vid["rows"] if r["method"].startswith("hidden-state")]
    out = [{"target": f"hidden head on video ≥ 2x decode speedup, {r['visual_tokens']} video tokens",
            "value": r["dsr"], "goal": 2.0,
            "detail": f"{r['frames']} frames, τ {r['tau']:.2f}, {r['differ']} ≠ target-only"}
           for r in head]
    longest = max(head, key=lambda r: r["visual_tokens"])
    if longest["visual_tokens"] >= 8000:
        out.append({"target": "head's draft step ≤ 1.1x its 4-frame step at ≥ 8k video tokens",
                    "value": longest["step_vs_first"], "goal": 1.1, "lower_is_better": True,
                    "detail": f"{longest['step_ms']:.3f} ms at {longest['visual_tokens']} tokens"})
    return out


def summarize(out: Path) -> list[dict]:
    rows = (caption_targets(_load(out, "caption"), _load(out, "twig"))
            + tabed_targets(_load(out, "tabed")) + image_targets(_load(out, "image_gen"))
            + video_targets(_load(out, "video")))
    for r in rows:
        r["met"] = r["value"] <= r["goal"] if r.get("lower_is_better") else r["value"] >= r["goal"]
    return rows


def print_summary(rows: list[dict]) -> None:
    print("| target (issue 18 item 4) | measured | goal | met | detail |")
    print("|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['target']} | {r['value']:.2f}{'' if r.get('lower_is_better') else 'x'} | "
              f"{r['goal']:.2f} | {'yes' if r['met'] else '**no**'} | {r['detail']} |")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True, help="folder for every bench's JSON and output")
    ap.add_argument("--only", default=",".join(COMMANDS), help="benches to run (comma-separated)")
    ap.add_argument("--quick", action="store_true", help="tiny samples: checks the pipeline only")
    ap.add_argument("--summary-only", action="store_true", help="re-read a finished run")
    ap.add_argument("--force", action="store_true", help="reuse an existing, non-empty --out")
    args = ap.parse_args()
    out = Path(args.out)
    if not args.summary_only:
        if out.exists() and any(out.iterdir()) and not args.force:
            sys.exit(f"bench/targets.py: {out} is not empty (--force reuses it)")
        out.mkdir(parents=True, exist_ok=True)
        only = [n for n in args.only.split(",") if n]
        unknown = sorted(set(only) - set(COMMANDS))
        if unknown:
            sys.exit(f"bench/targets.py: unknown bench {unknown[0]} (choose from {', '.join(COMMANDS)})")
        times = run_benches(out, args.quick, only)
        (out / "times.json").write_text(json.dumps(times, indent=2))
    rows = summarize(out)
    (out / "targets.json").write_text(json.dumps(rows, indent=2, ensure_ascii=False))
    print_summary(rows)


if __name__ == "__main__":
    main()
