"""Speculative decoding against target-only on an idle and on a loaded machine (issue 34).

Five workloads, each run through the CLI users run, with ``--compare`` (every input
decoded by the method and by the target alone, one after the other in the same process,
taking turns at going first: both sides of a row's ratio see the same conditions):

- ``demo``: ``vlmspec caption examples/images/ --compare`` (the default profile);
- ``photos``: real photos, not tinyworld scenes: scikit-learn's bundled sample photos
  (china.jpg, flower.jpg, read as files from ``--photos-from``, a ``pip install --target``
  of scikit-learn; nothing of it is imported) cut into ``--photos`` crops at seeded sizes
  and places and rescaled, written into a temporary folder;
- ``bad``: the demo's draft-model chain (``method=chain``: the default drafts with the
  target's own head) with a draft whose decoder layers are redrawn at random
  (bench/benchlib.py's ``bad_draft``): τ ≈ 1, drafting never pays;
- ``video``: ``vlmspec describe-video examples/videos/ --compare`` (its default profile);
- ``control``: the demo with ``--set method=none``: target-only against target-only, an
  A/A row. Its ratio is 1 but for the machine's noise, so beside the same competitors it
  says how far from 1 a row whose method decodes (almost) nothing but plain steps (``bad``)
  may land by chance: on the 2-core CPU one request of 0.15-0.4 s varies by 7-17% idle;
- any shipped profile's name (``tinyworld-hidden``, ``tinyworld-video-eagle3``, …): its
  task's examples with ``--profile NAME`` (captions: examples/images/; video:
  examples/videos/), to compare its draft lengths.

Each workload runs idle and beside 1 and 2 CPU-bound competitor processes started here
(``--loads``). A competitor spins in Python and stops by itself after ``--competitor-s``
seconds; the bench kills each one when its row is done (in a ``finally``). Variants
(``--variants``): ``default`` (the profile as shipped), ``fixed`` and ``auto``
(``--set drafting.length=fixed|auto``), ``tree-fixed`` and ``tree-auto`` (the same with
``--set method=tree``: the tree's depth chosen per round or not). Rows take turns: workload by
workload, each load, each variant, each row beside competitors of its own; ``--interleave``:
load by load, the rows' passes taking turns beside one set of competitors (a control row
then sees the conditions of the row it controls).

``--cold``: each pass runs the command without ``--compare`` and again with ``--set
method=none``, each in a fresh process, so every request is timed as a user's run times
it, a process's first (one-time costs, and a dear draft's first rounds) included.

A row's speedup is the sum of target-only's wall times over the sum of the method's
(the records' ``compare.target_only_wall_s`` and ``stats.wall_s``), over ``--repeat``
passes of its command beside the same competitors (each pass's own ratio is kept too, with
the CPU seconds the hypervisor stole from this machine during it, /proc/stat's steal: a
request of 0.1-0.3 s beside two competitors can land on a descheduled stretch, and one
pass of six such requests swung a row by 10-20%), its τ the records' mean acceptance length; the row also says how many outputs were identical, what the
auto draft length did, the load average before and after it and its wall time.

    python bench/load.py [--rows demo,photos,bad,video] [--loads 0,1,2]
                         [--variants default] [--repeat 3] [--json bench/runs/$(date -u +%F)/load-cpu.json]
    python bench/load.py --table-from bench/runs/2026-12-07/final-load-idle.json

Prints a markdown table (and every command with its load average as it runs); ``--json``
writes the raw rows with the machine and the commands. Each row's 95% interval is a
bootstrap over its passes (benchlib.speedup_ci): what the row's passes say of where its
speedup lies, not the bar it is held to; ``--table-from`` prints an earlier run's table
with them. Beside an interleaved ``control`` row, a row's "÷ control" is its speedup over
the control's, pass i with pass i (benchlib.relative_ci): what the row reads beyond what
the same comparison reads for target-only against itself there (a bias of the comparison
divides out; both rows' noise adds up).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(Path(__file__).resolve().parent))

from benchlib import bad_draft, photo_set, relative_ci, speedup_ci, stolen_s  # noqa: E402

SPIN = "import time\nend = time.monotonic() + {s}\nx = 0\nwhile time.monotonic() < end:\n    x += 1\n"
BUILT_IN = ("demo", "photos", "bad", "video", "control")   # workloads; other names: profiles
VARIANTS = {"default": [], "fixed": ["--set", "drafting.length=fixed"],
            "auto": ["--set", "drafting.length=auto"],
            "tree-fixed": ["--set", "method=tree", "--set", "drafting.length=fixed"],
            "tree-auto": ["--set", "method=tree", "--set", "drafting.length=auto"]}


def commands(args, photos: Path | None) -> dict[str, list[str]]:
    py = [sys.executable, "-m", "vlmspec_cli"]
    rows = {}
    if "demo" in args.rows:
        rows["demo"] = py + ["caption", "examples/images/", "--compare", "--json"]
    if "photos" in args.rows:
        rows["photos"] = py + ["caption", str(photos), "--compare", "--json"]
    if "bad" in args.rows:
        rows["bad"] = py + ["caption", "examples/images/", "--compare", "--json", "--set", "method=chain",
                            "--set", f"draft.model={bad_draft(Path(args.bad_draft))}"]
    if "video" in args.rows:
        rows["video"] = py + ["describe-video", "examples/videos/", "--compare", "--json"]
    if "control" in args.rows:
        rows["control"] = py + ["caption", "examples/images/", "--compare", "--json",
                                "--set", "method=none"]
    from vlmspec_cli.profile import load_profile

    for name in [r for r in args.rows if r not in BUILT_IN]:
        video = load_profile(name).task == "video"
        rows[name] = py + (["describe-video", "examples/videos/"] if video
                           else ["caption", "examples/images/"]) + [
            "--profile", name, "--compare", "--json"]
    return rows


def competitors(n: int, seconds: float) -> list[subprocess.Popen]:
    return [subprocess.Popen([sys.executable, "-c", SPIN.format(s=seconds)]) for _ in range(n)]


def run_cli(cmd: list[str]) -> tuple[subprocess.CompletedProcess, list[dict]]:
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True,
                          env=dict(os.environ, COLUMNS="140"))
    return proc, [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]


def cold_pass(cmd: list[str], i: int) -> tuple[subprocess.CompletedProcess, list[dict]]:
    """``--cold``: the command without ``--compare`` and the same with ``--set
    method=none``, each its own process (the method's first on even passes, the target's
    on odd), every request timed as a user's run times it (the process's first included,
    no warm-up); each method record gets the ``compare`` fields from the target-only
    record of its input."""
    method = [c for c in cmd if c != "--compare"]
    sides = [("method", method), ("none", method + ["--set", "method=none"])]
    runs = dict((name, run_cli(c)) for name, c in (sides if i % 2 == 0 else sides[::-1]))
    plain = {r["input"]: r for r in runs["none"][1] if not r.get("error")}
    for r in runs["method"][1]:
        t = plain.get(r["input"])
        if t is not None and not r.get("error"):
            r["compare"] = {"target_only_wall_s": t["stats"]["wall_s"],
                            "identical": t["output"] == r["output"],
                            "speedup": round(t["stats"]["wall_s"] / r["stats"]["wall_s"], 4)}
    failed = [p for p, _ in runs.values() if p.returncode != 0]
    return (failed[0] if failed else runs["method"][0]), runs["method"][1]


def run_rows(cmds: list[list[str]], load: int, args) -> list[dict]:
    """Each command's ``--repeat`` passes beside the same ``load`` competitors, one row per
    command; several commands take turns pass by pass (``--interleave``)."""
    procs = competitors(load, args.competitor_s * len(cmds))   # (interleaved: each row's)
    passes: list[list] = [[] for _ in cmds]   # per command: (process, its records)
    stolen: list[list] = [[] for _ in cmds]   # per command: CPU seconds stolen in each pass
    try:
        if procs:
            time.sleep(2.0)   # let them take the cores before the row starts
        before = os.getloadavg()
        t0 = time.perf_counter()
        for i in range(args.repeat):
            for cmd, done, lost in zip(cmds, passes, stolen):
                if done and done[-1][0].returncode != 0:
                    continue
                s0 = stolen_s()
                done.append(cold_pass(cmd, i) if args.cold else run_cli(cmd))
                s1 = stolen_s()
                lost.append(None if s0 is None or s1 is None else round(s1 - s0, 2))
        seconds = time.perf_counter() - t0
        after = os.getloadavg()
        alive = sum(p.poll() is None for p in procs)
    finally:
        for p in procs:
            p.kill()
            p.wait()
    common = {"seconds": round(seconds, 2), "loadavg_before": [round(x, 2) for x in before],
              "loadavg_after": [round(x, 2) for x in after], "competitors": load,
              "competitors_alive_at_end": alive, "interleaved": len(cmds) > 1}
    return [dict(common, **summary(done), per_pass_stolen_cpu_s=lost)
            for done, lost in zip(passes, stolen)]


def summary(passes: list) -> dict:
    """One row's figures from its passes' processes and records."""
    proc = passes[-1][0]
    records = [r for _, recs in passes for r in recs]
    done = [r for r in records if "compare" in r]
    row = {"rc": proc.returncode, "passes": len(passes), "inputs": len(done),
           "errors": len(records) - len(done)}
    if proc.returncode != 0 or not done:
        row["stderr_tail"] = proc.stderr[-2000:]
        return row
    method_s = sum(r["stats"]["wall_s"] for r in done)
    target_s = sum(r["compare"]["target_only_wall_s"] for r in done)
    drafts = sum(r["stats"]["num_drafts"] for r in done)
    lengths = [r["stats"]["draft_length"] for r in done if "draft_length" in r["stats"]]
    row.update({
        "method": done[0].get("method"), "gamma": done[0].get("gamma"),
        "draft_length": done[0].get("draft_length"),
        "speedup": round(target_s / method_s, 4) if method_s else None,
        "method_wall_s": round(method_s, 3), "target_only_wall_s": round(target_s, 3),
        "new_tokens": sum(r["stats"]["new_tokens"] for r in done),
        "mean_acceptance_length": round(sum(r["stats"]["new_tokens"] for r in done) / drafts, 3)
        if drafts else None,
        "identical": sum(bool(r["compare"]["identical"]) for r in done),
        "per_input_speedup": [r["compare"]["speedup"] for r in done],
    })
    walls = [(sum(r["stats"]["wall_s"] for r in recs if "compare" in r),
              sum(r["compare"]["target_only_wall_s"] for r in recs if "compare" in r))
             for _, recs in passes]
    row["per_pass_speedup"] = [round(t / max(m, 1e-9), 4) for m, t in walls]
    row["per_pass_wall_s"] = [[round(m, 4), round(t, 4)] for m, t in walls]
    ci = row_ci(row)
    row["ci95"] = [round(x, 4) for x in ci] if ci else None
    if lengths:
        drafted = sum(s["rounds_drafted"] for s in lengths)
        row["auto"] = {"rounds_drafted": drafted,
                       "rounds_plain": sum(s["rounds_plain"] for s in lengths),
                       "probes": sum(s["probes"] for s in lengths),
                       "mean_gamma": round(sum(s["mean_gamma"] * s["rounds_drafted"]
                                               for s in lengths) / drafted, 2) if drafted else 0.0}
    return row


def row_ci(row: dict) -> tuple[float, float] | None:
    """The row's speedup's 95% interval over its passes (benchlib.speedup_ci), from each
    pass's method and target-only seconds; a row recorded before those were kept: from its
    passes' ratios, each pass weighing the same."""
    walls = row.get("per_pass_wall_s") or [(1.0, r) for r in row.get("per_pass_speedup") or []]
    return speedup_ci([tuple(w) for w in walls])


def machine() -> dict:
    cpu = platform.machine()
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            cpu = line.split(":", 1)[1].strip()
            break
    head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True,
                          text=True).stdout.strip()
    import torch

    return {"cpu": cpu, "cpus": os.cpu_count(), "python": platform.python_version(),
            "torch": torch.__version__, "commit": head,
            "date": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())}


def over_control(row: dict, rows: list[dict]) -> tuple[float, float, float] | None:
    """The row's speedup over the A/A control's run beside it (the same competitors and
    variant, passes interleaved), pass by pass paired (benchlib.relative_ci); None without
    such a control or per-pass wall times."""
    if row["workload"] == "control" or not row.get("interleaved"):
        return None
    for c in rows:
        if (c["workload"], c["competitors"], c["variant"]) == ("control", row["competitors"],
                                                               row["variant"]):
            if row.get("per_pass_wall_s") and c.get("per_pass_wall_s"):
                return relative_ci([tuple(w) for w in row["per_pass_wall_s"]],
                                   [tuple(w) for w in c["per_pass_wall_s"]])
    return None


def table(rows: list[dict]) -> str:
    lines = ["| workload | competitors | variant | speedup | 95% interval | passes (min-max) "
             "| ÷ control [95%] | τ | identical | auto: mean γ, rounds drafted/plain "
             "| load avg before | s |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        auto = r.get("auto")
        auto_s = (f"{auto['mean_gamma']}, {auto['rounds_drafted']}/{auto['rounds_plain']}"
                  if auto else "fixed")
        speed = f"{r['speedup']:.2f}x" if r.get("speedup") else f"failed (rc {r['rc']})"
        tau = f"{r['mean_acceptance_length']:.2f}" if r.get("mean_acceptance_length") else "-"
        passes = r.get("per_pass_speedup") or []
        spread = f"{min(passes):.2f}-{max(passes):.2f}" if passes else "-"
        ci = row_ci(r)
        interval = f"{ci[0]:.2f}-{ci[1]:.2f}" if ci else "-"
        rel = over_control(r, rows)
        paired = f"{rel[0]:.2f} [{rel[1]:.2f}-{rel[2]:.2f}]" if rel else "-"
        lines.append(f"| {r['workload']} | {r['competitors']} | {r['variant']} | {speed} | {interval} | "
                     f"{spread} | {paired} | {tau} | "
                     f"{r.get('identical', 0)}/{r['inputs']} | {auto_s} | "
                     f"{r['loadavg_before'][0]:.2f} | {r['seconds']:.0f} |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", default="demo,photos,bad,video",
                    help="workloads, comma-separated: demo, photos, bad, video, control, or a "
                         "profile's name")
    ap.add_argument("--loads", default="0,1,2", help="competitor processes per row")
    ap.add_argument("--variants", default="default", help="default, fixed, auto (comma-separated)")
    ap.add_argument("--photos", type=int, default=24, help="crops in the real-photo set")
    ap.add_argument("--photos-from", default="/tmp/sk-site/sklearn/datasets/images",
                    help="folder holding scikit-learn's china.jpg and flower.jpg")
    ap.add_argument("--bad-draft", default="/tmp/vlmspec-bad-draft")
    ap.add_argument("--competitor-s", type=float, default=240.0,
                    help="a competitor stops by itself after this many seconds (--interleave: "
                         "this many per row)")
    ap.add_argument("--repeat", type=int, default=1,
                    help="passes of each row's command (beside the same competitors); the "
                         "row's speedup is over all of them")
    ap.add_argument("--cold", action="store_true",
                    help="without --compare: the method and target-only (--set method=none) "
                         "each in its own process, every request timed, the first included")
    ap.add_argument("--interleave", action="store_true",
                    help="load by load, the rows take turns pass by pass beside the same "
                         "competitors (e.g. a row and its control)")
    ap.add_argument("--json", dest="json_out", help="write the raw rows here")
    ap.add_argument("--note", default="", help="recorded as is in the JSON (e.g. background load)")
    ap.add_argument("--table-from", metavar="JSON",
                    help="run nothing: print the table of an earlier run's --json (with the 95%% "
                         "intervals, which rows recorded before them did not print)")
    args = ap.parse_args()
    if args.table_from:
        print(table(json.loads(Path(args.table_from).read_text())["rows"]))
        return
    args.rows = args.rows.split(",")
    loads = [int(x) for x in args.loads.split(",")]
    variants = args.variants.split(",")
    unknown = set(variants) - set(VARIANTS)
    if unknown:
        ap.error(f"unknown variant(s): {', '.join(sorted(unknown))}")
    info = machine()
    info["loadavg_at_start"] = [round(x, 2) for x in os.getloadavg()]
    print(f"# {info['date']}, {info['cpu']} ({info['cpus']} CPUs), commit {info['commit']}, "
          f"load average {info['loadavg_at_start']} at start", flush=True)
    rows = []
    with tempfile.TemporaryDirectory(prefix="vlmspec-load-") as tmp:
        photos = (photo_set(Path(args.photos_from), Path(tmp) / "photos", args.photos)
                  if "photos" in args.rows else None)
        cmds = commands(args, photos)
        jobs = [(w, load, v) for w in cmds for load in loads for v in variants]
        if args.interleave:   # load by load, every row's passes taking turns
            groups = [[j for j in jobs if j[1] == load] for load in loads]
        else:                 # row by row: workload by workload, each load, each variant
            groups = [[j] for j in jobs]
        for group in groups:
            fulls = [cmds[w] + VARIANTS[v] for w, _, v in group]
            for (workload, load, variant), full, row in zip(group, fulls,
                                                            run_rows(fulls, group[0][1], args)):
                row = {"workload": workload, "variant": variant,
                       "command": shlex.join(["vlmspec"] + full[3:]), "cold": args.cold, **row}
                rows.append(row)
                print(f"[{workload}, {load} competitors, {variant}] {row['command']}\n"
                      f"    load {row['loadavg_before'][0]:.2f} -> {row['loadavg_after'][0]:.2f}, "
                      f"{row['seconds']:.1f} s, rc {row['rc']}: speedup {row.get('speedup')}, "
                      f"τ {row.get('mean_acceptance_length')}, identical "
                      f"{row.get('identical')}/{row['inputs']}, auto {row.get('auto')}, "
                      f"passes {row.get('per_pass_speedup')}, CPU s stolen per pass "
                      f"{row['per_pass_stolen_cpu_s']}", flush=True)
    print()
    print(table(rows))
    if args.json_out:
        out = {"machine": info, "command": shlex.join(["python"] + sys.argv), "note": args.note,
               "photos": {"from": args.photos_from, "crops": args.photos} if photos else None,
               "rows": rows}
        Path(args.json_out).write_text(json.dumps(out, indent=1, ensure_ascii=False) + "\n")


if __name__ == "__main__":
    main()
