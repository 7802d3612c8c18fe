"""Build a tinyworld EAGLE-3 head the way a user trains one for their own target.

Renders tinyworld images (``--task caption``) or videos (``--task video``) from a fixed
seed into a temporary folder, then runs the user's command on them:

    python -m vlmspec_cli.zoo.hidden --arch eagle3 --target zoo:tinyworld/llava-target-deep \\
        IMAGES/ --out vlmspec_cli/zoo/weights/tinyworld/llava-deep-eagle3 \\
        --prompt "describe the image." ...

Steps 13 (the caption head) and 14 (``--task video``, the video head) of ``python -m
vlmspec_cli.zoo.build --all``; the defaults are what the shipped heads were built with.
bench/eagle3_tinyworld.py calls this.

    python -m vlmspec_cli.zoo.eagle3_build [--task caption|video] [--samples N] [--steps 600]
                                           [--ttt 3] [--draft-vocab 256] [--threads N] [--force]
"""


from __future__ import annotations

import argparse
import random
import subprocess
import sys
import tempfile
from pathlib import Path

WEIGHTS = Path(__file__).resolve().parent / "weights" / "tinyworld"
SEED = 31337          # the samples' seed: none of the fresh-sample seeds the benches use
# task -> (target, head folder, prompt, max new tokens, default samples, default threads).
# The video head was built on 1 thread: on the shared 2-core CPU a build on 2 threads was
# stopped after 34 minutes (load 9-13), one on 1 thread took 7 (load 4-8; bench/history/RESULTS-until-2026-12-07.md).
TASKS = {"caption": ("zoo:tinyworld/llava-target-deep", "llava-deep-eagle3",
                     "describe the image.", 64, 400, 2),
         "video": ("zoo:tinyworld/qwen-video-target-deep", "qwen-video-deep-eagle3",
                   "Describe the video.", 48, 400, 1)}


def render(folder: Path, task: str, n: int) -> None:
    rng = random.Random(SEED)
    if task == "video":
        from vlmspec_cli.zoo.video import world as vworld

        for i in range(n):
            script = vworld.random_script(rng)
            vworld.write_video(folder / f"video{i:04d}.mp4", vworld.render_script(script))
        return
    from vlmspec_cli.zoo import world

    for i in range(n):
        world.render(world.sample_scene(rng)).save(folder / f"scene{i:04d}.png")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m vlmspec_cli.zoo.eagle3_build",
                                 description=" ".join(__doc__.split("\n\n")[0].split()))
    ap.add_argument("--task", choices=sorted(TASKS), default="caption")
    ap.add_argument("--samples", "--images", type=int, default=None,
                    help="rendered images or videos (default 400)")
    ap.add_argument("--steps", type=int, default=600)
    ap.add_argument("--ttt", type=int, default=3, help="self-fed steps of the training-time test")
    ap.add_argument("--draft-vocab", type=int, default=256)
    ap.add_argument("--threads", type=int, default=None,
                    help="CPU threads (default: caption 2, video 1)")
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--force", action="store_true", help="replace a head written there before")
    args = ap.parse_args(argv)
    target, folder, prompt, max_new, samples, threads = TASKS[args.task]
    threads = args.threads or threads
    out = args.out or WEIGHTS / folder
    with tempfile.TemporaryDirectory(prefix="tinyworld-samples-") as tmp:
        render(Path(tmp), args.task, args.samples or samples)
        command = [sys.executable, "-m", "vlmspec_cli.zoo.hidden", "--arch", "eagle3",
                   *(["--task", "video"] if args.task == "video" else []),
                   "--target", target, tmp, "--out", str(out),
                   "--prompt", prompt, "--max-new-tokens", str(max_new),
                   "--stage1", str(args.steps), "--stage2", "0", "--feedback", str(args.ttt),
                   "--draft-vocab", str(args.draft_vocab), "--threads", str(threads),
                   "--device", "cpu", *(["--force"] if args.force else [])]
        shown = "IMAGES/" if args.task == "caption" else "VIDEOS/"
        print("$", " ".join(command).replace(tmp, shown), flush=True)
        return subprocess.call(command)


if __name__ == "__main__":
    raise SystemExit(main())
