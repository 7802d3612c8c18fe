"""Two (or more) hidden-state heads for the default caption target, compared in one run on
three workloads (issue 60, item 7):

- ``demo``: ``vlmspec caption examples/images/ -m hidden --compare --json``;
- ``photos``: the same over crops of real photos (benchlib.photo_set: china.jpg and
  flower.jpg, never in any head's training data);
- ``mmspec``: ``vlmspec bench examples/mmspec/mmspec.jsonl --methods none,hidden``
  (multi-turn questions of MMSpec's six topics; drawn with mmspec_sample.SEED, which no
  training set uses).

Every command gets ``--set hidden.model=HEAD`` (bench also ``--set method=hidden``); the heads take turns (the order reversed
every round, so load drifting during the run favours none). Raw outputs (stdout JSONL,
stderr) go to ``--out-dir`` with the commands and ``uptime`` before each; the table
(acceptance length τ = tokens per verification round, speedup = target-only wall time over
the head's, summed, and outputs identical to target-only) is printed and written to
``summary.txt``.

    python bench/head_compare.py --heads old=zoo:tinyworld/llava-deep-hidden,new=/tmp/h \\
        --out-dir bench/runs/$(date -u +%F)/broad-head --rounds 2
"""

from __future__ import annotations

import argparse
import json
import shlex
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from benchlib import photo_set  # noqa: E402


def commands(photos: Path, head: str) -> dict[str, list[str]]:
    cli = [sys.executable, "-m", "vlmspec_cli"]
    use = ["--set", f"hidden.model={head}"]
    return {"demo": cli + ["caption", "examples/images/", "-m", "hidden", "--compare", "--json"] + use,
            "photos": cli + ["caption", str(photos), "-m", "hidden", "--compare", "--json"] + use,
            # method=hidden: with the profile's own method (chain) bench would give the hidden
            # method the head shipped for the target, whatever hidden.model says
            "mmspec": cli + ["bench", "examples/mmspec/mmspec.jsonl", "--methods", "none,hidden",
                             "--json", "--set", "method=hidden"] + use}


def caption_row(records: list[dict]) -> dict:
    done = [r for r in records if "compare" in r]
    tokens = sum(r["stats"]["new_tokens"] for r in done)
    return {"inputs": len(done), "tokens": tokens,
            "tau": tokens / max(1, sum(r["stats"]["num_drafts"] for r in done)),
            "method_s": sum(r["stats"]["wall_s"] for r in done),
            "target_s": sum(r["compare"]["target_only_wall_s"] for r in done),
            "identical": sum(bool(r["compare"]["identical"]) for r in done)}


def bench_row(records: list[dict]) -> dict:
    by = {(r["sample"], r["method"]): r for r in records if r.get("sample") and not r.get("error")}
    pairs = [(by[(s, "none")], r) for (s, m), r in by.items() if m == "hidden" and (s, "none") in by]
    same = lambda a, b: [t["tokens_sha256"] for t in a["turns"]] == [t["tokens_sha256"]  # noqa: E731
                                                                      for t in b["turns"]]
    tokens = sum(h["stats"]["new_tokens"] for _, h in pairs)
    return {"inputs": len(pairs), "tokens": tokens,
            "tau": tokens / max(1, sum(h["stats"]["num_drafts"] for _, h in pairs)),
            "method_s": sum(h["wall_s"] for _, h in pairs),
            "target_s": sum(n["wall_s"] for n, _ in pairs),
            "identical": sum(same(n, h) for n, h in pairs)}


def run_one(cmd: list[str], out: Path, log) -> list[dict]:
    up = subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()
    log(f"$ {shlex.join(cmd[2:])}   # {up}")
    proc = subprocess.run(cmd, capture_output=True, text=True)
    out.with_suffix(".jsonl").write_text(proc.stdout)
    out.with_suffix(".err").write_text(proc.stderr)
    log(f"  rc {proc.returncode}")
    return [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]


def merge(rows: list[dict]) -> dict:
    total = {k: sum(r[k] for r in rows) for k in ("inputs", "tokens", "method_s", "target_s",
                                                  "identical")}
    drafts = sum(r["tokens"] / r["tau"] for r in rows if r["tau"])
    total["tau"] = total["tokens"] / drafts if drafts else 0.0
    total["speedup"] = total["target_s"] / total["method_s"] if total["method_s"] else 0.0
    total["per_round_speedup"] = [round(r["target_s"] / r["method_s"], 3) for r in rows]
    total["per_round_tau"] = [round(r["tau"], 3) for r in rows]
    return total


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--heads", required=True, help="NAME=HEAD,... (zoo id or folder)")
    ap.add_argument("--out-dir", required=True, type=Path)
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--photos", type=int, default=24)
    ap.add_argument("--photos-from", default="/tmp/sk-site/sklearn/datasets/images")
    ap.add_argument("--workloads", default="demo,photos,mmspec")
    args = ap.parse_args()
    heads = dict(item.split("=", 1) for item in args.heads.split(","))
    wanted = args.workloads.split(",")
    args.out_dir.mkdir(parents=True, exist_ok=True)
    lines: list[str] = []

    def log(text: str) -> None:
        print(text, flush=True)
        lines.append(text)

    rows: dict[tuple[str, str], list[dict]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        photos = photo_set(Path(args.photos_from), Path(tmp) / "photos", args.photos)
        for rnd in range(args.rounds):
            order = list(heads) if rnd % 2 == 0 else list(heads)[::-1]
            for name in order:
                for work, cmd in commands(photos, heads[name]).items():
                    if work not in wanted:
                        continue
                    recs = run_one(cmd, args.out_dir / f"{work}-{name}-r{rnd}", log)
                    row = (bench_row if work == "mmspec" else caption_row)(recs)
                    rows.setdefault((work, name), []).append(row)
    log("\n| workload | head | inputs | τ | speedup | per round | identical |")
    log("|---|---|---|---|---|---|---|")
    for (work, name), got in sorted(rows.items()):
        m = merge(got)
        log(f"| {work} | {name} | {m['inputs']} | {m['tau']:.2f} | {m['speedup']:.2f}x | "
            f"{', '.join(f'{s:.2f}x' for s in m['per_round_speedup'])} (τ "
            f"{', '.join(f'{t:.2f}' for t in m['per_round_tau'])}) | {m['identical']}/{m['inputs']} |")
    (args.out_dir / "summary.txt").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
