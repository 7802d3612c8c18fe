"""Every shipped tinyworld model, built in order: ``python -m vlmspec_cli.zoo.build --all``.

Each step is one of the zoo's build scripts with the arguments the shipped weights were
built with (their BUILD_REPORT.json entries record them); a later step reads what an
earlier one saved under ``weights/tinyworld/``. ``--list`` prints the steps as the commands
they run; ``--from`` / ``--to`` run a part (e.g. only the deep targets' steps, once the
small models are built). Times are what the README and the BUILD_REPORTs say the shipped
builds took on a 2-core CPU (the deep twig's with its ablation, an upper bound).

Determinism: every script seeds its own generators, and a step run twice on one machine
and software stack gives the same losses at every logged step (step 2 on 2026-11-24). A
rebuild elsewhere, or after the kernels change, is not bit-identical: steps 1-3 rerun on
2026-11-24 (bench/runs/2026-11-24/zoo-rebuild-cpu/) gave the same tokenizer, and caption and image pairs
within a few points of their shipped accuracies. The video pair shipped since 2026-11-24
is step 2's own output with its current defaults (vision pre-training 2400 steps, second
end-to-end run 2000; a second run gave it byte for byte), as are the video steps after it
(5, 7, 10); the earlier video
weights had been built in stages and were not reached again in one run (motion 0.31
against 0.76 at 8 frames; the current recipe: 0.95). The hidden-state heads and the
distilled draft are not bit-reproducible across runs either (a rebuilt head measured a
slightly different τ from the shipped one's).
"""

from __future__ import annotations

import importlib
import shlex
import time
from dataclasses import dataclass


@dataclass(frozen=True)
class Step:
    name: str            # what it builds
    module: str          # vlmspec_cli.zoo.<module>, whose main(argv) builds it
    argv: tuple[str, ...] = ()
    minutes: int = 0     # as recorded on a 2-core CPU

    @property
    def command(self) -> str:
        package = self.module if self.module == "build" else self.module.removesuffix(".build")
        return " ".join(["python -m", f"vlmspec_cli.zoo.{package}", *map(shlex.quote, self.argv)])


STEPS = (
    Step("llava-draft, llava-target, captioner, llava-twig (8-layer caption pair)", "build", (), 25),
    Step("qwen-video-target, qwen-video-draft (6-layer video pair)", "video.build", (), 17),
    Step("janus-vq, janus-target, janus-draft (6-layer image pair)", "imagegen.build", (), 9),
    Step("llava-hidden", "hidden", ("--target", "llava", "--examples", "1200", "--stage1", "500",
                                    "--stage2", "250"), 11),
    Step("qwen-video-hidden", "hidden", ("--target", "video", "--examples", "800", "--stage1", "400",
                                         "--stage2", "200"), 1),
    Step("llava-target-deep (32 layers)", "deepen", ("--family", "caption"), 10),
    Step("qwen-video-target-deep (24 layers)", "deepen", ("--family", "video"), 6),
    Step("janus-target-deep (24 layers)", "deepen", ("--family", "image"), 31),
    Step("llava-deep-hidden", "hidden", ("--target", "llava-deep"), 3),
    Step("qwen-video-deep-hidden", "hidden", ("--target", "video-deep", "--examples", "800",
                                              "--stage1", "400", "--stage2", "200"), 2),
    Step("llava-deep-twig", "deep_twig", (), 14),
    Step("llava-deep-draft (distilled on the 32-layer target's answers)", "distill_draft",
         ("--examples", "1500", "--batch-size", "16", "--steps", "500", "--eval", "40"), 37),
    Step("llava-deep-eagle3 (EAGLE-3 head of the 32-layer target, zoo.hidden --arch eagle3)",
         "eagle3_build", ("--task", "caption"), 19),
    Step("qwen-video-deep-eagle3 (EAGLE-3 head of the 24-layer video target, the same command)",
         "eagle3_build", ("--task", "video"), 7),
)


def select(first: int | None = None, last: int | None = None) -> list[tuple[int, Step]]:
    """Steps ``first``..``last`` (1-based, inclusive), numbered."""
    lo, hi = first or 1, last or len(STEPS)
    if not 1 <= lo <= hi <= len(STEPS):
        raise ValueError(f"steps run from 1 to {len(STEPS)}; got --from {lo} --to {hi}")
    return [(i, s) for i, s in enumerate(STEPS, 1) if lo <= i <= hi]


def describe(steps: list[tuple[int, Step]]) -> str:
    lines = [f"{i:2d}. {s.name}  (~{s.minutes} min)\n    {s.command}" for i, s in steps]
    total = sum(s.minutes for _, s in steps)
    return "\n".join(lines + [f"about {total} minutes on a 2-core CPU"])


def run(steps: list[tuple[int, Step]]) -> None:
    """Run the steps in order, each as its own command would."""
    for i, step in steps:
        print(f"== step {i}/{len(STEPS)}: {step.name}\n   {step.command}", flush=True)
        t0 = time.perf_counter()
        importlib.import_module(f"vlmspec_cli.zoo.{step.module}").main(list(step.argv))
        print(f"== step {i} done in {time.perf_counter() - t0:.0f} s", flush=True)
