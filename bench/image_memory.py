"""Peak memory of one image input, whatever its dimensions (issue 35's bound).

Writes small PNGs of hostile shapes (a 178-byte 100,000 × 1 strip, a 12,000 × 12,000 grey
square, the largest and the most elongated images vlmspec accepts) and an ordinary
photo-sized one, captions each with `vlmspec caption IMAGE --json` in its own process, and
reads that process's peak resident memory (getrusage of the child). Reported per image:
the file's size, the peak, the exit code and the first stderr line (a refusal's reason).

  python bench/image_memory.py --json bench/runs/$(date -u +%F)/image-memory-cpu.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from PIL import Image

ROOT = Path(__file__).resolve().parents[1]
SHAPES = [  # name, (width, height), mode
    ("ordinary 640x480", (640, 480), "RGB"),
    ("strip 100000x1", (100_000, 1), "L"),
    ("strip 1x100000", (1, 100_000), "L"),
    ("strip 400000x1", (400_000, 1), "L"),
    ("grey 12000x12000", (12_000, 12_000), "L"),
    ("largest accepted 8192x8192", (8192, 8192), "RGB"),
    ("most elongated accepted 8000x160", (8000, 160), "RGB"),
]


def run_one(path: Path, env: dict) -> dict:
    """Caption ``path`` in a fresh process, started by a small wrapper process that
    reports getrusage(RUSAGE_CHILDREN) after it: the peak resident memory of that one
    caption process alone."""
    wrapper = ("import resource, subprocess, sys, json; "
               "p = subprocess.run(sys.argv[1:], capture_output=True, text=True); "
               "r = resource.getrusage(resource.RUSAGE_CHILDREN); "
               "print(json.dumps({'rc': p.returncode, 'peak_kib': r.ru_maxrss, "
               "'stderr': p.stderr, 'stdout': p.stdout}))")
    cmd = [sys.executable, "-c", wrapper, sys.executable, "-m", "vlmspec_cli", "caption", str(path),
           "--max-new-tokens", "8", "--json", "-q"]
    t0 = time.perf_counter()
    res = json.loads(subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=900).stdout)
    lines = [ln for ln in res["stderr"].splitlines() if ln.strip() and "Warning" not in ln
             and not ln.startswith("  ")]
    record = json.loads(res["stdout"].splitlines()[0]) if res["stdout"].strip() else {}
    return {"rc": res["rc"], "seconds": round(time.perf_counter() - t0, 2),
            "peak_mib": round(res["peak_kib"] / 1024, 1), "stderr": lines[0] if lines else "",
            "error": record.get("error"), "output": record.get("output")}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--json", type=Path, help="write the rows here")
    args = ap.parse_args()
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for name, size, mode in SHAPES:
            path = Path(tmp) / (name.split()[0] + f"-{size[0]}x{size[1]}.png")
            colour = 128 if mode == "L" else (200, 30, 30)
            Image.new(mode, size, colour).save(path, optimize=True)
            row = {"image": name, "file_bytes": path.stat().st_size, **run_one(path, env)}
            rows.append(row)
            print(f"{name:36s} {row['file_bytes']:>9,d} B  peak {row['peak_mib']:8.1f} MiB  "
                  f"exit {row['rc']}  {row['error'] or row['stderr'] or row['output']}", flush=True)
    machine = {"cpu": platform.processor() or platform.machine(), "cores": os.cpu_count(),
               "python": platform.python_version(), "date": time.strftime("%Y-%m-%d"),
               "command": "python bench/image_memory.py" + (f" --json {args.json}" if args.json else "")}
    if args.json:
        args.json.write_text(json.dumps({"machine": machine, "rows": rows}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
