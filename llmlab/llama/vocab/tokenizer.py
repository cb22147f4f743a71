"""``Tokenizer``: text to ids and back, the way ``llama_tokenize`` / ``llama_detokenize`` do it.

The algorithm comes from a registry keyed by (``tokenizer.ggml.model``, ``tokenizer.ggml.pre``):
``gpt2`` is byte-level BPE with one pre-tokenizer per ``pre`` name, ``llama`` is SentencePiece
(llama.cpp ignores ``pre`` for it).
"""
from __future__ import annotations

import os
from typing import Callable, Iterable

from ... import LLMLabError
from .bpe import BPE
from .pretokenize import PRE_TOKENIZERS
from .special import SpecialTokens
from .spm import SPACE, SPM
from .unicode import unicode_to_bytes
from .vocab import Attr, Vocab

# (model, pre) -> factory(vocab) of an object with .encode(fragment) -> ids; pre None matches any
ALGORITHMS: dict[tuple[str, str | None], Callable[[Vocab], object]] = {}


def register(model: str, pre: str | None, factory: Callable[[Vocab], object]) -> None:
    ALGORITHMS[(model, pre)] = factory


register("llama", None, SPM)
for _name, _pre in PRE_TOKENIZERS.items():
    register("gpt2", _name, lambda vocab, _pre=_pre: BPE(vocab, _pre))
register("gpt2", None, BPE)   # a missing pre falls back to 'default'; an unknown one raises


class Tokenizer:
    """A GGUF model's tokenizer.

    >>> tok = Tokenizer.from_model(models.resolve("smollm2"))     # llmlab.models: a registry name -> its file
    >>> tok.tokenize("Hello world")
    [19556, 905]
    """

    def __init__(self, vocab: Vocab):
        self.vocab = vocab
        pre = vocab.pre or None
        factory = ALGORITHMS.get((vocab.model, pre)) or ALGORITHMS.get((vocab.model, None))
        if factory is None:
            raise LLMLabError(f"no tokenizer for model {vocab.model!r} with pre-tokenizer {pre!r}")
        self.algorithm = factory(vocab)
        self.special_tokens = SpecialTokens(vocab)
        self._pieces: dict[tuple[int, bool], bytes] = {}

    @classmethod
    def from_model(cls, path: str | os.PathLike) -> "Tokenizer":
        """The tokenizer of a .gguf file (``llmlab.models.resolve`` gives a registered model's: the model
        library does not fetch models)."""
        return cls(Vocab.from_file(path))

    @property
    def kind(self) -> str:
        return {"gpt2": "BPE", "llama": "SPM"}.get(self.vocab.model, self.vocab.model)

    def __len__(self) -> int:
        return len(self.vocab)

    def __repr__(self) -> str:
        return f"Tokenizer({self.kind}, pre={self.vocab.pre!r}, n_vocab={len(self.vocab)})"

    # -- text -> ids -------------------------------------------------------
    def fragments(self, text: str, special: bool = False) -> list[str | int]:
        """The partition step: raw text pieces and special-token ids."""
        return self.special_tokens.partition(text, special)

    def tokenize(self, text: str, add_bos: bool = False, special: bool = False) -> list[int]:
        """Token ids of ``text``.

        ``add_bos``: add the model's BOS (and EOS) where its GGUF asks for them (``add_special``);
        ``special``: recognise control tokens written in the text (``parse_special``).
        """
        if not isinstance(text, str):
            raise TypeError(f"tokenize expects str, got {type(text).__name__}")
        try:
            text.encode("utf-8")
        except UnicodeEncodeError as e:
            raise LLMLabError(f"text is not valid Unicode: {e.reason} at character {e.start}") from None
        v, out = self.vocab, []
        if add_bos and v.add_bos:
            out.append(v.bos)
        encode, spm = self.algorithm.encode, v.model == "llama"
        prev_special = True
        for frag in self.fragments(text, special):
            if isinstance(frag, int):
                out.append(frag)
                prev_special = True
                continue
            if spm:
                if v.add_space_prefix and prev_special:
                    frag = " " + frag
                frag = frag.replace(" ", SPACE)
            out += encode(frag)
            prev_special = False
        if add_bos and v.add_eos:
            out.append(v.eos)
        return out

    # -- ids -> text -------------------------------------------------------
    def token_to_piece(self, token: int, special: bool = True) -> bytes:
        """The bytes one token stands for (``llama_token_to_piece``); control tokens are empty
        unless ``special``."""
        key = (token, special)
        piece = self._pieces.get(key)
        if piece is None:
            self.vocab.check_ids([token])
            piece = self._pieces[key] = self._piece(token, special)
        return piece

    def _piece(self, token: int, special: bool) -> bytes:
        v = self.vocab
        attr, text = int(v.attrs[token]), v.tokens[token]
        if attr & (Attr.UNKNOWN | Attr.CONTROL):
            return text.encode() if special else b""
        if attr & Attr.USER_DEFINED:
            return text.encode()
        if attr & Attr.BYTE:
            return bytes([int(text[3:5], 16)])
        if attr & Attr.NORMAL:
            if v.model == "gpt2":
                dec = unicode_to_bytes()
                try:
                    return bytes(dec[c] for c in text)
                except KeyError:
                    return b"".join(bytes([dec[c]]) if c in dec else
                                    b"[UNK_BYTE_0x" + c.encode().hex().encode() + text.encode() + b"]" for c in text)
            return text.replace(SPACE, " ").encode()
        return b""

    def detokenize_bytes(self, ids: Iterable[int], special: bool = False, remove_special: bool = False) -> bytes:
        """``llama_detokenize``: concatenated pieces, the SPM leading space dropped, BPE spaces cleaned."""
        v = self.vocab
        ids = list(ids)
        v.check_ids(ids)
        remove_space = v.add_space_prefix
        if remove_special and v.add_bos and ids and ids[0] == v.bos:
            remove_space, ids = False, ids[1:]
        if remove_special and v.add_eos and ids and ids[-1] == v.eos:
            ids = ids[:-1]
        parts = [self.token_to_piece(i, special) for i in ids]
        if remove_space and parts and parts[0][:1] == b" ":
            parts[0] = parts[0][1:]
        out = b"".join(parts)
        if getattr(getattr(self.algorithm, "pre", None), "clean_spaces", False):
            out = clean_spaces(out)
        return out

    def detokenize(self, ids: Iterable[int], special: bool = False) -> str:
        """Text of ``ids``; bytes that are not valid UTF-8 (a cut multi-byte character) become U+FFFD."""
        return self.detokenize_bytes(ids, special).decode("utf-8", errors="replace")


def clean_spaces(text: bytes) -> bytes:
    """llama.cpp's three ``clean_spaces`` passes over the detokenized bytes (BPE models such as GPT-2)."""
    t = bytearray(text)
    out = t[:1]
    for i in range(1, len(t)):   # " ?" " !" " ." " ," lose the space
        if t[i - 1] == 0x20 and t[i] in b"?!.,":
            out.pop()
        out.append(t[i])
    t, out, i = out, out[:1], 1
    while i < len(t):            # " ' " -> "'"
        x = t[i]
        if x == 0x27 and i + 1 < len(t) and t[i - 1] == 0x20 and t[i + 1] == 0x20:
            out.pop()
            t[i + 1] = 0         # as llama.cpp, which writes '\0' over the skipped space
            i += 1
        out.append(x)
        i += 1
    t, out = out, out[:1]
    for i in range(1, len(t)):   # " 's" " 'm" " 're" " 've" lose the space; " 't" " 'd" " 'll" keep it
        if t[i - 1] == 0x20 and t[i] == 0x27 and i + 1 < len(t):
            x1 = t[i + 1]
            if x1 in b"sm" or (x1 not in b"td" and i + 2 < len(t) and bytes(t[i + 1:i + 3]) in (b"re", b"ve")):
                out.pop()
        out.append(t[i])
    return bytes(out)
