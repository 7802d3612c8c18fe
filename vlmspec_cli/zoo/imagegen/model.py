"""The tinyworld Janus models: tokenizer, the prompt contract, and the model configs.

Prompt contract: ``tok("<s>" + prompt, add_special_tokens=False).input_ids + [BOI]``, then
64 image tokens; classifier-free guidance rows replace every token but BOS / BOI with
``<pad>`` (``unconditional``), as Janus does.
"""

from __future__ import annotations

import random

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import (
    JanusConfig,
    JanusForConditionalGeneration,
    JanusVisionConfig,
    JanusVQVAEConfig,
    LlamaConfig,
    PreTrainedTokenizerFast,
)

from vlmspec_cli.zoo.imagegen.scenes import (
    CODE_DIM, CODEBOOK, IMAGE_PX, NUM_IMAGE_TOKENS, PATCH, sample_prompt_scene,
)
from vlmspec_cli.zoo.tokenizer import BOS, EOS, IMAGE, PAD, UNK

BOI = "<begin_of_image>"
# CFG scale for generate: the unconditional rows do not know the shape colour, so guidance
# multiplies that colour's codes by ~8**(g-1) everywhere; at g=3 stray shape patches appeared
# all over (32% of greedy images matched), at 1.5-1.75 88-98% did
GUIDANCE = 1.5
CHAT_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}{% if message['role'] == 'user' %}"
    "{% if message['content'] is string %}{{ message['content'] }}{% else %}"
    "{% for part in message['content'] %}{% if part['type'] == 'text' %}{{ part['text'] }}"
    "{% endif %}{% endfor %}{% endif %}{% endif %}{% endfor %}"
)
TARGET_TEXT = dict(hidden_size=128, intermediate_size=384, num_hidden_layers=6,
                   num_attention_heads=4, num_key_value_heads=4)
DRAFT_TEXT = dict(hidden_size=128, intermediate_size=256, num_hidden_layers=1,
                  num_attention_heads=4, num_key_value_heads=4)
# GroupNorm has 32 groups: with 32 channels each group is one channel and normalising it over
# the image erases a flat image's absolute colour, so 64 channels (groups of 2) throughout;
# num_res_blocks=0 (encoder: convs only; decoder: one block per level) keeps it fast on CPU
VQ = dict(embed_dim=CODE_DIM, num_embeddings=CODEBOOK, latent_channels=64, base_channels=64,
          channel_multiplier=(1, 1, 1), num_res_blocks=0)



# ----------------------------------------------------------------------------- tokenizer

def make_tokenizer(seed: int = 0, vocab_size: int = 384) -> PreTrainedTokenizerFast:
    """Byte-level BPE on the prompts (as ``tokenizer.train_tokenizer``), with ``<begin_of_image>``."""
    rng = random.Random(seed)
    lines = [sample_prompt_scene(rng)[0] for _ in range(20000)]
    bpe = Tokenizer(models.BPE(unk_token=None))
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=True)  # 'blue' = ' blue'
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=[PAD, BOS, EOS, UNK, IMAGE, BOI],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    bpe.train_from_iterator(lines, trainer=trainer)
    return PreTrainedTokenizerFast(
        tokenizer_object=bpe, bos_token=BOS, eos_token=EOS, unk_token=UNK, pad_token=PAD,
        extra_special_tokens={"image_token": IMAGE, "boi_token": BOI},
        chat_template=CHAT_TEMPLATE, model_max_length=2048, padding_side="left")


def prompt_ids(tok, prompt: str) -> list[int]:
    """The contract: ``<s> prompt`` (no other special tokens) followed by BOI."""
    return tok(BOS + prompt, add_special_tokens=False).input_ids + [tok.convert_tokens_to_ids(BOI)]


def unconditional(ids: torch.Tensor, tok) -> torch.Tensor:
    """Janus CFG rows: every token that is neither BOS nor BOI becomes ``<pad>``."""
    keep = (ids == tok.bos_token_id) | (ids == tok.convert_tokens_to_ids(BOI))
    return torch.where(keep, ids, torch.full_like(ids, tok.pad_token_id))


# ----------------------------------------------------------------------------- models

def make_model(tok, text: dict, seed: int) -> JanusForConditionalGeneration:
    torch.manual_seed(seed)
    hidden = text["hidden_size"]
    text_config = LlamaConfig(vocab_size=len(tok), max_position_embeddings=256,
                              bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id,
                              pad_token_id=tok.pad_token_id, **text)
    # the understanding tower is unused (image generation only), so it is tiny
    vision_config = JanusVisionConfig(hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                                      image_size=IMAGE_PX, patch_size=PATCH, projection_dim=hidden,
                                      num_image_tokens=NUM_IMAGE_TOKENS, mlp_ratio=2.0)
    vq_config = JanusVQVAEConfig(**VQ, projection_dim=hidden, image_token_embed_dim=hidden)
    config = JanusConfig(text_config=text_config, vision_config=vision_config, vq_config=vq_config,
                         image_token_id=tok.image_token_id)
    model = JanusForConditionalGeneration(config)
    gc = model.generation_config
    gc.bos_token_id, gc.pad_token_id, gc.eos_token_id = tok.bos_token_id, tok.pad_token_id, tok.eos_token_id
    gc.generation_kwargs = {"boi_token_id": tok.convert_tokens_to_ids(BOI)}
    gc.guidance_scale = GUIDANCE
    gc.max_length = 128
    gc._from_model_config = False  # else from_pretrained drops generation_kwargs (boi_token_id)
    return model
