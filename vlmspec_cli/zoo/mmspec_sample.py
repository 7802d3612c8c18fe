"""A small benchmark in MMSpec's format, built from tinyworld: ``examples/mmspec/``.

MMSpec (arXiv 2603.14989) has 600 samples in 6 categories (its ``topic``): general VQA,
text VQA, captioning, chart VQA, complex reasoning and multi-turn conversation. tinyworld
has no text to read and no charts, so each category gets the nearest thing its world
holds, 4 samples each, lines round-robin over the categories (so ``--limit 6`` takes one
of each):

- general vqa: a question about the scene and a second one (colour, place, size);
- text vqa: "reading" one cell of the 3x3 grid ("what is at the top left?"), then the
  background;
- image captioning: one caption request;
- chart understanding: counting (the shapes, then one kind);
- complex reasoning: a comparison (which of two shapes is larger; is one above the other),
  then a question about its own answer;
- multi-turn conversation: a caption, a follow-up on that answer, an unrelated text task.

Every sample is a line ``{"id", "image", "turns", "category", "topic"}`` with its image
(64x64 PNG, a few hundred bytes) in ``images/``. Deterministic: the same seed writes the
same files. Regenerate with::

    python -m vlmspec_cli.zoo.mmspec_sample examples/mmspec
"""

from __future__ import annotations

import argparse
import io
import json
import random
from pathlib import Path

from vlmspec_cli.zoo import world

SEED = 2603_14989
PER_CATEGORY = 4
TOPICS = ("general vqa", "text vqa", "image captioning", "chart understanding",
          "complex reasoning", "multi-turn conversation")


def _description(scene: world.Scene) -> str:
    n = len(scene.shapes)
    return f"{world.NUMBER_WORDS[n]} shape{'s' if n != 1 else ''} on a {scene.background} background"


def _pick(pairs: list[tuple[str, str]], rng: random.Random, *starts: str) -> str:
    """The first question (of ``world.qa_pairs``) starting with one of ``starts``."""
    for start in starts:
        found = [q for q, _ in pairs if q.startswith(start)]
        if found:
            return rng.choice(found)
    return rng.choice(pairs)[0]


def _comparison(scene: world.Scene) -> str:
    if len(scene.shapes) < 2:
        return f"is the {scene.shapes[0].kind} large or small?"
    a, b = scene.shapes[0], scene.shapes[-1]
    return f"which is larger, the {a.colour} {a.kind} or the {b.colour} {b.kind}?"


def _turns(topic: str, scene: world.Scene, rng: random.Random) -> list[str]:
    pairs = world.qa_pairs(scene, rng)
    if topic == "general vqa":
        return [_pick(pairs, rng, "what colour is the", "which colour"),
                _pick(pairs, rng, "where is", "is the")]
    if topic == "text vqa":
        return [_pick(pairs, rng, "what is at", "what is on", "what is in"),
                _pick(pairs, rng, "what colour is the background", "what is the background")]
    if topic == "image captioning":
        return [rng.choice(world.CAPTION_PROMPTS)]
    if topic == "chart understanding":
        return [_pick(pairs, rng, "how many shapes"),
                _pick(pairs, rng, *[f"how many {kind}s" for kind in world.SHAPES])]
    if topic == "complex reasoning":
        return [_comparison(scene), "which shape did you mention first?"]
    caption = world.caption(scene, rng)
    return [rng.choice(world.CAPTION_PROMPTS), world.followup(scene, caption, rng)[0],
            world.text_task(rng)[0]]


def build(out_dir: str | Path, seed: int = SEED, per_category: int = PER_CATEGORY) -> list[dict]:
    """Write ``mmspec.jsonl`` and ``images/`` under ``out_dir``; returns the samples."""
    out_dir = Path(out_dir)
    (out_dir / "images").mkdir(parents=True, exist_ok=True)
    rng = random.Random(seed)
    samples = []
    for n in range(per_category):
        for t, topic in enumerate(TOPICS):
            scene = world.sample_scene(rng, min_shapes=2 if topic == "complex reasoning" else 1)
            sid = f"tw_{len(samples) + 1:03d}"
            image = f"{topic.replace(' ', '_').replace('-', '_')}/{sid}.png"
            path = out_dir / "images" / image
            path.parent.mkdir(parents=True, exist_ok=True)
            buffer = io.BytesIO()
            world.render(scene).save(buffer, format="PNG", optimize=True)
            path.write_bytes(buffer.getvalue())
            samples.append({"id": sid, "image": image, "turns": _turns(topic, scene, rng),
                            "category": _description(scene), "topic": topic})
    text = "".join(json.dumps(s, separators=(",", ":")) + "\n" for s in samples)
    (out_dir / "mmspec.jsonl").write_text(text, encoding="utf-8")
    return samples


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=" ".join(__doc__.split("\n\n")[0].split()))
    parser.add_argument("out_dir", nargs="?", default="examples/mmspec")
    parser.add_argument("--seed", type=int, default=SEED)
    args = parser.parse_args(argv)
    samples = build(args.out_dir, args.seed)
    print(f"wrote {len(samples)} samples to {args.out_dir}/mmspec.jsonl")


if __name__ == "__main__":
    main()
