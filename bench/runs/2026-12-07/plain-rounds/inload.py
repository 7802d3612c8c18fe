"""One process, one profile's useless models (bench/useless_drafts.py --models), beside
SPIN busy Python processes: the method and target-only decode the six demo scenes in
turns (who goes first alternates by input and pass), after one untimed 8-token decode
each; per pass the sum of each side's walls. Prints and writes (OUT) the passes' walls,
the median pass ratio and the sum ratio (target-only ÷ method). Run from the checkout's
root with PYTHONPATH at it:

    python inload.py ROW PASSES SPIN OUT.json
"""
import json
import os
import statistics
import subprocess
import sys
import time

from PIL import Image

from vlmspec_cli.cli.common import load_profile
from vlmspec_cli.runtime.request import Message, Request
from vlmspec_cli.session import build_session

row, passes, spin, out = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
models = f"/tmp/useless-models/{row}"
head = os.path.exists(f"{models}/eagle3-head")
sets = [f"target.model={models}/target",
        f"eagle3.model={models}/eagle3-head" if head else f"draft.model={models}/draft"]
session = build_session(load_profile(row, tuple(sets), {}))
images = [Image.open(f"examples/images/scene{i}.png").convert("RGB") for i in range(1, 7)]
SPIN = "import time\nend = time.monotonic() + 1800\nx = 0\nwhile time.monotonic() < end:\n    x += 1\n"


def request(image, n=128):
    return Request([Message("user", "Describe the image in detail.", images=(image,))],
                   max_new_tokens=n)


procs = [subprocess.Popen([sys.executable, "-c", SPIN]) for _ in range(spin)]
time.sleep(0.5 if spin else 0)
method, base = session.engine, session.baseline_engine()
method.generate(request(images[0], 8))
base.generate(request(images[0], 8))
walls, probes, identical = [], 0, 0
try:
    for p in range(passes):
        wm = wb = 0.0
        for i, image in enumerate(images):
            sides = [(method, "m"), (base, "b")]
            tokens = {}
            for engine, side in (sides if (i + p) % 2 == 0 else sides[::-1]):
                res = engine.generate(request(image))
                tokens[side] = res.tokens
                if side == "m":
                    wm += res.state.stats.wall_s
                    probes += (res.state.stats.draft_length or {}).get("probes", 0)
                else:
                    wb += res.state.stats.wall_s
            identical += tokens["m"] == tokens["b"]
        walls.append((wm, wb))
finally:
    for q in procs:
        q.kill()
ratios = [b / m for m, b in walls]
result = {
    "row": row, "passes": passes, "spinners": spin, "walls_method_target_only": walls,
    "median_pass_ratio": round(statistics.median(ratios), 4),
    "sum_ratio": round(sum(b for _, b in walls) / sum(m for m, _ in walls), 4),
    "probes": probes, "identical": f"{identical}/{passes * len(images)}",
    "commit": subprocess.run(["git", "log", "-1", "--format=%h"], capture_output=True,
                             text=True).stdout.strip(),
    "uptime": subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip(),
}
print(json.dumps({k: v for k, v in result.items() if k != "walls_method_target_only"}))
with open(out, "w") as f:
    json.dump(result, f, indent=1)
