"""BPE pre-tokenizers: the regex families llama.cpp picks by ``tokenizer.ggml.pre`` (``llm_tokenizer_bpe``).

A pre-tokenizer is a list of regexes applied in sequence: each one splits every segment left by
the previous one into its matches and the text between them (``unicode_regex_split``). BPE merges
then never cross a segment boundary, which is what makes the words cacheable.

The patterns are llama.cpp's, written with placeholders for its code point classes: ``{L}``
letters, ``{N}`` numbers, ``{P}`` punctuation, ``{W}`` whitespace (see ``unicode.py``).
llama.cpp runs the GPT-2 and Llama 3 patterns as hand-written loops over code point flags
(``unicode_regex_split_custom_gpt2/llama3``); those loops implement exactly these regexes,
including ``\\s+(?!\\S)`` leaving the last space of a run for the next word.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from functools import cached_property

from ... import LLMLabError
from .unicode import char_class

_CONTRACTIONS = "'s|'t|'re|'ve|'m|'ll|'d"
_CONTRACTIONS_CI = "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])"

GPT2 = _CONTRACTIONS + r"| ?[{L}]+| ?[{N}]+| ?[^{W}{L}{N}]+|[{W}]+(?![^{W}])|[{W}]+"
LLAMA3 = (_CONTRACTIONS_CI + r"|[^\r\n{L}{N}]?[{L}]+|[{N}]{{1,3}}| ?[^{W}{L}{N}]+[\r\n]*|[{W}]*[\r\n]+"
          r"|[{W}]+(?![^{W}])|[{W}]+")
QWEN2 = (_CONTRACTIONS_CI + r"|[^\r\n{L}{N}]?[{L}]+|[{N}]| ?[^{W}{L}{N}]+[\r\n]*|[{W}]*[\r\n]+"
         r"|[{W}]+(?![^{W}])|[{W}]+")


@dataclass(frozen=True)
class PreTokenizer:
    """One ``LLAMA_VOCAB_PRE_TYPE_*``: its regexes and the vocabulary flags llama.cpp sets with it."""
    name: str
    patterns: tuple[str, ...]
    clean_spaces: bool = True       # detokenizer removes " ." style spaces
    ignore_merges: bool = False     # a word that is already a token is not merged
    add_bos: bool = False           # default when the GGUF has no add_bos_token

    @cached_property
    def compiled(self) -> tuple[re.Pattern, ...]:
        classes = {k: char_class(k) for k in "LNPW"}
        return tuple(re.compile(p.format(**classes)) for p in self.patterns)

    def split(self, text: str) -> list[str]:
        """The words of ``text`` (``unicode_regex_split`` before byte encoding)."""
        segments = [text] if text else []
        for rx in self.compiled:
            out = []
            for seg in segments:
                at = 0
                for m in rx.finditer(seg):
                    s, e = m.span()
                    if s > at:
                        out.append(seg[at:s])
                    out.append(seg[s:e])
                    at = e
                if at < len(seg):
                    out.append(seg[at:])
            segments = out
        return segments


class _SmolLM(PreTokenizer):
    """``\\p{N}`` then GPT-2: every digit stands alone. One fused regex does both in a single pass:
    digits match first, and a whitespace run before a digit counts as ending its segment."""

    @cached_property
    def fused(self) -> re.Pattern:
        c = {k: char_class(k) for k in "LNW"}
        return re.compile((r"[{N}]|" + _CONTRACTIONS + r"| ?[{L}]+| ?[^{W}{L}{N}]+|[{W}]+(?![^{W}{N}])|[{W}]+")
                          .format(**c))

    def split(self, text: str) -> list[str]:
        return self.fused.findall(text)


PRE_TOKENIZERS: dict[str, PreTokenizer] = {}


def register(pre: PreTokenizer, *aliases: str) -> PreTokenizer:
    for name in (pre.name, *aliases):
        PRE_TOKENIZERS[name] = pre
    return pre


register(PreTokenizer("default", (r"[{P}\$\+<=>\^~\|]+", GPT2, r"[{N}]+", r"[0-9][0-9][0-9]")))
register(PreTokenizer("gpt-2", (GPT2,)), "phi-2", "jina-es", "jina-de", "gigachat", "jina-v2-es", "jina-v2-de",
         "a.x-4.0", "mellum", "modern-bert", "mpt", "olmo", "jais", "exaone4")
register(_SmolLM("smollm", (r"[{N}]", GPT2), clean_spaces=False), "command-r")
register(PreTokenizer("starcoder", (r"[{N}]", GPT2)), "refact", "codeshell", "exaone", "minerva-7b", "mellum2")
register(PreTokenizer("llama3", (LLAMA3,), ignore_merges=True, add_bos=True),
         "llama-v3", "llama-bpe", "falcon3", "falcon-h1", "pixtral", "midm-2.0", "lfm2")
register(PreTokenizer("dbrx", (LLAMA3,)), "smaug-bpe")
register(PreTokenizer("qwen2", (QWEN2,), clean_spaces=False), "deepseek-r1-qwen", "megrez")
register(PreTokenizer("stablelm2", (QWEN2,)), "hunyuan")


def pre_tokenizer(name: str | None) -> PreTokenizer:
    if not name:
        name = "default"   # llama.cpp warns "missing pre-tokenizer type, using: 'default'"
    try:
        return PRE_TOKENIZERS[name]
    except KeyError:
        raise LLMLabError(f"unsupported pre-tokenizer {name!r} (tokenizer.ggml.pre); "
                          f"supported: {', '.join(sorted(PRE_TOKENIZERS))}") from None
