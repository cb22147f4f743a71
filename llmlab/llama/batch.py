"""Batches and micro-batches, as llama.cpp cuts them (src/llama-batch.cpp).

A :class:`Batch` is what a caller hands to ``decode``: like ``llama_batch`` it
carries, per token, the token id, its position, the sequences it belongs to
and whether its logits are wanted. Positions may be left out; they then
continue each sequence from what the KV cache already holds, as
``llama_batch_get_one`` batches do.

A :class:`BatchAllocator` (``llama_batch_allocr``) checks a batch against the
model and the memory (token ids in range, sequence ids below ``n_seq_max``,
positions that continue the cache and are gap-free) and then cuts it into
micro-batches (:class:`UBatch`) of at most ``n_ubatch`` tokens:

- ``split_simple``: consecutive runs of the batch, in order (what a unified
  KV cache uses);
- ``split_equal``: as many tokens of each non-overlapping sequence set as fit,
  the same number for each set (what per-sequence streams need).

>>> alloc = BatchAllocator(Batch.from_tokens([1, 2, 3, 4, 5]))
>>> [ub.tokens.tolist() for ub in alloc.split_all(2)]
[[1, 2], [3, 4], [5]]
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterable, Protocol, Sequence

import numpy as np

from .. import LLMLabError

LLAMA_MAX_SEQ = 256  # llama-cparams.h


class BatchError(LLMLabError, ValueError):
    """A batch that llama.cpp would refuse (``llama_batch_allocr::init`` returning false)."""


class SequenceMemory(Protocol):
    """What the batch allocator asks of the memory (a KV cache)."""

    def seq_pos_min(self, seq_id: int) -> int: ...
    def seq_pos_max(self, seq_id: int) -> int: ...


@dataclass
class Batch:
    """One ``llama_batch``: parallel lists, one entry per token.

    ``pos`` is ``None`` to let positions continue each sequence (the first
    sequence id of a token decides which); ``logits[i]`` asks for the output
    of token ``i`` (``llama_batch.logits``, called "output" in llama.cpp).
    """

    tokens: list[int] = field(default_factory=list)
    pos: list[int] | None = field(default_factory=list)
    seq_ids: list[tuple[int, ...]] = field(default_factory=list)
    logits: list[bool] = field(default_factory=list)

    @classmethod
    def get_one(cls, tokens: Iterable[int]) -> "Batch":
        """``llama_batch_get_one``: sequence 0, positions from the cache, logits of the last token only."""
        toks = [int(t) for t in tokens]
        return cls(toks, None, [(0,)] * len(toks), [i == len(toks) - 1 for i in range(len(toks))])

    @classmethod
    def from_tokens(cls, tokens: Iterable[int], pos0: int = 0, seq_id: int | Sequence[int] = 0,
                    logits: str = "last") -> "Batch":
        """Tokens of one sequence (or of several sharing them) at ``pos0, pos0+1, ...``.

        ``logits`` is ``"last"``, ``"all"`` or ``"none"``.
        """
        if logits not in ("last", "all", "none"):
            raise ValueError(f"logits must be 'last', 'all' or 'none', not {logits!r}")
        toks = [int(t) for t in tokens]
        sids = (int(seq_id),) if np.isscalar(seq_id) else tuple(int(s) for s in seq_id)
        n = len(toks)
        want = [logits == "all" or (logits == "last" and i == n - 1) for i in range(n)]
        return cls(toks, list(range(pos0, pos0 + n)), [sids] * n, want)

    def add(self, token: int, pos: int, seq_ids: int | Sequence[int] = 0, logits: bool = False) -> "Batch":
        """``common_batch_add``: append one token; returns the batch for chaining."""
        if self.pos is None:
            raise ValueError("this batch takes its positions from the cache; it cannot mix in explicit ones")
        self.tokens.append(int(token))
        self.pos.append(int(pos))
        self.seq_ids.append((int(seq_ids),) if np.isscalar(seq_ids) else tuple(int(s) for s in seq_ids))
        self.logits.append(bool(logits))
        return self

    @property
    def n_tokens(self) -> int:
        return len(self.tokens)

    def __len__(self) -> int:
        return len(self.tokens)


@dataclass
class UBatch:
    """One micro-batch (``llama_ubatch``): the unit the graph is built for and run on."""

    tokens: np.ndarray                  # int32 [n_tokens]
    pos: np.ndarray                     # int32 [n_tokens]
    seq_ids: tuple[tuple[int, ...], ...]
    output: np.ndarray                  # bool [n_tokens]: logits wanted
    batch_idxs: np.ndarray              # int32 [n_tokens]: index of each token in the batch
    n_seqs: int = 1                     # sequence sets (equal splits: n_tokens = n_seqs * n_seq_tokens)
    equal_seqs: bool = False

    @property
    def n_tokens(self) -> int:
        return len(self.tokens)

    @property
    def n_seq_tokens(self) -> int:
        return self.n_tokens // self.n_seqs

    @property
    def n_outputs(self) -> int:
        return int(self.output.sum())

    @property
    def seq_id0(self) -> np.ndarray:
        """The first sequence id of each token: the one the KQ mask uses."""
        return np.array([s[0] for s in self.seq_ids], dtype=np.int32)

    @property
    def seq_id_unq(self) -> list[int]:
        """The distinct sequence ids in this micro-batch, ascending."""
        return sorted({s for ids in self.seq_ids for s in ids})

    def __repr__(self) -> str:
        return (f"UBatch(n_tokens={self.n_tokens}, pos={self.pos.tolist()}, "
                f"seqs={self.seq_id_unq}, n_outputs={self.n_outputs})")


INT32_MAX = (1 << 31) - 1


def _int64s(values, what: str) -> np.ndarray:
    """``values`` as int64, or a BatchError that names the first that is not an integer in range."""
    for v in values:
        if isinstance(v, (bool, np.bool_)) or not isinstance(v, (int, np.integer)):
            raise BatchError(f"a {what} must be an integer, not {v!r}")
        if not -(1 << 63) <= v < (1 << 63):
            raise BatchError(f"{what} {v} is out of range")
    return np.asarray(values, dtype=np.int64).reshape(-1)


class BatchAllocator:
    """``llama_batch_allocr``: validate a :class:`Batch`, fill its positions, cut it into :class:`UBatch` es.

    ``memory`` is the KV cache the batch continues (anything with
    ``seq_pos_min``/``seq_pos_max``); ``None`` means an empty memory.
    ``out_ids`` collects, in micro-batch order, the batch index of each output
    row, so the caller can put logits back in batch order.
    """

    def __init__(self, batch: Batch, *, n_vocab: int | None = None, n_seq_max: int = 1,
                 memory: SequenceMemory | None = None, output_all: bool = False):
        n = batch.n_tokens
        if n == 0:
            raise BatchError("the batch is empty (n_tokens == 0)")
        if not 1 <= n_seq_max <= LLAMA_MAX_SEQ:
            raise BatchError(f"n_seq_max = {n_seq_max} is outside [1, {LLAMA_MAX_SEQ}]")
        if len(batch.seq_ids) != n or len(batch.logits) != n or (batch.pos is not None and len(batch.pos) != n):
            raise BatchError("the batch's lists (tokens, pos, seq_ids, logits) have different lengths")
        self.n_seq_max = n_seq_max
        self.tokens = _int64s(batch.tokens, "token")
        if n_vocab is not None:
            bad = np.flatnonzero((self.tokens < 0) | (self.tokens >= n_vocab))
            if len(bad):
                raise BatchError(f"invalid token[{bad[0]}] = {self.tokens[bad[0]]} (vocabulary has {n_vocab} tokens)")
        self.tokens = self.tokens.astype(np.int32)
        self.seq_ids = [tuple(s) for s in batch.seq_ids]
        for i, ids in enumerate(self.seq_ids):
            if not ids:
                raise BatchError(f"token {i} belongs to no sequence")
            for s in ids:
                if not 0 <= s < n_seq_max:
                    raise BatchError(f"invalid seq_id[{i}] = {s} >= n_seq_max = {n_seq_max}")
        self.output = np.ones(n, bool) if output_all else np.asarray(batch.logits, dtype=bool)

        if batch.pos is None:   # continue each sequence from the memory (llama_batch_compat)
            nxt = {}
            pos = np.empty(n, np.int32)
            for i, ids in enumerate(self.seq_ids):
                s = ids[0]
                if s not in nxt:
                    nxt[s] = (memory.seq_pos_max(s) if memory is not None else -1) + 1
                pos[i] = nxt[s]
                nxt[s] += 1
            self.pos = pos
        else:
            pos = _int64s(batch.pos, "position")
            if (pos < 0).any():
                raise BatchError(f"negative position {pos.min()} in the batch")
            if (pos > INT32_MAX).any():       # llama_pos is an int32
                raise BatchError(f"position {pos.max()} in the batch is past the largest position, {INT32_MAX}")
            self.pos = pos.astype(np.int32)
        self._check_positions(memory)
        self.split_reset()

    # -- consistency checks of llama_batch_allocr::init -------------------------------------------------------
    def _check_positions(self, memory: SequenceMemory | None) -> None:
        seq_pos: dict[int, set[int]] = {}
        for p, ids in zip(self.pos.tolist(), self.seq_ids):
            for s in ids:
                seq_pos.setdefault(s, set()).add(p)
        for s, ps in sorted(seq_pos.items()):
            lo, hi = min(ps), max(ps)
            last = memory.seq_pos_max(s) if memory is not None else -1
            if last >= 0 and lo != last + 1:
                raise BatchError(
                    f"the tokens of sequence {s} have inconsistent positions: the KV cache holds positions up to "
                    f"X = {last}, the batch starts at Y = {lo}; positions must continue: Y = X + 1")
            if hi - lo + 1 > len(ps):
                raise BatchError(f"sequence {s} positions are not continuous (gaps between {lo} and {hi})")
        # coupled sequences (a token in both) must not have diverged in the memory
        if memory is not None:
            for ids in {ids for ids in self.seq_ids if len(ids) > 1}:
                for s1 in ids[1:]:
                    s0 = ids[0]
                    if (memory.seq_pos_min(s0), memory.seq_pos_max(s0)) != (memory.seq_pos_min(s1), memory.seq_pos_max(s1)):
                        raise BatchError(f"sequence {s1} is coupled to {s0} in the batch, but they have diverged in the KV cache")
        # each sequence's positions must not decrease along the batch
        # (llama.cpp also intersects each sequence's sets here, but a set always holds its own id: never empty)
        cur_pos: dict[int, int] = {}
        for p, ids in zip(self.pos.tolist(), self.seq_ids):
            for s in ids:
                if p < cur_pos.get(s, -1):
                    raise BatchError(f"sequence {s} positions are decreasing (not allowed)")
                cur_pos[s] = p

    # -- splitting ----------------------------------------------------------------------------------------------
    @property
    def n_tokens(self) -> int:
        return len(self.tokens)

    @property
    def n_outputs(self) -> int:
        return int(self.output.sum())

    @property
    def n_used(self) -> int:
        return int(self.used.sum())

    def split_reset(self) -> None:
        self.used = np.zeros(self.n_tokens, bool)
        self.out_ids: list[int] = []

    def split_simple(self, n_ubatch: int) -> UBatch | None:
        """The next ``n_ubatch`` unused tokens, in batch order; ``None`` when all are used."""
        if n_ubatch < 1:
            raise ValueError(f"n_ubatch must be >= 1, not {n_ubatch}")
        free = np.flatnonzero(~self.used)
        if len(free) == 0:
            return None
        start = free[0]
        idxs = np.arange(start, min(start + n_ubatch, self.n_tokens))
        return self._ubatch_add(idxs, 1, equal_seqs=False)

    def split_equal(self, n_ubatch: int, sequential: bool = False) -> UBatch | None:
        """Equal-length runs of each non-overlapping sequence set, concatenated (``split_equal``)."""
        sets = [frozenset(ids) for ids in self.seq_ids]
        if sequential and any(len(s) > 1 for s in sets):
            raise BatchError("sequential split is not supported when sequences are coupled in the batch")
        cur: list[frozenset] = []
        last = -1
        for i in np.flatnonzero(~self.used):
            if any(c & sets[i] for c in cur):
                continue
            if sequential and cur and self.seq_ids[i][0] != last + 1:
                continue
            cur.append(sets[i])
            last = self.seq_ids[i][0]
            if len(cur) > n_ubatch:
                break
        if not cur:
            return None
        members = [[j for j in range(self.n_tokens) if sets[j] == c and not self.used[j]] for c in cur]
        per_seq: list[list[int]] = [[] for _ in cur]
        k = 0
        while all(k < len(m) for m in members):
            for s, m in enumerate(members):
                per_seq[s].append(m[k])
                self.used[m[k]] = True
            k += 1
            if (len(per_seq[0]) + 1) * len(cur) > n_ubatch:
                break
        idxs = np.array([j for run in per_seq for j in run], dtype=np.int64)
        self.used[idxs] = False      # _ubatch_add marks them
        return self._ubatch_add(idxs, len(cur), equal_seqs=True)

    def split_all(self, n_ubatch: int, how: str = "simple") -> list[UBatch]:
        """All micro-batches of the batch, from a fresh start."""
        split = {"simple": self.split_simple, "equal": self.split_equal}[how]
        self.split_reset()
        out = []
        while (ub := split(n_ubatch)) is not None:
            out.append(ub)
        if self.n_used < self.n_tokens:
            raise BatchError("could not split the batch into micro-batches")
        return out

    def _ubatch_add(self, idxs: np.ndarray, n_seqs: int, equal_seqs: bool) -> UBatch:
        self.used[idxs] = True
        out = self.output[idxs]
        self.out_ids.extend(int(i) for i in idxs[out])
        return UBatch(tokens=self.tokens[idxs].copy(), pos=self.pos[idxs].copy(),
                      seq_ids=tuple(self.seq_ids[i] for i in idxs), output=out.copy(),
                      batch_idxs=idxs.astype(np.int32), n_seqs=n_seqs, equal_seqs=equal_seqs)


def split_one(batch: Batch, *, n_vocab: int | None = None, n_seq_max: int = 1,
              memory: SequenceMemory | None = None) -> UBatch | None:
    """A one-token batch of one sequence (a decode step) as its micro-batch, with the checks of
    :class:`BatchAllocator` done on scalars: a step pays a few microseconds, not the allocator's arrays
    and sets (hundreds of microseconds a token on a busy core). ``None`` whenever anything is unusual (a
    value that is not a plain int or bool, several sequences, a check that fails): the allocator then
    cuts the batch, or says what is wrong, exactly as before."""
    if len(batch.tokens) != 1 or len(batch.seq_ids) != 1 or len(batch.logits) != 1:
        return None
    tok, ids, out = batch.tokens[0], batch.seq_ids[0], batch.logits[0]
    if (type(tok) is not int or type(out) is not bool or type(ids) is not tuple or len(ids) != 1
            or type(ids[0]) is not int):
        return None
    s = ids[0]
    if (n_vocab is not None and not 0 <= tok < n_vocab) or not 0 <= s < n_seq_max <= LLAMA_MAX_SEQ:
        return None
    last = memory.seq_pos_max(s) if memory is not None else -1
    if batch.pos is None:
        p = last + 1
    else:
        if len(batch.pos) != 1 or type(batch.pos[0]) is not int:
            return None
        p = batch.pos[0]
    if not 0 <= p <= INT32_MAX or (last >= 0 and p != last + 1):
        return None
    return UBatch(tokens=np.array([tok], np.int32), pos=np.array([p], np.int32), seq_ids=((s,),),
                  output=np.array([out]), batch_idxs=np.zeros(1, np.int32))


def split_simple(batch: Batch, n_ubatch: int, **kw) -> list[UBatch]:
    """Shorthand: validate ``batch`` and cut it with :meth:`BatchAllocator.split_simple`."""
    return BatchAllocator(batch, **kw).split_all(n_ubatch)
