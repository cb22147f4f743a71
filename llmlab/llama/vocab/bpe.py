"""Byte-level BPE (``tokenizer.ggml.model = gpt2``), as ``llm_tokenizer_bpe_session`` runs it.

1. The pre-tokenizer cuts the text into words (``pretokenize.py``).
2. Each word's UTF-8 bytes become GPT-2 byte characters, one symbol per byte ("Ġ" is a space).
3. Adjacent symbol pairs found in the merge list go into a priority queue keyed by merge rank;
   the lowest rank is merged first (the leftmost on ties), stale entries are skipped, and the
   new symbol's pairs with its neighbours are queued.
4. Each final symbol is looked up in the vocabulary (a symbol without an id falls back to its
   single-byte tokens).

Words repeat, so step 3 is cached per word: that cache is most of the speed.
"""
from __future__ import annotations

import heapq
from dataclasses import dataclass

from .pretokenize import PreTokenizer, pre_tokenizer
from .unicode import byte_encoder
from .vocab import Vocab


@dataclass
class Merge:
    """One step of a replay: at ``rank`` the pair (left, right) became ``left + right``."""
    rank: int
    position: int
    left: str
    right: str
    symbols: list[str]


def bpe_merge(symbols: list[str], ranks: dict[str, int], trace: list[Merge] | None = None) -> list[str]:
    """Merge ``symbols`` by rank; returns the final symbols (``llm_tokenizer_bpe_session::tokenize``).

    The queue holds one integer per pair, ``rank * n + left`` (the lowest rank first, the leftmost on
    ties, as llama.cpp's comparator orders them); a popped pair is stale when the symbols now at
    ``left`` and after it are not that rank's pair (a rank names one pair: symbols only grow)."""
    sym = list(symbols)
    n = len(sym)
    if n < 2:
        return sym
    nxt = list(range(1, n + 1))
    nxt[-1] = -1
    prv = list(range(-1, n - 1))
    get = ranks.get
    queue = [rank * n + i - 1 for i in range(1, n) if (rank := get(sym[i - 1] + " " + sym[i])) is not None]
    heapq.heapify(queue)
    pop, push = heapq.heappop, heapq.heappush
    while queue:
        rank, left = divmod(pop(queue), n)
        right = nxt[left]
        if right < 0 or not sym[left] or get(sym[left] + " " + sym[right]) != rank:
            continue   # outdated: one side has changed since this pair was queued
        if trace is not None:
            trace.append(Merge(rank, left, sym[left], sym[right], []))
        sym[left], sym[right] = sym[left] + sym[right], ""
        nxt[left] = after = nxt[right]
        if after >= 0:
            prv[after] = left
            r = get(sym[left] + " " + sym[after])
            if r is not None:
                push(queue, r * n + left)
        before = prv[left]
        if before >= 0:
            r = get(sym[before] + " " + sym[left])
            if r is not None:
                push(queue, r * n + before)
        if trace is not None:
            trace[-1].symbols = [s for s in sym if s]
    return [s for s in sym if s]


MERGE_BYTES_PER_SYMBOL = 400     # the merge of one long word: symbol lists, queue entries, growing strings


def encode_cached(pieces, cache: dict, encode_one) -> list[int]:
    """The ids of each piece (a pre-tokenized word, a SentencePiece chunk), each distinct piece merged
    once: text repeats its words, and merging is the costly part (the ids are those of merging every
    occurrence). The cache is emptied past a million pieces."""
    out: list[int] = []
    for piece in pieces:
        ids = cache.get(piece)
        if ids is None:
            if len(cache) > 1 << 20:
                cache.clear()
            ids = cache[piece] = encode_one(piece)
        out += ids
    return out

def check_merge_memory(n: int) -> None:
    """Refuse, before starting, the merge of a word of ``n`` symbols that would need more than half the
    memory still available (a single 10 MB word of spaces or letters)."""
    if n < 1 << 18:
        return
    from ..validate import available_memory
    need, avail = n * MERGE_BYTES_PER_SYMBOL, available_memory()
    if avail is not None and need > avail // 2:
        from ... import LLMLabError
        raise LLMLabError(f"a run of {n:,} characters with no break the tokenizer can cut at would need about "
                          f"{need / 2**20:,.0f} MiB to tokenize; only {avail / 2**20:,.0f} MiB of memory is available")


class BPE:
    """A BPE tokenizer session factory: ``encode(fragment)`` for one raw text fragment."""

    def __init__(self, vocab: Vocab, pre: PreTokenizer | None = None):
        self.vocab = vocab
        self.pre = pre or pre_tokenizer(vocab.pre)
        self._enc = byte_encoder()
        self._cache: dict[str, list[int]] = {}

    def byte_symbols(self, word: str) -> str:
        """The word's UTF-8 bytes as GPT-2 byte characters."""
        return word.encode("utf-8").decode("latin-1").translate(self._enc)

    def encode_word(self, word: str) -> list[int]:
        v = self.vocab
        chars = self.byte_symbols(word)
        if self.pre.ignore_merges and chars in v.token_to_id:
            return [v.token_to_id[chars]]
        check_merge_memory(len(chars))
        ids = []
        for s in bpe_merge(list(chars), v.merges):
            i = v.token_to_id.get(s)
            if i is not None:
                ids.append(i)
            else:   # llama.cpp looks each byte of the symbol's UTF-8 up as a one-byte token
                ids.extend(j for j in (v.token_to_id.get(chr(b)) for b in s.encode() if b < 0x80) if j is not None)
        return ids

    def encode(self, text: str) -> list[int]:
        return encode_cached(self.pre.split(text), self._cache, self.encode_word)

    def trace(self, word: str) -> list[Merge]:
        """Every merge applied to one word, in order (for replays)."""
        steps: list[Merge] = []
        bpe_merge(list(self.byte_symbols(word)), self.vocab.merges, steps)
        return steps
