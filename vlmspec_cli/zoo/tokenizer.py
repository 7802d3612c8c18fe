"""Offline tokenizer for the tinyworld models.

A byte-level BPE trained on tinyworld text, wrapped in ``PreTrainedTokenizerFast`` so it
saves and loads with ``from_pretrained`` like any hub tokenizer. Byte-level means any user
prompt can be encoded (no unknown tokens); the world's words become single tokens.
"""

from __future__ import annotations

from collections.abc import Iterable

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

PAD, BOS, EOS, UNK, IMAGE = "<pad>", "<s>", "</s>", "<unk>", "<image>"
SPECIAL_TOKENS = [PAD, BOS, EOS, UNK, IMAGE]

# LLaVA-1.5 style conversation: "USER: <image>\n... ASSISTANT: ...</s>".
# Images of a user turn come first, one "<image>\n" each (the processor expands every
# "<image>" into the vision tower's patch count).
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{% if message['role'] == 'user' %}USER: "
    "{% if message['content'] is string %}{{ message['content'] }}"
    "{% else %}"
    "{% for part in message['content'] %}{% if part['type'] == 'image' %}<image>\n{% endif %}{% endfor %}"
    "{% for part in message['content'] %}{% if part['type'] == 'text' %}{{ part['text'] }}{% endif %}{% endfor %}"
    "{% endif %} "
    "{% else %}ASSISTANT: "
    "{% if message['content'] is string %}{{ message['content'] }}"
    "{% else %}{% for part in message['content'] %}{% if part['type'] == 'text' %}{{ part['text'] }}{% endif %}{% endfor %}"
    "{% endif %}</s>"
    "{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}ASSISTANT:{% endif %}"
)


def train_tokenizer(lines: Iterable[str], vocab_size: int = 512) -> PreTrainedTokenizerFast:
    """Train a byte-level BPE on ``lines`` and wrap it as a transformers tokenizer."""
    bpe = Tokenizer(models.BPE(unk_token=None))
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    chat_words = ["USER:", " ASSISTANT:", " ASSISTANT: ", "\n"]
    bpe.train_from_iterator(list(lines) + chat_words * 50, trainer=trainer)
    tok = PreTrainedTokenizerFast(
        tokenizer_object=bpe,
        bos_token=BOS,
        eos_token=EOS,
        unk_token=UNK,
        pad_token=PAD,
        extra_special_tokens={"image_token": IMAGE},
        chat_template=CHAT_TEMPLATE,
        model_max_length=2048,
        padding_side="left",
    )
    return tok
