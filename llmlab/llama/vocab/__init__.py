"""Tokenizers rebuilt from the GGUF vocabulary, exact to llama.cpp's ids.

``Tokenizer.from_model(models.resolve("smollm2")).tokenize("Hello world")`` -> ``[19556, 905]``.
Modules: ``vocab`` (the GGUF metadata), ``special`` (special-token partition), ``pretokenize``
(BPE regex families), ``bpe`` and ``spm`` (the two merge algorithms), ``stream`` (incremental
detokenizer), ``unicode`` (llama.cpp's code point classes).
"""
from .tokenizer import ALGORITHMS, Tokenizer, register
from .vocab import Attr, TokenType, Vocab

__all__ = ["Tokenizer", "Vocab", "TokenType", "Attr", "ALGORITHMS", "register"]
