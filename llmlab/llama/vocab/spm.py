"""SentencePiece BPE (``tokenizer.ggml.model = llama``), as ``llm_tokenizer_spm_session`` runs it.

1. Spaces become U+2581 "▁" (with one prepended first when ``add_space_prefix`` says so).
2. Every UTF-8 character is a symbol. Each adjacent pair whose concatenation is a token (any
   token, whatever its type) is queued with that token's score.
3. The highest score merges first (the leftmost on ties); outdated pairs are skipped; the merged
   symbol's new pairs are queued.
4. A final symbol that is a token is emitted; one that is not (a character the vocabulary lacks)
   falls back to its UTF-8 bytes as ``<0xXX>`` tokens.

No pre-tokenizer cuts the text, but some cuts are safe anyway: if no token contains the two
characters on either side of a position, no merge can ever cross it, so the text can be split
there and each piece tokenized (and cached) on its own with the same result.
"""
from __future__ import annotations

import heapq
from dataclasses import dataclass
from functools import cached_property

import numpy as np

from ... import LLMLabError
from .bpe import check_merge_memory, encode_cached
from .vocab import Vocab

SPACE = "\u2581"


@dataclass
class Bigram:
    """One step of a replay: the pair at ``position`` merged with ``score`` into ``text``."""
    score: float
    position: int
    left: str
    right: str
    symbols: list[str]


def score_ranks(scores) -> list[int]:
    """Each token's place among the distinct scores, 0 for the highest (the queue's integer order)."""
    order = {v: k for k, v in enumerate(sorted(set(scores), reverse=True))}
    return [order[v] for v in scores]


def spm_merge(text: str, token_to_id: dict[str, int], scores, trace: list[Bigram] | None = None,
              ranks: list[int] | None = None) -> list[str]:
    """Merge the characters of ``text`` by token score; returns the final symbols.

    The queue holds one integer per pair, ``rank * n + left`` (``ranks``: :func:`score_ranks`): the
    highest score first, the leftmost on ties, as llama.cpp's comparator orders them. A popped pair is
    stale when the symbols now at ``left`` and after it do not make a token of that rank; a pair that
    does has an entry of the same key, so which entry is taken changes nothing."""
    sym = list(text)
    n = len(sym)
    if n < 2:
        return sym
    if ranks is None:
        ranks = score_ranks(scores)
    nxt = list(range(1, n + 1))
    nxt[-1] = -1
    prv = list(range(-1, n - 1))
    get = token_to_id.get
    queue = [ranks[i] * n + k - 1 for k in range(1, n) if (i := get(sym[k - 1] + sym[k])) is not None]
    heapq.heapify(queue)
    pop, push = heapq.heappop, heapq.heappush
    while queue:
        rank, left = divmod(pop(queue), n)
        right = nxt[left]
        if right < 0 or not sym[left]:
            continue
        a, b = sym[left], sym[right]
        i = get(a + b)
        if i is None or ranks[i] != rank:
            continue   # outdated: one side has changed since this pair was queued
        sym[left], sym[right] = a + b, ""
        nxt[left] = after = nxt[right]
        if after >= 0:
            prv[after] = left
        before = prv[left]
        if before >= 0:
            j = get(sym[before] + sym[left])
            if j is not None:
                push(queue, ranks[j] * n + before)
        if after >= 0:
            j = get(sym[left] + sym[after])
            if j is not None:
                push(queue, ranks[j] * n + left)
        if trace is not None:
            trace.append(Bigram(scores[i], left, a, b, [s for s in sym if s]))
    return [s for s in sym if s]


class SPM:
    """A SentencePiece tokenizer: ``encode(fragment)`` for one raw text fragment (already escaped)."""

    def __init__(self, vocab: Vocab):
        self.vocab = vocab
        self._scores = vocab.scores.tolist()
        self._cache: dict[str, list[int]] = {}
        t2i = vocab.token_to_id
        self._byte_ids = [t2i.get(f"<0x{b:02X}>", t2i.get(chr(b)) if b < 0x80 else None) for b in range(256)]

    @cached_property
    def _ranks(self) -> list[int]:
        return score_ranks(self._scores)

    @cached_property
    def _pairs(self) -> np.ndarray:
        """Sorted codes (first << 21 | second) of every adjacent character pair inside a token."""
        joined = "\x00".join(self.vocab.tokens)
        c = np.frombuffer(joined.encode("utf-32-le"), dtype=np.uint32).astype(np.int64)
        return np.unique((c[:-1] << 21) | c[1:])

    def chunks(self, text: str) -> list[str]:
        """``text`` cut wherever no token can straddle the cut."""
        if len(text) < 8:
            return [text]
        c = np.frombuffer(text.encode("utf-32-le"), dtype=np.uint32).astype(np.int64)
        code = (c[:-1] << 21) | c[1:]
        pairs = self._pairs
        at = np.searchsorted(pairs, code)
        inside = pairs[np.minimum(at, len(pairs) - 1)] == code
        cuts = (np.flatnonzero(~inside) + 1).tolist()
        return [text[a:b] for a, b in zip([0] + cuts, cuts + [len(text)])]

    def encode_chunk(self, text: str) -> list[int]:
        check_merge_memory(len(text))
        t2i, out = self.vocab.token_to_id, []
        for s in spm_merge(text, t2i, self._scores, ranks=self._ranks):
            i = t2i.get(s)
            if i is not None:
                out.append(i)
                continue
            for b in s.encode("utf-8"):
                j = self._byte_ids[b]
                if j is None:
                    raise LLMLabError(f"cannot tokenize {s!r}: the vocabulary has no token for its byte 0x{b:02X} "
                                      f"(neither '<0x{b:02X}>' nor the character itself)")
                out.append(j)
        return out

    def encode(self, text: str) -> list[int]:
        """Token ids of one raw fragment whose spaces are already U+2581."""
        return encode_cached(self.chunks(text), self._cache, self.encode_chunk)

    def trace(self, text: str) -> list[Bigram]:
        """Every merge applied to ``text`` (spaces already escaped), in order (for replays)."""
        steps: list[Bigram] = []
        spm_merge(text, self.vocab.token_to_id, self._scores, steps, ranks=self._ranks)
        return steps
