"""Code point classes as llama.cpp sees them (``src/unicode.cpp``), and GPT-2's byte-to-unicode map.

llama.cpp does not ask the C library or a regex engine what a letter is: it looks code points up
in its own tables (``unicode_cpt_flags_from_cpt``). Pre-tokenizer regexes are then either
hand-written loops over those flags (the GPT-2 and Llama 3 patterns) or ``std::regex`` run on a
"collapsed" copy of the text where every non-ASCII code point is replaced by one byte standing
for its class. Both views agree on the classes below, so llmlab builds Python ``re`` character
classes from the same tables and gets the same splits.
"""
from __future__ import annotations

from functools import lru_cache

import numpy as np

from . import unicode_data

UNDEFINED, NUMBER, LETTER, SEPARATOR, ACCENT_MARK, PUNCTUATION, SYMBOL, CONTROL = (1 << i for i in range(8))
CATEGORY_NAMES = {UNDEFINED: "undefined", NUMBER: "number", LETTER: "letter", SEPARATOR: "separator",
                  ACCENT_MARK: "accent mark", PUNCTUATION: "punctuation", SYMBOL: "symbol", CONTROL: "control"}
MAX_CODEPOINTS = 0x110000
WHITESPACE = frozenset(unicode_data.WHITESPACE)


@lru_cache(maxsize=None)
def flags_table() -> np.ndarray:
    """uint16 flags of every code point (``unicode_cpt_flags_array``, category bits only)."""
    starts = np.array(unicode_data.RANGE_STARTS, dtype=np.int64)
    flags = np.array(unicode_data.RANGE_FLAGS, dtype=np.uint16)
    return np.repeat(flags[:-1], np.diff(starts))


def category(cpt: int) -> str:
    """'letter', 'number', ... or 'whitespace' for one code point, as llama.cpp classifies it."""
    if cpt in WHITESPACE:
        return "whitespace"
    if not 0 <= cpt < MAX_CODEPOINTS:
        return "undefined"
    return CATEGORY_NAMES.get(int(flags_table()[cpt]), "undefined")


def _ranges(mask: np.ndarray) -> list[tuple[int, int]]:
    edges = np.flatnonzero(np.diff(np.concatenate(([0], mask.view(np.int8), [0]))))
    return list(zip(edges[0::2].tolist(), (edges[1::2] - 1).tolist()))


def _esc(c: int) -> str:
    return f"\\U{c:08x}"


@lru_cache(maxsize=None)
def char_class(*names: str) -> str:
    """Body of a regex character class (no brackets) for the union of the named classes.

    Names: 'L' letters, 'N' numbers, 'P' punctuation, 'M' accent marks, 'S' symbols, 'W' whitespace.
    A whitespace code point belongs to 'W' only, as in llama.cpp's collapsed text.
    """
    bits = {"L": LETTER, "N": NUMBER, "P": PUNCTUATION, "M": ACCENT_MARK, "S": SYMBOL}
    table = flags_table()
    mask = np.zeros(MAX_CODEPOINTS, dtype=bool)
    for n in names:
        if n == "W":
            mask[list(WHITESPACE)] = True
        else:
            mask |= (table & bits[n]) != 0
    if "W" not in names:
        mask[list(WHITESPACE)] = False
    return "".join(_esc(a) if a == b else f"{_esc(a)}-{_esc(b)}" for a, b in _ranges(mask))


@lru_cache(maxsize=None)
def bytes_to_unicode() -> tuple[str, ...]:
    """GPT-2's reversible byte -> printable character map (``unicode_byte_to_utf8_map``)."""
    keep = [*range(0x21, 0x7F), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    table, n = {b: chr(b) for b in keep}, 0
    for b in range(256):
        if b not in table:
            table[b] = chr(256 + n)
            n += 1
    return tuple(table[b] for b in range(256))


@lru_cache(maxsize=None)
def unicode_to_bytes() -> dict[str, int]:
    return {c: b for b, c in enumerate(bytes_to_unicode())}


@lru_cache(maxsize=None)
def byte_encoder() -> dict[int, str]:
    """For ``str.translate`` of a latin-1 decoded byte string into GPT-2's byte characters."""
    return dict(enumerate(bytes_to_unicode()))
