"""Auto draft length against fixed γ, through the CLI users run (issue 34).

Runs ``vlmspec caption examples/images/ --compare`` once per configuration, the
configurations taking turns (round r starts at configuration r, so a slow minute of the
machine falls on all of them), ``--rounds`` times. Each run's speedup is its own
``--compare`` (the method and target-only decode each image one after the other, in one
process), so a busy machine shifts both sides of a ratio. Prints every command with the
summary lines it wrote, the load average before it, and a table per case: speedup
median, min and max over the rounds, and tokens/s.

Cases: ``demo`` (the default profile at fixed γ in ``--gammas`` and at
``drafting.length=auto`` with each ceiling in ``--ceilings``), ``mixed`` (the same
configurations on one conversation file mixing the demo's scenes captioned, crops of real
photos captioned (bench/benchlib.py's ``photo_set``, ``--mixed-photos`` of them, from
``--photos-from``) and the questions of examples/mmspec/ asked about their images
(``--mixed-chats`` of them), shuffled with a fixed seed: one process decodes them all, so
what it learns of one kind of input meets the next; ``vlmspec caption --chat FILE
--compare``; each run's speedup is also given per kind), ``bad`` (the default with a
draft whose decoder layers are redrawn at random, saved under ``--bad-draft``: fixed γ
and auto) and ``text`` (drafting input T on the default pair: fixed and auto).

    python bench/auto_gamma.py [--rounds 3] [--gammas 2,3,4,5,6,7,8,9,10] [--ceilings 7,10]
                               [--cases demo,mixed,bad,text] [--bad-draft /tmp/vlmspec-bad-draft]
                               [--mixed-photos 8] [--mixed-chats 8] [--json RUNS.json]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def mixed_set(args, folder: Path) -> Path:
    """The ``mixed`` case's conversation file: each line one input, its id naming its kind
    (``demo-``, ``photo-``, ``chat-``), in a seeded shuffle."""
    sys.path.insert(0, str(ROOT / "bench"))
    from benchlib import photo_set   # (it imports torch: only for the cases that use it)

    convs = [{"id": f"demo-{f.stem}", "messages": [
        {"role": "user", "text": "describe the image.", "images": [str(f)]}]}
        for f in sorted((ROOT / "examples" / "images").glob("*.png"))]
    photos = photo_set(Path(args.photos_from), folder / "photos", args.mixed_photos)
    convs += [{"id": f"photo-{f.stem}", "messages": [
        {"role": "user", "text": "describe the image.", "images": [str(f)]}]}
        for f in sorted(photos.glob("*.png"))]
    mmspec = ROOT / "examples" / "mmspec"
    lines = [json.loads(x) for x in (mmspec / "mmspec.jsonl").read_text().splitlines() if x.strip()]
    convs += [{"id": f"chat-{x['id']}", "messages": [
        {"role": "user", "text": x["turns"][0], "images": [str(mmspec / "images" / x["image"])]}]}
        for x in lines[:args.mixed_chats]]
    random.Random(34).shuffle(convs)
    out = folder / "mixed.jsonl"
    out.write_text("".join(json.dumps(c) + "\n" for c in convs))
    return out


def configs(args, folder: Path) -> dict[str, dict[str, list[str]]]:
    gammas = [int(g) for g in args.gammas.split(",")]
    ceilings = [int(g) for g in args.ceilings.split(",")]
    cases = {}
    fixed = lambda g: ["--set", f"drafting.gamma={g}", "--set", "drafting.length=fixed"]  # noqa: E731
    auto = lambda g: ["--set", f"drafting.gamma={g}", "--set", "drafting.length=auto"]   # noqa: E731
    if "demo" in args.cases:
        cases["demo"] = {f"γ={g}": fixed(g) for g in gammas} | {f"auto ≤{c}": auto(c) for c in ceilings}
    if "mixed" in args.cases:
        chat = ["--chat", str(mixed_set(args, folder))]
        cases["mixed"] = ({f"γ={g}": chat + fixed(g) for g in gammas}
                          | {f"auto ≤{c}": chat + auto(c) for c in ceilings})
    if "bad" in args.cases:
        from benchlib import bad_draft

        draft = ["--set", f"draft.model={bad_draft(Path(args.bad_draft))}"]
        cases["bad"] = {"γ=7": draft + fixed(7), "γ=1": draft + fixed(1),
                        **{f"auto ≤{c}": draft + auto(c) for c in ceilings}}
    if "text" in args.cases:
        text = ["--set", "drafting.inputs=[text]"]
        cases["text"] = {"γ=7": text + fixed(7), "γ=3": text + fixed(3),
                         **{f"auto ≤{c}": text + auto(c) for c in ceilings}}
    return cases


SUMMARY = re.compile(r"│\s*(speedup vs target-only|tokens/s|mean acceptance length|draft length \(auto\)|method)"
                     r"\s*│\s*(.*?)\s*│")


def by_kind(stdout: str) -> dict[str, float]:
    """Speedup per kind of input (a conversation id's prefix before "-"): target-only's
    wall times over the method's, summed over the kind's records."""
    sums: dict[str, list[float]] = {}
    for line in stdout.splitlines():
        if not line.startswith("{"):
            continue
        record = json.loads(line)
        if "compare" not in record or "#" not in record["input"]:
            continue
        kind = record["input"].rsplit("#", 1)[1].split("-", 1)[0]
        total = sums.setdefault(kind, [0.0, 0.0])
        total[0] += record["compare"]["target_only_wall_s"]
        total[1] += record["stats"]["wall_s"]
    return {kind: round(t / m, 4) for kind, (t, m) in sorted(sums.items()) if m > 0}


def run(cmd: list[str]) -> dict:
    env = dict(os.environ, COLUMNS="140")
    load = os.getloadavg()
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True)
    seconds = time.perf_counter() - t0
    found = dict(SUMMARY.findall(proc.stderr))
    identical = all('"identical": true' in line for line in proc.stdout.splitlines() if line.strip())
    return {"load": load, "load_after": os.getloadavg(), "seconds": seconds, "rc": proc.returncode,
            "summary": found, "identical": identical, "by_kind": by_kind(proc.stdout),
            "speedup": float(found["speedup vs target-only"].split("x")[0]) if proc.returncode == 0 else None,
            "tokens_per_s": float(found.get("tokens/s", "nan"))}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--gammas", default="2,3,4,5,6,7,8,9,10")
    ap.add_argument("--ceilings", default="7,10")
    ap.add_argument("--cases", default="demo,bad,text")
    ap.add_argument("--bad-draft", default="/tmp/vlmspec-bad-draft")
    ap.add_argument("--mixed-photos", type=int, default=8, help="photo crops in the mixed set")
    ap.add_argument("--mixed-chats", type=int, default=8, help="examples/mmspec questions in the mixed set")
    ap.add_argument("--photos-from", default="/tmp/sk-site/sklearn/datasets/images",
                    help="folder holding scikit-learn's china.jpg and flower.jpg (bench/load.py)")
    ap.add_argument("--json", dest="json_out", help="write every run (command, load, summary) here")
    args = ap.parse_args()
    raw = {"command": " ".join(["python"] + sys.argv), "cpus": os.cpu_count(),
           "date": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
           "loadavg_at_start": os.getloadavg(), "runs": []}
    base = [sys.executable, "-m", "vlmspec_cli", "caption", "--compare", "--json"]
    print(f"# {time.strftime('%Y-%m-%d %H:%M:%S %Z')}, {os.cpu_count()} CPUs, "
          f"load average {' '.join(f'{x:.2f}' for x in os.getloadavg())} before the first run")
    print(f"# each: {' '.join(base[2:])} [--set ...]   (stdout: JSON records; stderr: the summary)")
    folder = Path(tempfile.mkdtemp(prefix="vlmspec-auto-gamma-"))   # the mixed set's files
    try:
        cases = configs(args, folder)
        run_cases(args, cases, base, raw)
    finally:
        shutil.rmtree(folder)
    if args.json_out:
        Path(args.json_out).write_text(json.dumps(raw, indent=1, ensure_ascii=False) + "\n")


def run_cases(args, cases: dict, base: list[str], raw: dict) -> None:
    images = ["examples/images/"]
    for case, table in cases.items():
        names = list(table)
        results: dict[str, list[dict]] = {n: [] for n in names}
        for r in range(args.rounds):
            for name in names[r % len(names):] + names[:r % len(names)]:
                inputs = [] if "--chat" in table[name] else images
                res = run(base + inputs + table[name])
                results[name].append(res)
                raw["runs"].append({"case": case, "round": r + 1, "config": name,
                                    "args": table[name], **res})
                s = res["summary"]
                kinds = ", ".join(f"{k} {v:.2f}x" for k, v in res["by_kind"].items())
                print(f"[{case} round {r + 1}] vlmspec caption {' '.join(inputs + table[name])} "
                      f"--compare\n    load {res['load'][0]:.2f}, {res['seconds']:.1f} s, "
                      f"rc {res['rc']}, identical {res['identical']}: speedup {s.get('speedup vs target-only')}, "
                      f"{s.get('tokens/s')} tok/s, τ {s.get('mean acceptance length')}"
                      + (f", {s['draft length (auto)']}" if "draft length (auto)" in s else "")
                      + (f"; by kind: {kinds}" if kinds else ""), flush=True)
        print(f"\n## {case}: speedup vs target-only over {args.rounds} rounds (median, min, max), tok/s median")
        kinds = sorted({k for runs in results.values() for x in runs for k in x["by_kind"]})
        print("| config | median | min | max | tok/s | outputs identical |"
              + "".join(f" {k} (median) |" for k in kinds))
        print("|---|---|---|---|---|---|" + "---|" * len(kinds))
        for name in names:
            sp = [x["speedup"] for x in results[name] if x["speedup"] is not None]
            tps = [x["tokens_per_s"] for x in results[name] if x["rc"] == 0]
            per = [statistics.median(x["by_kind"][k] for x in results[name] if k in x["by_kind"])
                   for k in kinds]
            print(f"| {name} | {statistics.median(sp):.2f}x | {min(sp):.2f}x | {max(sp):.2f}x | "
                  f"{statistics.median(tps):.0f} | {all(x['identical'] for x in results[name])} |"
                  + "".join(f" {v:.2f}x |" for v in per))
        print(flush=True)


if __name__ == "__main__":
    main()
