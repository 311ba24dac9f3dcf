"""Tokenizers (px::text): SentencePiece `.model` files and byte-level BPE `tokenizer.json`."""

from ._core import Tokenizer, load_tokenizer, train_sentencepiece  # noqa: F401
