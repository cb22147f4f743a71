"""The vocabulary a GGUF file carries under ``tokenizer.ggml.*`` (``llama_vocab::impl::load``)."""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from enum import IntEnum, IntFlag

import numpy as np

from ... import LLMLabError


class TokenType(IntEnum):
    """``tokenizer.ggml.token_type`` values (``llama_token_type``)."""
    UNDEFINED = 0
    NORMAL = 1
    UNKNOWN = 2
    CONTROL = 3
    USER_DEFINED = 4
    UNUSED = 5
    BYTE = 6


class Attr(IntFlag):
    """Token attributes llama.cpp derives from the types (``llama_token_attr``)."""
    UNDEFINED = 0
    UNKNOWN = 1 << 0
    UNUSED = 1 << 1
    NORMAL = 1 << 2
    CONTROL = 1 << 3
    USER_DEFINED = 1 << 4
    BYTE = 1 << 5


_TYPE_TO_ATTR = np.array([Attr.UNDEFINED, Attr.NORMAL, Attr.UNKNOWN, Attr.CONTROL, Attr.USER_DEFINED,
                          Attr.UNUSED, Attr.BYTE], dtype=np.int32)

# llama.cpp's defaults per tokenizer.ggml.model, before the GGUF overrides them
_MODEL_DEFAULTS = {
    "llama": dict(bos=1, eos=2, unk=0, add_space_prefix=True, add_bos=True),        # SPM
    "gpt2": dict(bos=11, eos=11, unk=None, add_space_prefix=False, add_bos=False),  # BPE
}
# llama.cpp's text-based fix-ups (``llama_vocab::impl::load``): tokens that look like end-of-turn,
# fill-in-the-middle or end-of-generation markers are made CONTROL, whatever their GGUF type
_EOT_TEXTS = ("<|eot_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>", "<|endoftext|>", "<|end_of_text|>",
              "<EOT>", "_<EOT>", "[EOT]", "<｜end▁of▁sentence｜>", "<end_of_utterance>")
_FIM_TEXTS = ("<|fim_prefix|>", "<fim-prefix>", "<fim_prefix>", "<｜fim▁begin｜>", "<PRE>", "▁<PRE>", "<|code_prefix|>",
              "<|prefix|>", "<|fim_suffix|>", "<fim-suffix>", "<fim_suffix>", "<｜fim▁hole｜>", "<SUF>", "▁<SUF>",
              "<|code_suffix|>", "<|suffix|>", "<|fim_middle|>", "<fim-middle>", "<fim_middle>", "<｜fim▁end｜>", "<MID>",
              "▁<MID>", "<|code_middle|>", "<|middle|>", "<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<PAD>", "[PAD]",
              "<|fim_repo|>", "<|repo_name|>", "<fim-repo>", "<REPO>", "<reponame>", "<|file_sep|>")
_EOG_TEXTS = ("<|eot_id|>", "<|im_end|>", "<|end|>", "<|return|>", "<|call|>", "<|flush|>", "<|calls|>", "<end_of_turn>",
              "<|endoftext|>", "</s>", "<|eom_id|>", "<EOT>", "_<EOT>", "[EOT]", "[EOS]", "<|end_of_text|>",
              "<end_of_utterance>", "<eos>", "<turn|>", "<|tool_response>", "<｜end▁of▁sentence｜>", "[e~[")
_ALWAYS_RENDERED = ("<|channel|>", "<|message|>", "<|start|>", "<|constrain|>")   # gpt-oss: USER_DEFINED
_SPECIAL_KEYS = ("bos", "eos", "eot", "eom", "unk", "sep", "pad", "mask")
_KEY_NAMES = {"bos": "bos_token_id", "eos": "eos_token_id", "eot": "eot_token_id", "eom": "eom_token_id",
              "unk": "unknown_token_id", "sep": "seperator_token_id", "pad": "padding_token_id",
              "mask": "mask_token_id"}


@dataclass
class Vocab:
    """Tokens, scores, types and merges, with the flags that steer tokenization.

    ``tokens[i]`` is the text of id ``i`` as stored (GPT-2 byte characters for BPE, U+2581 for
    spaces in SPM); ``token_to_id`` is its inverse over *all* tokens, control ones included, as
    llama.cpp's ``text_to_token``; ``merges`` maps "left right" to its rank.
    """
    model: str
    pre: str | None
    tokens: list[str]
    scores: np.ndarray
    types: np.ndarray
    attrs: np.ndarray
    token_to_id: dict[str, int]
    merges: dict[str, int]
    special: dict[str, int | None]
    add_bos: bool
    add_eos: bool
    add_space_prefix: bool
    eog: frozenset[int] = field(default_factory=frozenset)

    def __len__(self) -> int:
        return len(self.tokens)

    @property
    def bos(self) -> int | None:
        return self.special["bos"]

    @property
    def eos(self) -> int | None:
        return self.special["eos"]

    def has_attr(self, i: int, attr: Attr) -> bool:
        return bool(self.attrs[i] & attr)

    def check_ids(self, ids) -> None:
        n = len(self.tokens)
        bad = [i for i in ids if not (isinstance(i, (int, np.integer)) and not isinstance(i, (bool, np.bool_))
                                      and 0 <= i < n)]
        if bad:
            what = "is not an integer" if not isinstance(bad[0], (int, np.integer)) or isinstance(bad[0], (bool, np.bool_)) \
                else "is outside the vocabulary"
            raise LLMLabError(f"token id {bad[0]!r} {what} (ids are integers 0..{n - 1})")

    @property
    def max_token_chars(self) -> int:
        """The most characters of text one token can stand for (its text's length bounds it: a BPE
        token's byte characters, a SentencePiece piece's characters, a byte token's 6)."""
        if getattr(self, "_max_chars", None) is None:
            self._max_chars = max((len(t) for t in self.tokens), default=1) or 1
        return self._max_chars

    @classmethod
    def from_gguf(cls, gguf) -> "Vocab":
        """Read ``tokenizer.ggml.*`` from an open ``llmlab.ggml.gguf.GGUFFile``."""
        from ...ggml.gguf.meta import Metadata
        kv = Metadata.of(gguf)   # type- and range-checked reads (llmlab.ggml.gguf.meta)
        get = lambda k, d=None: kv.get("tokenizer.ggml." + k, d)   # noqa: E731
        model = get("model")
        if model is None:
            raise LLMLabError(f"{gguf.path.name}: no tokenizer.ggml.model: this GGUF carries no tokenizer")
        if model not in _MODEL_DEFAULTS:
            raise LLMLabError(f"unsupported tokenizer model {model!r} (tokenizer.ggml.model); "
                              f"supported: {', '.join(_MODEL_DEFAULTS)}")
        if get("tokens") is None:
            raise LLMLabError(f"{gguf.path.name}: no tokenizer.ggml.tokens")
        n = len(get("tokens"))
        emb = next((t for t in gguf.tensors if t.name == "token_embd.weight"), None)
        if emb is not None and len(emb.shape) >= 2 and emb.shape[1] != n:   # before the strings are decoded
            raise LLMLabError(f"{gguf.path.name}: the tokenizer has {n} tokens but token_embd.weight has "
                              f"{emb.shape[1]} rows")
        tokens = get("tokens").tolist()
        token_to_id = dict(zip(tokens, range(n)))
        if "" in token_to_id:   # llama.cpp names empty tokens [EMPTY_i]
            tokens = [t or f"[EMPTY_{i}]" for i, t in enumerate(tokens)]
            token_to_id = dict(zip(tokens, range(n)))
        if len(token_to_id) != n:
            seen = {}
            for i, t in enumerate(tokens):
                if t in seen:
                    raise LLMLabError(f"duplicate token in vocabulary: {t!r} has ids {seen[t]} and {i}")
                seen[t] = i

        def array(key, dtype, default):
            a = get(key)
            if a is None:
                return np.full(n, default, dtype=dtype)
            a = np.asarray(a)
            if len(a) < n:
                raise LLMLabError(f"tokenizer.ggml.{key} has {len(a)} entries for {n} tokens")
            return a[:n].astype(dtype)

        scores = array("scores", np.float32, 0.0)
        types = array("token_type", np.int32, TokenType.NORMAL)
        for i in np.flatnonzero(types == TokenType.BYTE).tolist():   # their text names their byte: <0xXX>
            t = tokens[i]
            if len(t) != 6 or not t.startswith("<0x") or t[5] != ">" or any(c not in "0123456789abcdefABCDEF" for c in t[3:5]):
                raise LLMLabError(f"token {i} {t!r} has type BYTE, but its text is not of the form <0xXX>")
        attrs = _TYPE_TO_ATTR[np.clip(types, 0, 6)] * ((types >= 0) & (types <= 6))

        merges: dict[str, int] = {}
        if model == "gpt2":
            m = get("merges")
            if m is None:
                raise LLMLabError(f"{gguf.path.name}: BPE tokenizer without tokenizer.ggml.merges")
            m = m.tolist()
            merges = dict(zip(reversed(m), range(len(m) - 1, -1, -1)))   # the first of duplicates wins

        d = _MODEL_DEFAULTS[model]
        special = {k: (d.get(k) if d.get(k) is not None and d.get(k) < n else None) for k in _SPECIAL_KEYS}
        for k in _SPECIAL_KEYS:
            v = get(_KEY_NAMES[k])
            if v is not None and 0 <= int(v) < n:
                special[k] = int(v)

        pre = get("pre")
        add_bos = d["add_bos"]
        if model == "gpt2":
            from .pretokenize import pre_tokenizer
            add_bos = pre_tokenizer(pre).add_bos
        add_bos = bool(get("add_bos_token", add_bos))
        add_eos = bool(get("add_eos_token", False))
        for flag, key in ((add_bos, "bos"), (add_eos, "eos")):
            if flag and special[key] is None:
                raise LLMLabError(f"tokenizer.ggml.add_{key}_token is true, but {_KEY_NAMES[key]} is not set")

        # llama.cpp's text-based fix-ups. (It scans an unordered_map, so when a vocabulary holds several
        # end-of-turn texts, which one becomes eot is unspecified; here the first in _EOT_TEXTS.)
        def find(texts):
            return [token_to_id[t] for t in texts if t in token_to_id]

        if special["eot"] is None and find(_EOT_TEXTS):
            special["eot"] = find(_EOT_TEXTS)[0]
        eog = set(find(_EOG_TEXTS))
        for i in find(_EOT_TEXTS) + find(_FIM_TEXTS) + sorted(eog):
            attrs[i] |= Attr.CONTROL
        for i in find(_ALWAYS_RENDERED):
            attrs[i] = Attr.USER_DEFINED
        t2i = token_to_id
        has_call = "<|call|>" in t2i or "<|calls|>" in t2i
        if "<|end|>" in t2i and has_call and ("<|return|>" in t2i or "<|flush|>" in t2i):
            eog.discard(t2i["<|end|>"])               # o200k_harmony, solar-open
            attrs[t2i["<|end|>"]] = Attr.USER_DEFINED
        if "<|tool_response>" in t2i and "</s>" in t2i:
            eog.discard(t2i["</s>"])                   # gemma 4
            attrs[t2i["</s>"]] = Attr.NORMAL
        for k in ("eos", "eot", "eom"):
            if special[k] is not None:
                eog.add(special[k])
        control = np.flatnonzero(attrs & int(Attr.CONTROL)).tolist()
        unused = [i for i in control if "unused" in tokens[i]]
        attrs[unused] |= int(Attr.UNUSED)

        return cls(model=model, pre=pre, tokens=tokens, scores=scores, types=types, attrs=attrs,
                   token_to_id=token_to_id, merges=merges, special=special, add_bos=add_bos, add_eos=add_eos,
                   add_space_prefix=bool(get("add_space_prefix", d["add_space_prefix"])), eog=frozenset(eog))

    @classmethod
    def from_file(cls, path: str | os.PathLike) -> "Vocab":
        from ...ggml.gguf import GGUFFile
        with GGUFFile(path) as f:
            return cls.from_gguf(f)
