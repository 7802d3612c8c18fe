"""The tinyworld EAGLE-3 head, trained the way a user trains one for their own target.

Renders ``--images`` fresh tinyworld scenes to PNG files (a folder of the user's images),
then runs the user's command on them:

    python -m vlmspec_cli.zoo.hidden --arch eagle3 --target zoo:tinyworld/llava-target-deep \\
        IMAGES/ --out vlmspec_cli/zoo/weights/tinyworld/llava-deep-eagle3 \\
        --prompt "describe the image." ...

(the target answers each image greedily; the head learns from the target's own states and
answers and is written in the published EAGLE-3 layout). Its training log goes to stdout;
the head's BUILD_REPORT.json holds the acceptance it reached on its training images.
Measure it afterwards like any profile: ``python bench/caption.py --also tinyworld-hidden
tinyworld-eagle3`` and the demo, ``vlmspec caption examples/images/ -p tinyworld-eagle3
--compare``.

    python bench/eagle3_tinyworld.py [--images 400] [--steps 600] [--ttt 3]
                                     [--draft-vocab 256] [--threads 2] [--force]
"""

from __future__ import annotations

import argparse
import random
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

OUT = ROOT / "vlmspec_cli" / "zoo" / "weights" / "tinyworld" / "llava-deep-eagle3"
SEED = 31337          # the scenes' seed: none of the fresh-scene seeds the benches use


def render(folder: Path, n: int) -> None:
    from vlmspec_cli.zoo import world

    rng = random.Random(SEED)
    for i in range(n):
        world.render(world.sample_scene(rng)).save(folder / f"scene{i:04d}.png")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--images", type=int, default=400)
    ap.add_argument("--steps", type=int, default=600)
    ap.add_argument("--ttt", type=int, default=3, help="self-fed steps of the training-time test")
    ap.add_argument("--draft-vocab", type=int, default=256)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", type=Path, default=OUT)
    ap.add_argument("--force", action="store_true", help="replace a head written there before")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="tinyworld-scenes-") as tmp:
        render(Path(tmp), args.images)
        command = [sys.executable, "-m", "vlmspec_cli.zoo.hidden", "--arch", "eagle3",
                   "--target", "zoo:tinyworld/llava-target-deep", tmp, "--out", str(args.out),
                   "--prompt", "describe the image.", "--max-new-tokens", "64",
                   "--stage1", str(args.steps), "--stage2", "0", "--feedback", str(args.ttt),
                   "--draft-vocab", str(args.draft_vocab), "--threads", str(args.threads),
                   "--device", "cpu", *(["--force"] if args.force else [])]
        print("$", " ".join(command).replace(tmp, "IMAGES/"), flush=True)
        return subprocess.call(command, cwd=ROOT)


if __name__ == "__main__":
    raise SystemExit(main())
