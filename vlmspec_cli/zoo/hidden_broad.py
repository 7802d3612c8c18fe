"""A broad workload for the tinyworld caption targets' heads (``--data broad`` of
zoo/hidden.py): conversations of every MMSpec topic and more, over clean and photo-like
images, answered by the target itself (zoo/own_answers.py). The head then learns what
the target says whatever it is asked, not the world's reference captions.

Topics (weights in ``TOPICS``): captions; general VQA (colour, place, size, presence);
"text" VQA (reading a cell of the grid, the background); chart-like counting; comparison
and reasoning followed by a question about the model's own answer; multi-turn chats (a
caption or a question, follow-ups referring to the earlier answer, an unrelated task);
odd prompts (arithmetic, off-topic questions, shouting, typos, politeness); text-only
chats; several images (dialogue.py's differences and stories).

Images: 70% of the scenes are rendered clean at 48-128 px, the rest photo-like: sensor
noise, blur, a texture blended in, JPEG artefacts, colour jitter, crops, odd sizes and
aspect ratios; some are not scenes at all (gradients and blobs). No photo of the
benchmarks (china.jpg, flower.jpg) and nothing of examples/mmspec: MMSpec's tinyworld
sample is drawn with ``mmspec_sample.SEED``, never used here.
"""

from __future__ import annotations

import io
import random

from PIL import Image, ImageDraw, ImageEnhance, ImageFilter

from vlmspec_cli.zoo import world
from vlmspec_cli.zoo.mmspec_sample import SEED as MMSPEC_SEED
from vlmspec_cli.zoo.own_answers import Dialogue, UserTurn

# the mix of the best candidate measured (bench/runs/2026-12-07/README.md): more captions
# kept the fresh captions' acceptance; the demo's six still lost (not shipped). The shipped
# llava-deep-hidden is the reference head fine-tuned on reference + broad data (head-v4)
TOPICS = {"caption": 0.45, "general vqa": 0.09, "text vqa": 0.07, "chart": 0.07,
          "reasoning": 0.09, "multi-turn": 0.13, "odd": 0.06, "text only": 0.05,
          "multi-image": 0.04, "not a scene": 0.03}
CLEAN = 0.7     # the share of scenes rendered clean (the rest photo-like)

# follow-ups about the previous answer (dialogue.followup's questions, and more)
FOLLOWUPS = ("repeat your answer.", "what was the last word of your answer?",
             "what colour was the background?", "how many colours did you mention?",
             "which shape did you mention first?", "how many shapes did you mention?",
             "say it in fewer words.", "make it shorter.", "are you sure?", "why?",
             "tell me more.", "what about the other shapes?", "and the background?",
             "can you say that again?")
OFF_TOPIC = ("what is the capital of france?", "tell me a joke.", "who are you?", "hello!",
             "write a poem about the sea.", "what time is it?", "what is the weather like?",
             "what type of plant is in the foreground?", "is this a photo or a drawing?",
             "translate 'cat' to french.", "what is the meaning of life?", "thanks!",
             "summarize the image in one word.", "list the colours you see.",
             "what is written on the sign?", "what does the chart show?",
             "what is the highest bar?", "how old is the person?")


def _odd(text: str, rng: random.Random) -> str:
    """The same question as people type it: shouting, typos, politeness, filler."""
    k = rng.randrange(6)
    if k == 0:
        return text.upper()
    if k == 1 and len(text) > 4:
        i = rng.randrange(len(text) - 2)
        return text[:i] + text[i + 1] + text[i] + text[i + 2:]
    if k == 2:
        return "please " + text
    if k == 3:
        return rng.choice(("hey, ", "ok so ", "quick question: ", "hmm ")) + text
    if k == 4:
        return text.rstrip(".?!") + rng.choice(("??", "!", " thanks", " ..."))
    return text.capitalize()


# ----------------------------------------------------------------------------- images

def _texture(size: tuple[int, int], rng: random.Random) -> Image.Image:
    """A smooth random field: a coarse noise grid blown up (bilinear), in colour."""
    w, h = rng.randint(2, 6), rng.randint(2, 6)
    small = Image.new("RGB", (w, h))
    small.putdata([tuple(rng.randrange(256) for _ in range(3)) for _ in range(w * h)])
    return small.resize(size, Image.BILINEAR)


def _noise(image: Image.Image, rng: random.Random) -> Image.Image:
    """Grain: a per-pixel noise image blended in at 5-30%."""
    grain = Image.effect_noise(image.size, rng.uniform(20, 90)).convert("RGB")
    return Image.blend(image, grain, rng.uniform(0.05, 0.3))


def photo_like(image: Image.Image, rng: random.Random) -> Image.Image:
    """One to three degradations of a clean render, in random order."""
    steps = rng.sample(range(7), rng.randint(1, 3))
    for k in steps:
        w, h = image.size
        if k == 0:
            image = _noise(image, rng)
        elif k == 1:
            image = image.filter(ImageFilter.GaussianBlur(rng.uniform(0.4, 2.0)))
        elif k == 2:
            image = Image.blend(image, _texture(image.size, rng), rng.uniform(0.1, 0.4))
        elif k == 3:
            buf = io.BytesIO()
            image.save(buf, format="JPEG", quality=rng.randint(8, 60))
            image = Image.open(io.BytesIO(buf.getvalue())).convert("RGB")
        elif k == 4:
            for enhance in (ImageEnhance.Brightness, ImageEnhance.Contrast, ImageEnhance.Color):
                image = enhance(image).enhance(rng.uniform(0.6, 1.4))
        elif k == 5:
            cw, ch = int(w * rng.uniform(0.5, 1.0)), int(h * rng.uniform(0.5, 1.0))
            x, y = rng.randrange(w - cw + 1), rng.randrange(h - ch + 1)
            image = image.crop((x, y, x + cw, y + ch))
        else:
            width = rng.choice((24, 40, 96, 160, 224, 320))
            image = image.resize((width, max(8, int(width * rng.uniform(0.5, 2.0)))))
    return image


def not_a_scene(rng: random.Random) -> Image.Image:
    """A picture that is no tinyworld scene: a smooth field with blobs and bars."""
    size = (rng.choice((48, 64, 128, 200)), rng.choice((48, 64, 128, 160)))
    image = _texture(size, rng)
    draw = ImageDraw.Draw(image)
    for _ in range(rng.randint(0, 6)):
        x0, y0 = rng.randrange(size[0]), rng.randrange(size[1])
        box = [x0, y0, x0 + rng.randint(3, size[0] // 2), y0 + rng.randint(3, size[1] // 2)]
        colour = tuple(rng.randrange(256) for _ in range(3))
        (draw.ellipse if rng.random() < 0.5 else draw.rectangle)(box, fill=colour)
    return _noise(image, rng) if rng.random() < 0.5 else image


def scene_image(scene: world.Scene, rng: random.Random) -> Image.Image:
    image = world.render(scene, rng.choice((48, 64, 64, 96, 128)))
    return image if rng.random() < CLEAN else photo_like(image, rng)


# ----------------------------------------------------------------------------- questions

def _qa(scene, rng, *starts: str) -> str:
    pairs = world.qa_pairs(scene, rng)
    found = [q for q, _ in pairs if any(q.startswith(s) for s in starts)]
    return rng.choice(found or [q for q, _ in pairs])


def _reasoning(scene: world.Scene, rng: random.Random) -> str:
    a, b = rng.sample(scene.shapes, 2) if len(scene.shapes) > 1 else (scene.shapes[0],) * 2
    na, nb = f"the {a.colour} {a.kind}", f"the {b.colour} {b.kind}"
    return rng.choice((f"which is larger, {na} or {nb}?", f"is {na} above {nb}?",
                       f"is {na} left of {nb}?", f"do {na} and {nb} have the same size?",
                       f"which is closer to the center, {na} or {nb}?",
                       f"is {na} bigger than {nb}?"))


def _questions(topic: str, scene: world.Scene, rng: random.Random) -> list[str]:
    """The user's turns of a conversation about one image."""
    if topic == "caption":
        first = [rng.choice(world.CAPTION_PROMPTS)]
        return first + ([rng.choice(FOLLOWUPS)] if rng.random() < 0.3 else [])
    if topic == "general vqa":
        return [rng.choice(world.qa_pairs(scene, rng))[0] for _ in range(rng.randint(1, 3))]
    if topic == "text vqa":
        return [_qa(scene, rng, "what is at", "what is on", "what is in")
                for _ in range(rng.randint(1, 2))] + [_qa(scene, rng, "what colour is the back",
                                                          "what is the back")]
    if topic == "chart":
        return [_qa(scene, rng, "how many shapes"),
                _qa(scene, rng, *[f"how many {k}s" for k in world.SHAPES])][: rng.randint(1, 2)]
    if topic == "reasoning":
        return [_reasoning(scene, rng), rng.choice(FOLLOWUPS)]
    if topic == "multi-turn":
        first = (rng.choice(world.CAPTION_PROMPTS) if rng.random() < 0.6
                 else rng.choice(world.qa_pairs(scene, rng))[0])
        turns = [first] + rng.sample(FOLLOWUPS, rng.randint(1, 2))
        return turns + ([world.text_task(rng)[0]] if rng.random() < 0.6 else [])
    if topic == "odd":
        pool = [world.text_task(rng)[0], rng.choice(OFF_TOPIC),
                _odd(rng.choice(world.CAPTION_PROMPTS), rng),
                _odd(rng.choice(world.qa_pairs(scene, rng))[0], rng)]
        return rng.sample(pool, rng.randint(1, 3))
    # not a scene: what people ask of any photo
    return ([rng.choice(world.CAPTION_PROMPTS + OFF_TOPIC)]
            + ([rng.choice(FOLLOWUPS)] if rng.random() < 0.4 else []))


def broad_dialogue(rng: random.Random, i: int) -> Dialogue:
    """One conversation of a topic drawn by ``TOPICS``' weights (``i``: its tag)."""
    topic = rng.choices(list(TOPICS), weights=list(TOPICS.values()))[0]
    tag = f"{topic}:{i}"
    if topic == "text only":
        texts = [rng.choice((world.text_task(rng)[0], rng.choice(OFF_TOPIC)))
                 for _ in range(rng.randint(1, 3))]
        return Dialogue([UserTurn(t) for t in texts], tag)
    if topic == "multi-image":
        conv = world.sample_conversation(rng, rng.choice(("difference", "story")))
        images = tuple(photo_like(im, rng) if rng.random() < 0.3 else im for im in conv[0].images)
        turns = [UserTurn(conv[0].text, images)]
        return Dialogue(turns + ([UserTurn(rng.choice(FOLLOWUPS))] if rng.random() < 0.3 else []),
                        tag)
    if topic == "not a scene":
        texts = _questions(topic, None, rng)
        image = not_a_scene(rng)
    else:
        scene = world.sample_scene(rng, min_shapes=2 if topic == "reasoning" else 1)
        texts = _questions(topic, scene, rng)
        image = scene_image(scene, rng)
    return Dialogue([UserTurn(texts[0], (image,))] + [UserTurn(t) for t in texts[1:]], tag)


def broad_dialogues(n: int, seed: int) -> list[Dialogue]:
    if seed == MMSPEC_SEED:
        raise ValueError("that seed draws examples/mmspec's benchmark; pick another")
    rng = random.Random(seed)
    return [broad_dialogue(rng, i) for i in range(n)]


def broad_data(lm, n: int, seed: int, max_new_tokens: int = 48, log=print):
    """(requests, the target's own answers) of ``n`` broad conversations, for ``collect``."""
    from vlmspec_cli.zoo.own_answers import answer_dialogues, training_pairs

    done = answer_dialogues(lm, broad_dialogues(n, seed), max_new_tokens, log=log)
    return training_pairs(done, max_new_tokens)
