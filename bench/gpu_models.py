"""Random-weight models at real shapes for bench/gpu.py, built in memory on the device.

No hub is reachable where the GPU runs, and a 7B checkpoint would not travel anyway, so the
shapes come from the published configs (written out below, with the model each one
mirrors) and the weights are transformers' own random initialisation. Speed depends on
shapes, not on weight values; acceptance does (random drafts are rejected almost always),
which is why bench/gpu.py projects speedups with Eq. 1' at the τ the papers report
instead of measuring τ here.

The models are real transformers classes wrapped in vlmspec's ``LoadedModel`` with a small
offline tokenizer whose special tokens sit at the ids the configs name, so the engine,
the family adapters and the fast path run on them exactly as on a checkpoint loaded by
``from_pretrained``. ``tiny=True`` builds the same structures at toy widths, for the CPU
(tests/test_gpu_bench.py runs it so this script cannot rot between GPU sessions).
"""

from __future__ import annotations

import torch
from tokenizers import AddedToken, Tokenizer, models, pre_tokenizers
from transformers import (CLIPImageProcessor, CLIPVisionConfig, LlamaConfig, LlamaForCausalLM,
                          LlavaConfig, LlavaForConditionalGeneration, LlavaProcessor,
                          PreTrainedTokenizerFast, Qwen2_5_VLConfig,
                          Qwen2_5_VLForConditionalGeneration)

from vlmspec_cli.runtime.adapters import adapter_for
from vlmspec_cli.runtime.models.hidden_head import HiddenDraftHead, HiddenHeadConfig
from vlmspec_cli.runtime.models.loading import LoadedModel, use_fast_path

SPECIALS = ["<unk>", "<s>", "</s>", "<pad>", "<image>", "<|image_pad|>", "<|video_pad|>",
            "<|vision_start|>", "<|vision_end|>", "<|im_start|>", "<|im_end|>"]
WORDS = ("describe the image in detail . what is shown ? USER: ASSISTANT: user assistant "
         "a red circle on blue square").split()
VOCAB = {t: i for i, t in enumerate(SPECIALS + WORDS)}
IDS = {"bos": 1, "eos": 2, "pad": 3, "image": 4, "qwen_image": 5, "qwen_video": 6,
       "vision_start": 7, "vision_end": 8}

LLAVA_TEMPLATE = ("{% for m in messages %}{{ m['role'] | upper }}: {% for c in m['content'] %}"
                  "{% if c['type'] == 'image' %}<image>\n{% else %}{{ c['text'] }}{% endif %}"
                  "{% endfor %} {% endfor %}{% if add_generation_prompt %}ASSISTANT:{% endif %}")
QWEN_TEMPLATE = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{% for c in m['content'] %}"
                 "{% if c['type'] == 'image' %}<|vision_start|><|image_pad|><|vision_end|>"
                 "{% elif c['type'] == 'video' %}<|vision_start|><|video_pad|><|vision_end|>"
                 "{% else %}{{ c['text'] }}{% endif %}{% endfor %}<|im_end|>\n{% endfor %}"
                 "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


def tokenizer(family: str) -> PreTrainedTokenizerFast:
    """A word-level tokenizer made here (no download): the special tokens at ``IDS``."""
    tk = Tokenizer(models.WordLevel(VOCAB, unk_token="<unk>"))
    tk.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tk.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in SPECIALS])
    extra = ({"image_token": "<image>"} if family == "llava"
             else {"image_token": "<|image_pad|>", "video_token": "<|video_pad|>"})
    return PreTrainedTokenizerFast(
        tokenizer_object=tk, bos_token="<s>", eos_token="</s>", unk_token="<unk>",
        pad_token="<pad>", extra_special_tokens=extra,
        chat_template=LLAVA_TEMPLATE if family == "llava" else QWEN_TEMPLATE)


def _llama(tiny: bool, **real) -> dict:
    base = dict(rms_norm_eps=1e-5, rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
                bos_token_id=IDS["bos"], eos_token_id=IDS["eos"], pad_token_id=IDS["pad"],
                tie_word_embeddings=False)
    if tiny:
        real = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                    num_attention_heads=4, num_key_value_heads=4, vocab_size=512,
                    max_position_embeddings=4096)
    return base | real


def llava_config(tiny: bool) -> LlavaConfig:
    """llava-hf/llava-1.5-7b-hf: Vicuna-7B (32 layers, 4096 wide, vocabulary 32064) under a
    CLIP ViT-L/14 tower at 336 px (576 patch tokens), feature layer -2."""
    text = _llama(tiny, hidden_size=4096, intermediate_size=11008, num_hidden_layers=32,
                  num_attention_heads=32, num_key_value_heads=32, vocab_size=32064,
                  max_position_embeddings=4096)
    vision = (dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                   num_attention_heads=2, image_size=56, patch_size=14, projection_dim=32)
              if tiny else
              dict(hidden_size=1024, intermediate_size=4096, num_hidden_layers=24,
                   num_attention_heads=16, image_size=336, patch_size=14, projection_dim=768))
    return LlavaConfig(text_config=LlamaConfig(**text), vision_config=CLIPVisionConfig(**vision),
                       image_token_id=IDS["image"], projector_hidden_act="gelu",
                       vision_feature_layer=-2, vision_feature_select_strategy="default",
                       tie_word_embeddings=False)


def llama68m_config(tiny: bool) -> LlamaConfig:
    """JackFram/llama-68m, TABED's base draft: 2 layers, 768 wide, vocabulary 32000."""
    return LlamaConfig(**_llama(tiny, hidden_size=768, intermediate_size=3072,
                                num_hidden_layers=2, num_attention_heads=12,
                                num_key_value_heads=12, vocab_size=32000,
                                max_position_embeddings=4096))


def qwen25_config(tiny: bool) -> Qwen2_5_VLConfig:
    """Qwen/Qwen2.5-VL-7B-Instruct: 28 layers, 3584 wide, 4 KV heads, vocabulary 152064,
    M-RoPE sections 16/24/24; a 32-block ViT (1280 wide, window attention, full attention
    in blocks 7/15/23/31) merging 2x2 patches of 14 px."""
    if tiny:
        text = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                    num_attention_heads=4, num_key_value_heads=2, vocab_size=512,
                    rope_parameters={"rope_type": "default", "rope_theta": 10000.0,
                                     "mrope_section": [2, 3, 3]})
        vision = dict(depth=2, hidden_size=32, intermediate_size=64, num_heads=2,
                      out_hidden_size=64, fullatt_block_indexes=[1])
    else:
        text = dict(hidden_size=3584, intermediate_size=18944, num_hidden_layers=28,
                    num_attention_heads=28, num_key_value_heads=4, vocab_size=152064,
                    rope_parameters={"rope_type": "default", "rope_theta": 1000000.0,
                                     "mrope_section": [16, 24, 24]})
        vision = dict(depth=32, hidden_size=1280, intermediate_size=3420, num_heads=16,
                      out_hidden_size=3584, fullatt_block_indexes=[7, 15, 23, 31])
    text.update(rms_norm_eps=1e-6, max_position_embeddings=32768, use_sliding_window=False,
                sliding_window=None, bos_token_id=IDS["bos"], eos_token_id=IDS["eos"],
                pad_token_id=IDS["pad"])
    vision.update(patch_size=14, spatial_merge_size=2, temporal_patch_size=2, window_size=112,
                  hidden_act="silu", in_channels=3)
    return Qwen2_5_VLConfig(text_config=text, vision_config=vision, image_token_id=IDS["qwen_image"],
                            video_token_id=IDS["qwen_video"],
                            vision_start_token_id=IDS["vision_start"],
                            vision_end_token_id=IDS["vision_end"], tie_word_embeddings=False)


def hidden_head_config(target_config, tiny: bool) -> HiddenHeadConfig:
    """A one-layer HiViS/Sparrow head at the target's width (one decoder layer of the
    target's shape), reading the second-to-last layer as Sparrow does."""
    t = target_config.get_text_config()
    return HiddenHeadConfig(hidden_size=t.hidden_size, intermediate_size=t.intermediate_size,
                            num_hidden_layers=1, num_attention_heads=t.num_attention_heads,
                            num_key_value_heads=t.num_key_value_heads, target_layer=-2,
                            max_steps=0, vocab_size=t.vocab_size,
                            rope_theta=1000000.0 if not tiny else 10000.0)


def build(cls, config, device, dtype):
    """``cls`` at random initialisation, allocated on ``device`` in ``dtype`` (never on the
    CPU first: a 7B model would take minutes there)."""
    torch.manual_seed(0)
    with torch.device(device):
        model = cls._from_config(config, dtype=dtype)
    return model.eval()


def loaded(name: str, model, tok, processor, device, dtype, headroom: int) -> LoadedModel:
    """``model`` as vlmspec's runtime holds a loaded checkpoint, on the fast path."""
    adapter = adapter_for(model.config, "target")
    lm = LoadedModel(name, model, processor, tok, adapter, torch.device(device), dtype)
    use_fast_path(lm, "on")
    lm.fast.headroom = headroom
    return lm


def llava_pair(device, dtype, tiny: bool, headroom: int):
    """(target, draft): LLaVA-1.5-7B and the 68M LLaMA draft, sharing one tokenizer."""
    tok = tokenizer("llava")
    config = llava_config(tiny)
    size = config.vision_config.image_size
    images = CLIPImageProcessor(size={"shortest_edge": size},
                                crop_size={"height": size, "width": size})
    processor = LlavaProcessor(image_processor=images, tokenizer=tok, patch_size=14,
                               vision_feature_select_strategy="default",
                               num_additional_image_tokens=1, chat_template=LLAVA_TEMPLATE)
    target = loaded("llava-1.5-7b (random weights)", build(LlavaForConditionalGeneration, config,
                                                           device, dtype),
                    tok, processor, device, dtype, headroom)
    draft = loaded("llama-68m (random weights)", build(LlamaForCausalLM, llama68m_config(tiny),
                                                       device, dtype),
                   tok, None, device, dtype, headroom)
    return target, draft


def qwen_target(device, dtype, tiny: bool, headroom: int, max_visual_tokens: int):
    """Qwen2.5-VL-7B with its images patchified by the adapter (no HF processor), allowed
    up to ``max_visual_tokens`` per image."""
    tok = tokenizer("qwen")
    config = qwen25_config(tiny)
    lm = loaded("qwen2.5-vl-7b (random weights)", build(Qwen2_5_VLForConditionalGeneration,
                                                        config, device, dtype),
                tok, None, device, dtype, headroom)
    settings = dict(lm.adapter.vision_defaults)
    settings.update(max_pixels=max_visual_tokens * 28 * 28, min_pixels=56 * 56, patch=14,
                    temporal=2, merge=2)
    lm.memo["qwen_vision"] = settings   # the adapter's cache of the vision settings
    return lm


def hidden_head(target, tiny: bool):
    head = build(HiddenDraftHead, hidden_head_config(target.model.config, tiny), target.device,
                 target.dtype)
    return head
