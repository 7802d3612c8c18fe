"""The tinyworld video world (vlmspec_cli.zoo.video): rendering, descriptions, inputs."""

import random

import numpy as np
import pytest

from vlmspec_cli.zoo import video as V


def _centroid(frame, colour):
    ys, xs = np.nonzero((frame == np.array(V.COLOURS[colour], np.uint8)).all(-1))
    return xs.mean(), ys.mean()


def test_rendering_is_deterministic():
    a = V.render_script(V.random_script(random.Random(3)), 8)
    b = V.render_script(V.random_script(random.Random(3)), 8)
    assert a.shape == (8, 64, 64, 3) and a.dtype == np.uint8
    assert np.array_equal(a, b)
    assert V.render_script(V.random_script(random.Random(3)), V.RAW_FRAMES).shape[0] == 24


@pytest.mark.parametrize("motion,axis,sign", [("left to right", 0, 1), ("right to left", 0, -1),
                                              ("top to bottom", 1, 1), ("bottom to top", 1, -1),
                                              ("stays", 0, 0)])
def test_centroid_moves_the_right_way(motion, axis, sign):
    script = V.make_script("gray", [("red", "circle", motion), ("blue", "square", "stays")],
                           random.Random(1))
    frames = V.render_script(script, 6)
    first, last = _centroid(frames[0], "red"), _centroid(frames[-1], "red")
    delta = last[axis] - first[axis]
    if sign == 0:
        assert first == last
    else:
        assert delta * sign > 30 and abs(last[1 - axis] - first[1 - axis]) < 1
    b0, b1 = _centroid(frames[0], "blue"), _centroid(frames[-1], "blue")
    assert b0 == b1  # the staying square stays


def test_descriptions_match_scripts():
    rng = random.Random(0)
    for _ in range(200):
        script = V.random_script(rng)
        text = V.describe(script)
        parsed = V.parse_description(text)
        assert parsed == [(a.colour, a.kind, a.motion) for a in script.actors]
        assert V.score(script, text)["exact"] == 1
    s = V.make_script("black", [("yellow", "square", "stays"), ("red", "circle", "right to left")],
                      random.Random(0))
    assert V.describe(s) == "a red circle moves from right to left while a yellow square stays."
    s = V.make_script("black", [("green", "triangle", "top to bottom")], random.Random(0))
    assert V.describe(s) == "a green triangle moves from top to bottom."
    s = V.make_script("white", [("blue", "square", "stays"), ("red", "circle", "stays")], random.Random(0))
    assert V.describe(s) == "a red circle and a blue square stay."


def test_video_inputs_layout():
    from transformers import Qwen2_5_VLConfig

    tok = V.train_video_tokenizer(V.corpus_lines(300, 0))
    prompt = V.prompt_text(tok, V.QUESTIONS[0])
    assert prompt == "USER: <|vision_start|><|video_pad|><|vision_end|>Describe the video. ASSISTANT:"
    config = Qwen2_5_VLConfig(text_config=dict(vocab_size=len(tok), hidden_size=32, num_hidden_layers=1,
                                               num_attention_heads=2, num_key_value_heads=2,
                                               intermediate_size=32),
                              vision_config=dict(out_hidden_size=32, **V.VISION),
                              video_token_id=tok.video_token_id, image_token_id=tok.image_token_id)
    frames = V.render_script(V.random_script(random.Random(5)), 8)
    inp = V.video_inputs(tok, config, frames, V.QUESTIONS[0])
    assert inp["video_grid_thw"].tolist() == [[4, 8, 8]]
    assert inp["pixel_values_videos"].shape == (4 * 64, 3 * 2 * 8 * 8)
    n_video = (inp["input_ids"] == tok.video_token_id).sum().item()
    assert n_video == 64 and (inp["mm_token_type_ids"] == 2).sum().item() == 64
    assert inp["mm_token_type_ids"][inp["input_ids"] != tok.video_token_id].eq(0).all()
    assert inp["second_per_grid_ts"].tolist() == pytest.approx([2 / (8 / 3)])
