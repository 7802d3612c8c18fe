"""Tiny random-weight models of the families vlmspec adapts, saved to a folder the way a
hub checkout is laid out, so tests load them through the same ``from_pretrained`` path a
hub id or a local directory takes. Losslessness does not depend on trained weights: at
T = 0 every method must give the model's own greedy tokens, whatever they are.

They reuse the tinyworld tokenizer (512 tokens, ``<image>`` as the image placeholder) and
its chat template; vision towers and decoders are a few layers wide."""

from __future__ import annotations

import json
from pathlib import Path

import torch

from conftest import ROOT

TOKENIZER_SOURCE = ROOT / "vlmspec_cli" / "zoo" / "weights" / "tinyworld" / "llava-target"
PINPOINTS = [[32, 64], [64, 32], [64, 64]]


def _tokenizer():
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(TOKENIZER_SOURCE)


def _llama(tok, layers: int, width: int = 64):
    from transformers import LlamaConfig

    return LlamaConfig(vocab_size=len(tok), hidden_size=width, intermediate_size=2 * width,
                       num_hidden_layers=layers, num_attention_heads=4, num_key_value_heads=2,
                       max_position_embeddings=1024, bos_token_id=tok.bos_token_id,
                       eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)


def llava_next(folder: Path, seed: int, layers: int = 3) -> Path:
    """LLaVA-NeXT: CLIP tower (32 px tiles of 16 px patches), anyres over PINPOINTS,
    a Llama decoder of ``layers`` layers; processor and model configs agree."""
    from transformers import (CLIPVisionConfig, LlavaNextConfig, LlavaNextForConditionalGeneration,
                              LlavaNextImageProcessorPil, LlavaNextProcessor)

    tok = _tokenizer()
    vision = CLIPVisionConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                              num_attention_heads=2, image_size=32, patch_size=16, projection_dim=32)
    config = LlavaNextConfig(vision_config=vision, text_config=_llama(tok, layers),
                             image_token_id=tok.convert_tokens_to_ids("<image>"),
                             image_grid_pinpoints=PINPOINTS, vision_feature_select_strategy="default",
                             vision_feature_layer=-1)
    torch.manual_seed(seed)
    model = LlavaNextForConditionalGeneration(config).eval()
    images = LlavaNextImageProcessorPil(size={"shortest_edge": 32}, crop_size={"height": 32, "width": 32},
                                        image_grid_pinpoints=PINPOINTS)
    processor = LlavaNextProcessor(image_processor=images, tokenizer=tok, patch_size=16,
                                   vision_feature_select_strategy="default",
                                   num_additional_image_tokens=1, chat_template=tok.chat_template)
    _save(model, folder)
    processor.save_pretrained(folder)
    return folder


QWEN_SOURCE = ROOT / "vlmspec_cli" / "zoo" / "weights" / "tinyworld" / "qwen-video-target"
QWEN_FILES = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja", "preprocessor_config.json")


def _save(model, folder: Path, copy: tuple[str, ...] = ()) -> Path:
    """save_pretrained into ``folder``, with ``copy``: the tinyworld Qwen tokenizer and
    processor files."""
    import shutil

    folder.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(folder)
    for name in copy:
        shutil.copy(QWEN_SOURCE / name, folder / name)
    return folder


def qwen2_5_vl(folder: Path, seed: int, layers: int = 2) -> Path:
    """Qwen2.5-VL with the tinyworld video target's tokenizer (<|image_pad|>,
    <|video_pad|>), processor settings and widths, ``layers`` decoder layers, random."""
    from transformers import AutoConfig, Qwen2_5_VLForConditionalGeneration

    config = AutoConfig.from_pretrained(QWEN_SOURCE)
    config.text_config.num_hidden_layers = layers
    config.text_config.layer_types = ["full_attention"] * layers
    torch.manual_seed(seed)
    return _save(Qwen2_5_VLForConditionalGeneration(config).eval(), folder, QWEN_FILES)


def qwen2_vl(folder: Path, seed: int, layers: int = 2) -> Path:
    """Qwen2-VL (its own vision tower: no window attention, fixed temporal positions), same
    tokenizer and widths as ``qwen2_5_vl``."""
    from transformers import AutoConfig, Qwen2VLConfig, Qwen2VLForConditionalGeneration

    src = AutoConfig.from_pretrained(QWEN_SOURCE)
    t = src.text_config
    text = dict(vocab_size=t.vocab_size, hidden_size=t.hidden_size, intermediate_size=t.intermediate_size,
                num_hidden_layers=layers, num_attention_heads=t.num_attention_heads,
                num_key_value_heads=t.num_key_value_heads, max_position_embeddings=4096,
                bos_token_id=t.bos_token_id, eos_token_id=t.eos_token_id, pad_token_id=t.pad_token_id,
                rope_parameters=dict(t.rope_parameters))
    vision = dict(depth=2, embed_dim=48, hidden_size=t.hidden_size, num_heads=4, mlp_ratio=2,
                  patch_size=8, spatial_merge_size=2, temporal_patch_size=2, in_channels=3)
    config = Qwen2VLConfig(text_config=text, vision_config=vision, image_token_id=src.image_token_id,
                           video_token_id=src.video_token_id,
                           vision_start_token_id=src.vision_start_token_id,
                           vision_end_token_id=src.vision_end_token_id)
    torch.manual_seed(seed)
    return _save(Qwen2VLForConditionalGeneration(config).eval(), folder, QWEN_FILES)


# the families whose tests build them (moved here from their test files, so that
# bench/useless_drafts.py builds the same models)
ONEVISION_PINPOINTS = [[32, 64], [64, 32], [64, 64], [128, 128]]
IMAGE_PART = "{% if part['type'] == 'image' %}<image>\n{% endif %}"
VISUAL_PART = "{% if part['type'] == 'image' %}<image>\n{% elif part['type'] == 'video' %}<video>\n{% endif %}"
ONEVISION_HEAD_SCALE = 20.0   # a sharper random head: a first-token distribution with a few likely tokens


def llava_onevision(folder: Path, seed: int, layers: int = 3) -> Path:
    """LLaVA-OneVision: SigLIP tower (32 px tiles of 16 px patches, 2x2 patches a tile),
    anyres over ONEVISION_PINPOINTS (a 128 px grid has 16 tiles: past anyres_max_9, so shrunk), a
    Qwen2 decoder of ``layers`` layers; the tinyworld tokenizer plus ``<video>``, its chat
    template rendering video parts. Saved as a hub checkout is: tokenizer, image processor,
    processor_config.json (whose processor needs torchvision: the adapter builds inputs)."""
    from transformers import (LlavaOnevisionConfig, LlavaOnevisionForConditionalGeneration,
                              LlavaOnevisionImageProcessorPil, Qwen2Config, SiglipVisionConfig)

    tok = _tokenizer()
    tok.add_tokens(["<video>"], special_tokens=True)
    assert IMAGE_PART in tok.chat_template
    tok.chat_template = tok.chat_template.replace(IMAGE_PART, VISUAL_PART)
    vision = SiglipVisionConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                num_attention_heads=2, image_size=32, patch_size=16, vision_use_head=False)
    text = Qwen2Config(vocab_size=len(tok), hidden_size=64, intermediate_size=128,
                       num_hidden_layers=layers, num_attention_heads=4, num_key_value_heads=2,
                       max_position_embeddings=2048, bos_token_id=tok.bos_token_id,
                       eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)
    config = LlavaOnevisionConfig(vision_config=vision, text_config=text,
                                  image_token_id=tok.convert_tokens_to_ids("<image>"),
                                  video_token_id=tok.convert_tokens_to_ids("<video>"),
                                  image_grid_pinpoints=ONEVISION_PINPOINTS, vision_feature_layer=-1,
                                  vision_feature_select_strategy="full")
    torch.manual_seed(seed)
    model = LlavaOnevisionForConditionalGeneration(config).eval()
    with torch.no_grad():
        model.lm_head.weight.mul_(ONEVISION_HEAD_SCALE)
    _save(model, folder)
    tok.save_pretrained(folder)
    LlavaOnevisionImageProcessorPil(size={"height": 32, "width": 32}, image_grid_pinpoints=ONEVISION_PINPOINTS,
                                    image_mean=[0.5] * 3, image_std=[0.5] * 3).save_pretrained(folder)
    (folder / "processor_config.json").write_text(json.dumps(
        {"processor_class": "LlavaOnevisionProcessor", "num_image_tokens": 4, "image_token": "<image>",
         "video_token": "<video>", "vision_feature_select_strategy": "full"}))
    return folder


MISTRAL_MARKS = ["[IMG]", "[IMG_BREAK]", "[IMG_END]"]


def mistral3(folder: Path, seed: int, layers: int = 2, head_scale: float = 1.0) -> Path:
    """Mistral3: Pixtral tower (8 px patches, 2x2 merge, images up to 64 px), a Mistral
    decoder of ``layers`` layers, the tinyworld tokenizer with the three image tokens added
    and a chat template that writes [IMG]; the image processor's and the processor's
    settings saved as a hub checkout holds them (PixtralProcessor itself needs torchvision).
    ``head_scale`` sharpens the LM head (a peaked next-token distribution for T > 0 checks)."""
    from transformers import (MistralConfig, Mistral3Config, Mistral3ForConditionalGeneration,
                              PixtralImageProcessorPil, PixtralVisionConfig)

    tok = _tokenizer()
    tok.add_special_tokens({"additional_special_tokens": MISTRAL_MARKS})
    tok.chat_template = tok.chat_template.replace("<image>\n", "[IMG]")
    text = MistralConfig(vocab_size=len(tok), hidden_size=64, intermediate_size=128,
                         num_hidden_layers=layers, num_attention_heads=4, num_key_value_heads=2,
                         head_dim=16, max_position_embeddings=1024, sliding_window=None,
                         bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id,
                         pad_token_id=tok.pad_token_id, tie_word_embeddings=False)
    vision = PixtralVisionConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                 num_attention_heads=2, image_size=64, patch_size=8)
    config = Mistral3Config(vision_config=vision, text_config=text, spatial_merge_size=2,
                            image_token_id=tok.convert_tokens_to_ids("[IMG]"),
                            tie_word_embeddings=False)
    torch.manual_seed(seed)
    model = Mistral3ForConditionalGeneration(config).eval()
    with torch.no_grad():
        model.lm_head.weight.mul_(head_scale)
    _save(model, folder)
    tok.save_pretrained(folder)
    PixtralImageProcessorPil(size={"longest_edge": 64}, patch_size={"height": 8, "width": 8}
                             ).save_pretrained(folder)
    (folder / "processor_config.json").write_text(json.dumps(
        {"processor_class": "PixtralProcessor", "patch_size": 8, "spatial_merge_size": 2,
         "image_token": MISTRAL_MARKS[0], "image_break_token": MISTRAL_MARKS[1], "image_end_token": MISTRAL_MARKS[2]}))
    return folder


QWEN3_PIXELS = {"image_mean": [0.5] * 3, "image_std": [0.5] * 3, "patch_size": 16,
           "temporal_patch_size": 2, "merge_size": 2, "resample": 3}


def qwen3_vl(folder: Path, seed: int, layers: int = 2) -> Path:
    """Qwen3-VL with the tinyworld Qwen tokenizer (<|image_pad|>, <|video_pad|>), a 2-layer
    vision tower of 16 px patches feeding deepstack features to decoder layers 0 and 1, a
    64-wide decoder of ``layers`` layers; its LM head scaled up so that T = 1 samples from a
    peaked distribution. Image and video processor settings saved alongside."""
    from transformers import AutoConfig, Qwen3VLConfig, Qwen3VLForConditionalGeneration

    src = AutoConfig.from_pretrained(QWEN_SOURCE)
    t = src.text_config
    text = dict(vocab_size=t.vocab_size, hidden_size=64, intermediate_size=128,
                num_hidden_layers=layers, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                max_position_embeddings=4096, bos_token_id=t.bos_token_id,
                eos_token_id=t.eos_token_id, pad_token_id=t.pad_token_id,
                rope_parameters={"rope_type": "default", "rope_theta": 10000.0,
                                 "mrope_section": [2, 3, 3], "mrope_interleaved": True})
    vision = dict(depth=2, hidden_size=32, intermediate_size=64, num_heads=2, patch_size=16,
                  spatial_merge_size=2, temporal_patch_size=2, out_hidden_size=64,
                  num_position_embeddings=16, deepstack_visual_indexes=[0, 1])
    config = Qwen3VLConfig(text_config=text, vision_config=vision, image_token_id=src.image_token_id,
                           video_token_id=src.video_token_id,
                           vision_start_token_id=src.vision_start_token_id,
                           vision_end_token_id=src.vision_end_token_id)
    torch.manual_seed(seed)
    model = Qwen3VLForConditionalGeneration(config).eval()
    with torch.no_grad():
        model.lm_head.weight.mul_(25)
    _save(model, folder, tuple(f for f in QWEN_FILES if f != "preprocessor_config.json"))
    (folder / "preprocessor_config.json").write_text(json.dumps(
        {**QWEN3_PIXELS, "image_processor_type": "Qwen2VLImageProcessor",
         "size": {"shortest_edge": 1024, "longest_edge": 16384}}))
    (folder / "video_preprocessor_config.json").write_text(json.dumps(
        {**QWEN3_PIXELS, "video_processor_type": "Qwen3VLVideoProcessor",
         "size": {"shortest_edge": 1024, "longest_edge": 4 * 64 * 64}}))
    return folder


def llava(folder: Path, seed: int, layers: int = 3) -> Path:
    """LLaVA-1.5: CLIP tower (32 px images of 16 px patches), an MLP projector, a Llama
    decoder of ``layers`` layers; processor and model configs agree."""
    from transformers import (CLIPImageProcessorPil, CLIPVisionConfig, LlavaConfig,
                              LlavaForConditionalGeneration, LlavaProcessor)

    tok = _tokenizer()
    vision = CLIPVisionConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                              num_attention_heads=2, image_size=32, patch_size=16, projection_dim=32)
    config = LlavaConfig(vision_config=vision, text_config=_llama(tok, layers),
                         image_token_id=tok.convert_tokens_to_ids("<image>"),
                         vision_feature_select_strategy="default", vision_feature_layer=-1)
    torch.manual_seed(seed)
    model = LlavaForConditionalGeneration(config).eval()
    images = CLIPImageProcessorPil(size={"shortest_edge": 32}, crop_size={"height": 32, "width": 32})
    processor = LlavaProcessor(image_processor=images, tokenizer=tok, patch_size=16,
                               vision_feature_select_strategy="default",
                               num_additional_image_tokens=1, chat_template=tok.chat_template)
    _save(model, folder)
    processor.save_pretrained(folder)
    return folder


def hidden_head(folder: Path, target: Path, seed: int = 3, layer: int = -1) -> Path:
    """A random hidden-state head for ``target`` (its widths, vocabulary and model type):
    what `zoo/hidden.py` would train, untrained. Its drafts are poor; verification keeps
    the output the target's."""
    from transformers import AutoConfig

    from vlmspec_cli.runtime.models.hidden_head import HiddenDraftHead, HiddenHeadConfig

    config = AutoConfig.from_pretrained(target)
    text = config.get_text_config()
    torch.manual_seed(seed)
    head = HiddenDraftHead(HiddenHeadConfig(
        hidden_size=text.hidden_size, intermediate_size=text.intermediate_size,
        num_attention_heads=text.num_attention_heads, num_key_value_heads=text.num_key_value_heads,
        rms_norm_eps=text.rms_norm_eps, target_layer=layer, vocab_size=text.vocab_size,
        target_model_type=config.model_type))
    return _save(head.eval(), folder)


def check_hidden_head(target: Path, draft: Path, folder: Path, tree: bool, make_session,
                      requests) -> None:
    """A hidden-state head for this family (random: what zoo/hidden.py would train) reads the
    target's last-layer states at text positions; its chains (``tree`` False) or trees
    decode target-only's tokens. ``make_session(target, draft, method, *sets)``."""
    head = hidden_head(folder / "head", target)
    session = make_session(target, draft, "hidden", f"hidden.model={head}", "hidden.layer=null",
                           f"hidden.tree={str(tree).lower()}", "tree.depth=3", "tree.top_k=2",
                           "tree.total_tokens=6")
    drafted = 0
    for req in requests:
        res = session.engine.generate(req)
        assert res.tokens == session.baseline_engine().generate(req).tokens
        drafted += res.state.stats.num_draft_tokens
    assert drafted > 0


# ------------------------------------------------------------------ the CLI on a family
def _shot(folder: Path, size: tuple[int, int]) -> Path:
    from PIL import Image

    image = folder / "shot.png"
    Image.new("RGB", size, (200, 30, 30)).save(image)
    return image


def check_cli_compare(target: Path, draft: Path, folder: Path, size: tuple[int, int]) -> None:
    """`vlmspec caption IMG --set target.model=DIR --set draft.model=DIR2 --compare`, and the
    same with `--chat` on a conversation with two images in its first turn and one in its
    third: each record holds the target's own output (identical) and acceptance stats."""
    from click.testing import CliRunner
    from PIL import Image

    from vlmspec_cli.cli import cli

    Image.new("RGB", (size[1], size[0]), (20, 160, 60)).save(folder / "other.png")
    chat = folder / "chat.jsonl"
    chat.write_text(json.dumps({"id": "two-images", "messages": [
        {"role": "user", "text": "spot the difference.", "images": ["shot.png", "other.png"]},
        {"role": "assistant", "text": "the colour."},
        {"role": "user", "text": "and here?", "images": ["other.png"]}]}) + "\n")
    for given in ([str(_shot(folder, size))], ["--chat", str(chat)]):
        res = CliRunner().invoke(cli, ["caption", *given, "--set", f"target.model={target}",
                                       "--set", f"draft.model={draft}", "--compare", "--json",
                                       "--max-new-tokens", "8"], catch_exceptions=False)
        assert res.exit_code == 0, res.output
        record = next(json.loads(line) for line in res.stdout.splitlines() if '"input"' in line)
        assert record["compare"]["identical"] is True and record["stats"]["num_drafts"] > 0


def check_offline_profile(profile: str, hub_id: str, folder: Path) -> None:
    """A shipped real-model profile, offline: exit 2 and one line naming the model."""
    from click.testing import CliRunner

    from vlmspec_cli.cli import cli

    res = CliRunner(env={"HF_HUB_OFFLINE": "1"}).invoke(
        cli, ["caption", str(_shot(folder, (40, 24))), "--profile", profile, "-q"])
    assert res.exit_code == 2 and len(res.stderr.strip().splitlines()) == 1, res.stderr
    assert hub_id in res.stderr and "unreachable" in res.stderr


# ------------------------------------------------------------------ T > 0 on a family
def first_token_law(lm, messages, images, sampling) -> torch.Tensor:
    """The model's exact distribution of the first generated token (its prefill logits,
    warped by ``sampling``)."""
    from vlmspec_cli.runtime.round.verify import probabilities

    prompt = lm.adapter.prompt_text(lm, messages)
    logits = lm.adapter.prefill(lm, lm.adapter.encode(lm, prompt, list(images) or None),
                                lm.adapter.new_cache(lm))
    return probabilities(logits[0].float(), sampling).cpu()


def check_first_token_law(target: Path, draft: Path, image: tuple, temperature: float,
                          gamma: int = 2, runs: int = 300) -> int:
    """T > 0, a chain whose draft reads the ``(size, colour)`` image: the first token of
    ``runs`` seeded speculative decodes follows the target's exact law (chi-square over
    the tokens with at least 5 expected draws, the rest pooled); the same counts reject the
    draft's own law, so the check can fail. Returns how many proposals were rejected (the
    residual path ran that often). ``temperature`` makes a random model's law neither too
    flat nor too peaked to test with ``runs`` draws."""
    from PIL import Image
    from scipy.stats import chisquare

    from vlmspec_cli.runtime.request import Message, Request

    session = family_session(target, draft, "chain", "drafting.inputs=[multimodal]",
                             f"drafting.gamma={gamma}", f"sampling.temperature={temperature}")
    images = [Image.new("RGB", *image)]
    messages = [Message("user", "describe the image.", tuple(images))]

    exact = first_token_law(session.target, messages, images, session.sampling)
    draft = first_token_law(session.draft, messages, images, session.sampling)
    assert int((exact * runs >= 5).sum()) >= 5, "too flat or too peaked a law to test: set the temperature"
    counts = torch.zeros_like(exact)
    rejected = 0
    for seed in range(runs):
        res = session.engine.generate(Request(messages, max_new_tokens=2, seed=seed))
        counts[res.tokens[0]] += 1
        rejected += res.state.stats.num_draft_tokens - res.state.stats.num_accepted_tokens

    def pvalue(p):
        big = p * runs >= 5
        obs = torch.cat([counts[big], counts[~big].sum()[None]])
        exp = torch.cat([p[big], p[~big].sum()[None]]) * runs
        return chisquare(obs.numpy(), (exp * obs.sum() / exp.sum()).numpy()).pvalue

    assert pvalue(exact) > 1e-3
    assert pvalue(draft) < 1e-3
    return rejected


# ------------------------------------------------------------------ shared by the family tests
def image_requests(specs, max_new_tokens: int, chat_images: tuple[int, int] = (0, 1)) -> list:
    """One request per ``(size, colour)`` image of ``specs``, then a two-turn chat with the
    images ``chat_images`` (one per turn)."""
    from PIL import Image

    from vlmspec_cli.runtime.request import Message, Request

    imgs = [Image.new("RGB", size, colour) for size, colour in specs]
    singles = [Request([Message("user", "describe the image.", (im,))], max_new_tokens=max_new_tokens)
               for im in imgs]
    first, second = chat_images
    chat = Request([Message("user", "what is in this image?", (imgs[first],)),
                    Message("assistant", "a red thing."),
                    Message("user", "and in this one?", (imgs[second],))], max_new_tokens=max_new_tokens)
    return singles + [chat]


def family_session(target, draft, method: str, *sets: str):
    """A caption session of the default profile with this target, draft and method."""
    from vlmspec_cli.profile import load_profile
    from vlmspec_cli.session import build_session

    # every round drafts γ: these tests check what drafts propose and the target keeps
    # (the shipped auto length switches a draft as dear as the target off)
    return build_session(load_profile("tinyworld-caption", [
        f"target.model={target}", f"draft.model={draft}", f"method={method}",
        "drafting.length=fixed", *sets]))


# the methods with a draft model that families with embedded images run (LLaVA-like)
DRAFTED = [
    ("chain", ["drafting.inputs=[multimodal]"]),
    ("chain", ["drafting.inputs=[text]", "drafting.gamma=3"]),
    ("chain", ["drafting.inputs=[caption]"]),      # the tinyworld captioner writes the caption
    ("tabed", ["drafting.inputs=[multimodal,text]"]),
    ("tree", ["drafting.inputs=[multimodal]", "tree.depth=3", "tree.top_k=2", "tree.total_tokens=6"]),
]
TWIG = ("twig", ["twig.model=none", "twig.layers=1"])   # drafts from the target: no draft model
