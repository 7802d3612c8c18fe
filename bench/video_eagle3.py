"""describe-video: the video target's EAGLE-3 head against its hidden-state head and the chain.

The user's command, run as a user runs it: ``vlmspec describe-video VIDEOS --compare --json``
once per method and round, the methods taking turns with the order rotating each round,
on the example videos (examples/videos/) and a few fresh rendered ones (a seed no build
or other bench uses). ``--compare`` decodes every video with the target alone right after
the method, in the same process, so each record holds its own speedup; a method's
speedup here is Σ target-only wall / Σ method wall over its records (every round pooled).

    python bench/video_eagle3.py --rounds 3 --fresh 4 --out bench/video-eagle3-cpu

writes OUT.jsonl (every record as printed, with its round and row added), OUT.txt (per
run: the command, ``uptime`` before it, the CLI's summary on stderr) and OUT.md (the
table, with the machine and the load range).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
FRESH_SEED = 47_001     # not the build's samples (zoo/eagle3_build.py SEED) nor another bench's
ROWS = [("eagle3 (`qwen-video-deep-eagle3`)", ["-p", "tinyworld-video-eagle3"]),
        ("hidden (`qwen-video-deep-hidden`)", ["-p", "tinyworld-video"]),
        ("chain M (`qwen-video-draft`)", ["-p", "tinyworld-video", "-m", "chain"])]


def render_fresh(folder: Path, n: int) -> None:
    sys.path.insert(0, str(ROOT))
    from vlmspec_cli.zoo.video import world

    rng = random.Random(FRESH_SEED)
    for i in range(n):
        world.write_video(folder / f"fresh{i:02d}.mp4", world.render_script(world.random_script(rng)))


def uptime() -> str:
    return subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()


def run_one(args: list[str], inputs: list[str], log) -> tuple[list[dict], str]:
    command = [sys.executable, "-m", "vlmspec_cli", "describe-video", *inputs, *args,
               "--compare", "--json"]
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    load = uptime()
    proc = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True)
    log.write(f"$ {' '.join(command[1:])}\n{load}\n{proc.stderr}\n")
    if proc.returncode != 0:
        raise SystemExit(f"exit {proc.returncode}: {' '.join(command)}\n{proc.stderr}")
    return [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")], load


def load_average(line: str) -> float:
    return float(line.rsplit("load average:", 1)[1].split(",")[0])


def table(records: list[dict]) -> list[str]:
    runs = " / ".join(str(r) for r in sorted({x["run"] for x in records}))
    out = [f"| method | τ (MAT) | speedup run {runs} | all runs | rounds | = target |",
           "|---|---:|---|---:|---:|---:|"]
    for label, _ in ROWS:
        mine = [r for r in records if r["row"] == label]
        drafts = sum(r["stats"]["num_drafts"] for r in mine)
        mat = 1 + sum(r["stats"]["num_accepted_tokens"] for r in mine) / max(drafts, 1)

        def speedup(rs):
            return sum(r["compare"]["target_only_wall_s"] for r in rs) / sum(r["stats"]["wall_s"] for r in rs)
        runs = " / ".join(f"{speedup([r for r in mine if r['run'] == k]):.2f}x"
                          for k in sorted({r["run"] for r in mine}))
        same = sum(r["compare"]["identical"] for r in mine)
        out.append(f"| {label} | {mat:.2f} | {runs} | **{speedup(mine):.2f}x** | {drafts} | "
                   f"{same}/{len(mine)} |")
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--fresh", type=int, default=4, help="fresh rendered videos besides the examples")
    ap.add_argument("--out", type=Path, default=None,
                    help="stem of the .txt/.jsonl/.md it writes (default: "
                         "bench/runs/<today, UTC>/video-eagle3-cpu)")
    args = ap.parse_args()
    if args.out is None:
        day = time.strftime("%Y-%m-%d", time.gmtime())
        args.out = ROOT / "bench" / "runs" / day / "video-eagle3-cpu"
        args.out.parent.mkdir(parents=True, exist_ok=True)
    records, loads = [], []
    with tempfile.TemporaryDirectory(prefix="video-eagle3-") as tmp, \
            open(args.out.with_suffix(".txt"), "w") as log:
        render_fresh(Path(tmp), args.fresh)
        inputs = sorted(str(p) for p in (ROOT / "examples" / "videos").glob("*.mp4"))
        inputs += sorted(str(p) for p in Path(tmp).glob("*.mp4"))
        log.write(f"# python bench/video_eagle3.py --rounds {args.rounds} --fresh {args.fresh}  "
                  f"({platform.processor() or platform.machine()}, nproc {os.cpu_count()})\n")
        for run in range(args.rounds):
            order = ROWS[run % len(ROWS):] + ROWS[:run % len(ROWS)]
            for label, extra in order:
                log.write(f"## run {run}: {label}\n")
                got, load = run_one(extra, inputs, log)
                loads.append(load_average(load))
                for r in got:
                    r.update(run=run, row=label, input=r["input"].replace(tmp, "FRESH"),
                             source=str(r.get("source", "")).replace(tmp, "FRESH"))
                records.extend(got)
                log.flush()
        log.write(f"# after the last run\n{uptime()}\n")
    with open(args.out.with_suffix(".jsonl"), "w") as f:
        f.writelines(json.dumps(r) + "\n" for r in records)
    lines = table(records)
    note = (f"{len(inputs)} videos ({len(inputs) - args.fresh} examples, {args.fresh} fresh) x "
            f"{args.rounds} rounds; 1-min load average before each run {min(loads):.2f}-{max(loads):.2f}")
    args.out.with_suffix(".md").write_text("\n".join(lines + ["", note]) + "\n")
    print("\n".join(lines + ["", note]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
