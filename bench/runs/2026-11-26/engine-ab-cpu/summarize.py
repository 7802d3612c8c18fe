"""Summarize the before/after runs of bench/engine.py and bench/scale.py in this folder
(run by the commands in summary.txt): mean over the repeats, per row."""
import glob
import json
from statistics import mean


def rows(pattern, key):
    runs = [json.load(open(f))["rows"] for f in sorted(glob.glob(pattern))]
    if isinstance(runs[0], list):
        runs = [{r["row"]: r for r in run} for run in runs]
    return {name: [run[name][key] for run in runs if run[name].get(key) is not None]
            for name in runs[0]}


print("bench/engine.py (fast path, 1 thread, 6 scenes, 48 tokens), mean of 3 runs each, interleaved")
print(f"{'row':22} {'tok/s before':>12} {'after':>8} {'after/before':>12} "
      f"{'overhead ms/round before':>25} {'after':>6} {'decode x same path b/a':>22}")
tb, ta = rows("engine-before-*.json", "tokens_per_s"), rows("engine-after-*.json", "tokens_per_s")
ob, oa = (rows(f"engine-{s}-*.json", "overhead_ms_per_round") for s in ("before", "after"))
db, da = (rows(f"engine-{s}-*.json", "decode_speedup_same_path") for s in ("before", "after"))
for name in tb:
    o = (f"{mean(ob[name]):25.2f} {mean(oa[name]):6.2f}" if ob[name] else f"{'-':>25} {'-':>6}")
    print(f"{name:22} {mean(tb[name]):12.1f} {mean(ta[name]):8.1f} {mean(ta[name]) / mean(tb[name]):12.3f} "
          f"{o} {mean(db[name]):11.2f} / {mean(da[name]):.2f}")
print()
print("bench/scale.py (fp32, fast path, 1 thread, 16 requests, 48 tokens, B = 1 and 4), mean of 3 runs each, interleaved")
sb, sa = rows("scale-before-*.json", "tokens_per_s"), rows("scale-after-*.json", "tokens_per_s")
mb, ma = rows("scale-before-*.json", "mismatches"), rows("scale-after-*.json", "mismatches")
for name in sb:
    print(f"{name:40} {mean(sb[name]):8.1f} {mean(sa[name]):8.1f} {mean(sa[name]) / mean(sb[name]):7.3f}"
          f"   ≠ref {sum(mb[name])}/{sum(ma[name])}")
