"""vlmspec: lossless speculative decoding for vision-language models."""

__version__ = "0.1.0"
