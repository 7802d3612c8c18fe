"""What the bench scripts share: the machine a run was on, the CPU time the hypervisor took
from it, a median step time, a speedup's confidence interval over passes, plain/markdown
tables, and the workloads several of them build (photo crops, a draft redrawn at random).
(They run as scripts, so this directory is on sys.path.)"""

from __future__ import annotations

import os
import platform
import random
import statistics
import sys
import time
from pathlib import Path

import torch
import transformers


def machine_info(device: torch.device) -> dict:
    if device.type == "cuda":
        hw = torch.cuda.get_device_name(device)
    else:
        hw = platform.processor() or platform.machine()
        try:
            for line in Path("/proc/cpuinfo").read_text().splitlines():
                if line.startswith("model name"):
                    hw = line.split(":", 1)[1].strip()
                    break
        except OSError:
            pass
        hw = f"{hw} ({os.cpu_count()} CPUs)"
    return {"device": str(device), "hardware": hw, "torch": torch.__version__,
            "transformers": transformers.__version__, "threads": torch.get_num_threads(),
            "python": platform.python_version()}


def stolen_s() -> float | None:
    """CPU seconds the hypervisor has given to other guests while this machine's CPUs
    wanted to run (the ``steal`` column of /proc/stat, all CPUs); None where not read.
    A pass that lost a second to it was timed on a machine slower than the one before."""
    try:
        fields = Path("/proc/stat").read_text().split("\n", 1)[0].split()
        return int(fields[8]) / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError):
        return None


def speedup_ci(passes: list[tuple[float, float]], level: float = 0.95, resamples: int = 4000,
               seed: int = 0) -> tuple[float, float] | None:
    """A percentile-bootstrap interval for a speedup over passes: ``passes`` holds each
    pass's (method seconds, target-only seconds); the speedup is Σ target / Σ method, and
    the interval is that ratio's ``level`` central range over ``resamples`` draws of as many
    passes, with replacement (a pass, one process, is the unit: the auto draft length's
    state is a process's, and the machine's swings last seconds). None under two passes.
    Seeded: the same passes give the same interval. With few passes a bootstrap's interval
    is narrower than the truth; an A/A row beside it says the machine's noise directly."""
    if len(passes) < 2:
        return None
    rng = random.Random(seed)
    ratios = []
    for _ in range(resamples):
        draw = [passes[rng.randrange(len(passes))] for _ in passes]
        ratios.append(sum(t for _, t in draw) / max(sum(m for m, _ in draw), 1e-12))
    ratios.sort()
    tail = (1.0 - level) / 2
    return ratios[int(tail * (resamples - 1))], ratios[int((1.0 - tail) * (resamples - 1))]


def relative_ci(passes: list[tuple[float, float]], control: list[tuple[float, float]],
                level: float = 0.95, resamples: int = 4000,
                seed: int = 0) -> tuple[float, float, float] | None:
    """A row's speedup over its A/A control's (pass i of each ran in turn beside the same
    competitors, ``--interleave``): (the ratio, and its ``level`` interval over
    ``resamples`` draws of pass indices with replacement, each draw taking both rows' pass
    i). Each side's speedup is Σ target / Σ method over the drawn passes, as
    ``speedup_ci``'s. What the row reads beyond what the same comparison reads for
    target-only decoding against itself in the same stretch of the machine: a bias of the
    comparison (its order, a load's phase) divides out, the two rows' noise adds up (the
    interval is wider than the row's own). None under two pairs."""
    n = min(len(passes), len(control))
    if n < 2:
        return None

    def ratio(idx: list[int]) -> float:
        own = sum(passes[i][1] for i in idx) / max(sum(passes[i][0] for i in idx), 1e-12)
        base = sum(control[i][1] for i in idx) / max(sum(control[i][0] for i in idx), 1e-12)
        return own / max(base, 1e-12)

    rng = random.Random(seed)
    draws = sorted(ratio([rng.randrange(n) for _ in range(n)]) for _ in range(resamples))
    tail = (1.0 - level) / 2
    return (ratio(list(range(n))), draws[int(tail * (resamples - 1))],
            draws[int((1.0 - tail) * (resamples - 1))])


def print_table(title: str, header: list[str], lines: list[list[str]], markdown: bool) -> None:
    print(title)
    if markdown:
        print("| " + " | ".join(header) + " |")
        print("|" + "---|" * len(header))
        for cells in lines:
            print("| " + " | ".join(cells) + " |")
    else:
        widths = [max(len(str(r[i])) for r in [header] + lines) for i in range(len(header))]
        for cells in [header] + lines:
            print("  ".join(c.ljust(w) if i == 0 else c.rjust(w)
                            for i, (c, w) in enumerate(zip(cells, widths))))
    print()


def sync(device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def timed(fn, device, repeats: int = 30, warmup: int = 10) -> float:
    """Median milliseconds of ``fn()`` after ``warmup`` untimed calls (the first calls after
    a long prefill ran up to 1.8x slower: allocator and caches, not the step's own work)."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        sync(device)
        t0 = time.perf_counter()
        fn()
        sync(device)
        times.append(time.perf_counter() - t0)
    return 1000 * statistics.median(times)


THREADS_HELP = ("CPU threads for prefill and rounds alike (default: the profile's "
                "runtime.threads / runtime.prefill_threads plan, as the CLI runs it)")


def thread_plan_for(threads: int | None, profile):
    """The ThreadPlan every engine of a bench runs under: ``--threads`` for both phases, or
    the profile's own (runtime/threads.py); sets the process's count to the rounds' one."""
    from vlmspec_cli.runtime.threads import ThreadPlan
    from vlmspec_cli.session import thread_plan

    plan = ThreadPlan(threads, threads) if threads else thread_plan(profile)
    plan.enter("decode")
    return plan


def with_plan(machine: dict, plan) -> dict:
    """machine_info with the thread plan the run used instead of the count at its end."""
    return dict(machine, threads=plan.describe() or machine["threads"])


# ---------------------------------------------------------------------------- workloads
ROOT = Path(__file__).resolve().parent.parent


def bad_draft(path: Path) -> Path:
    """The default's draft with its decoder layers drawn at random (seed 1234)."""
    sys.path.insert(0, str(ROOT))
    from vlmspec_cli.zoo.scrambled import scrambled_draft

    return scrambled_draft(path, "llava-deep-draft", seed=1234)


def photo_set(src: Path, out: Path, n: int, seed: int = 34) -> Path:
    """``n`` crops of the sample photos: squares and 4:3 boxes of 25-100% of the shorter
    side at seeded places, rescaled to 96-448 px wide (the adapter resizes them again)."""
    from PIL import Image

    photos = [Image.open(src / name).convert("RGB") for name in ("china.jpg", "flower.jpg")]
    rng = random.Random(seed)
    out.mkdir(parents=True, exist_ok=True)
    for i in range(n):
        im = photos[i % len(photos)]
        w, h = im.size
        side = int(min(w, h) * rng.uniform(0.25, 1.0))
        bw, bh = (side, side) if rng.random() < 0.5 else (min(w, side * 4 // 3), side)
        x, y = rng.randrange(0, w - bw + 1), rng.randrange(0, h - bh + 1)
        width = rng.choice((96, 160, 224, 320, 448))
        crop = im.crop((x, y, x + bw, y + bh)).resize((width, max(1, width * bh // bw)))
        crop.save(out / f"photo{i:02d}.png")
    return out
