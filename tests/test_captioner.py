"""The captioner: the zoo Llava captioner and a generic Hugging Face image-to-text family
(a tiny, randomly initialised BLIP built offline and loaded through from_pretrained)."""

from __future__ import annotations

import pytest
import torch
from PIL import Image
from transformers import (BertTokenizerFast, BlipConfig, BlipForConditionalGeneration,
                          BlipImageProcessor, BlipProcessor)

from conftest import fresh_scenes
from vlmspec_cli.profile import ModelSpec
from vlmspec_cli.runtime.adapters.image_to_text import ImageToTextAdapter
from vlmspec_cli.runtime.models.captioner import Captioner, _echoed_prompt
from vlmspec_cli.runtime.models.loading import load_model
from vlmspec_cli.zoo import world

WORDS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "a", "picture", "of", "red", "circle",
         "blue", "square", "on", "the", "left"]


@pytest.fixture(scope="module")
def tiny_blip(tmp_path_factory):
    path = tmp_path_factory.mktemp("blip")
    tok = BertTokenizerFast(vocab={w: i for i, w in enumerate(WORDS)})
    processor = BlipProcessor(image_processor=BlipImageProcessor(size={"height": 32, "width": 32}),
                              tokenizer=tok)
    text = dict(vocab_size=len(WORDS), hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                num_attention_heads=2, bos_token_id=2, sep_token_id=3, pad_token_id=0)
    vision = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
                  image_size=32, patch_size=8)
    torch.manual_seed(0)
    BlipForConditionalGeneration(BlipConfig(text_config=text, vision_config=vision,
                                            projection_dim=32)).save_pretrained(path)
    processor.save_pretrained(path)
    return load_model(ModelSpec(model=str(path), device="cpu"), "captioner")


def test_any_image_to_text_family_loads_as_captioner(tiny_blip):
    assert isinstance(tiny_blip.adapter, ImageToTextAdapter)
    captioner = Captioner(tiny_blip, prompt="a picture of", max_new_tokens=5)
    images = [Image.new("RGB", (40, 40), (200, 0, 0)), Image.new("RGB", (40, 40), (0, 0, 200))]
    captions, seconds = captioner.caption_all(images)
    assert len(captions) == 2 and seconds > 0
    # batched captions equal one-by-one ones, and the prompt is not echoed back
    assert captions == [captioner.caption_batch([im])[0] for im in images]
    enc = tiny_blip.adapter.encode(tiny_blip, "a picture of", images[:1])
    out = tiny_blip.model.generate(**enc, max_new_tokens=5, do_sample=False)
    expected = tiny_blip.tokenizer.decode(out[0, 4:], skip_special_tokens=True).strip()
    assert captions[0] == expected  # BLIP echoes the prompt without its [SEP]: 4 tokens


def test_echoed_prompt_length():
    prompt = torch.tensor([[2, 5, 6, 7, 3]])
    assert _echoed_prompt(torch.tensor([[2, 5, 6, 7, 9, 9]]), prompt) == 4      # BLIP
    assert _echoed_prompt(torch.tensor([[2, 5, 6, 7, 3, 9]]), prompt) == 5      # decoder-only


def test_zoo_captioner_captions_fresh_scenes(zoo_captioner):
    scenes = fresh_scenes(6, seed=2024)
    captions, _ = zoo_captioner.caption_all([im for _, im in scenes])
    right = sum(world.caption_is_exact(scene, text) for (scene, _), text in zip(scenes, captions))
    assert right >= 4, captions
    again, seconds = zoo_captioner.caption_all([scenes[0][1]])
    assert again == captions[:1]  # cached by pixel content
