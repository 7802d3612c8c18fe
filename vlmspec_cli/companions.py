"""The models shipped to go with a shipped target: its hidden-state heads, twigs and EAGLE-3
heads, by method.

The session reads it (a profile's head or twig trained for another target is replaced by
the one shipped for its own) and so do the tasks (calibrate and bench try them): it sits
below both and imports nothing from the package.
"""

from __future__ import annotations

# The shipped hidden-state heads, twigs and EAGLE-3 heads (by method), by the shipped target
# they were trained on (their BUILD_REPORTs say so). A user's own are named with --hidden /
# --twig.
SHIPPED_COMPANIONS = {
    "zoo:tinyworld/llava-target-deep": {"hidden": ("zoo:tinyworld/llava-deep-hidden",),
                                        "twig": ("zoo:tinyworld/llava-deep-twig",),
                                        "eagle3": ("zoo:tinyworld/llava-deep-eagle3",)},
    "zoo:tinyworld/llava-target": {"hidden": ("zoo:tinyworld/llava-hidden",),
                                   "twig": ("zoo:tinyworld/llava-twig",)},
    "zoo:tinyworld/qwen-video-target-deep": {"hidden": ("zoo:tinyworld/qwen-video-deep-hidden",),
                                             "eagle3": ("zoo:tinyworld/qwen-video-deep-eagle3",)},
    "zoo:tinyworld/qwen-video-target": {"hidden": ("zoo:tinyworld/qwen-video-hidden",)},
}
