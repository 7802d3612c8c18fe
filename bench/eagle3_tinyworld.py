"""The tinyworld EAGLE-3 heads, trained the way a user trains one for their own target.

Renders fresh tinyworld samples to files (a folder of the user's images, or videos with
``--task video``), then runs the user's command on them:

    python -m vlmspec_cli.zoo.hidden --arch eagle3 --target zoo:tinyworld/llava-target-deep \\
        IMAGES/ --out vlmspec_cli/zoo/weights/tinyworld/llava-deep-eagle3 \\
        --prompt "describe the image." ...
    python -m vlmspec_cli.zoo.hidden --arch eagle3 --task video \\
        --target zoo:tinyworld/qwen-video-target-deep VIDEOS/ \\
        --out vlmspec_cli/zoo/weights/tinyworld/qwen-video-deep-eagle3 \\
        --prompt "Describe the video." ...

(the target answers each sample greedily; the head learns from the target's own states and
answers and is written in the published EAGLE-3 layout). Its training log goes to stdout;
the head's BUILD_REPORT.json holds the acceptance it reached on its training samples.
Measure it afterwards like any profile: ``vlmspec bench bench/runs/2026-11-26/demo-captions.jsonl --set
drafting.gamma=8 --methods none,eagle3,hidden,chain`` (the caption head); ``python
bench/video_eagle3.py`` (the video head: describe-video --compare against the hidden head
and the chain).

    python bench/eagle3_tinyworld.py [--task caption|video] [--samples N] [--steps 600]
                                     [--ttt 3] [--draft-vocab 256] [--threads N] [--force]
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from vlmspec_cli.zoo.eagle3_build import main  # noqa: E402  (the build lives in the zoo)

if __name__ == "__main__":
    raise SystemExit(main())
