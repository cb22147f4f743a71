"""Notebook 04, the KV cache: ``find_slot``, the cells a micro-batch's tokens go to.

The cache asks the learner's ``find_slot`` before every micro-batch (the prompt, then each new token)
with which cells are free (empty, or fallen out of a sliding window), where its ring's head is and
how many cells are used. The cells it returns are where the tokens' K and V are written, and the
masks follow them; the cache then moves its head past the last one.
"""
from __future__ import annotations

import numpy as np

from ..hooks import swap_attr
from ..probe import Where
from ..registry import BadOutput, Mistake, Slot, register_slot


def find_slot(free, head, used, n_tokens):
    """Walk the ring of cells from ``head`` (from 0 when many cells before the head are free:
    head > used + 2 * n_tokens), wrapping at the end, and take the first ``n_tokens`` free cells.
    None when one full turn finds too few."""
    size = len(free)
    if n_tokens > size:
        return None
    if head > used + 2 * n_tokens:
        head = 0
    cells = []
    for k in range(size):
        i = (head + k) % size
        if free[i]:
            cells.append(i)
            if len(cells) == n_tokens:
                return cells
    return None


def find_slot_skeleton(free, head, used, n_tokens):
    # free: bool[size] (True: the cell can take a token); head: int; used: int; n_tokens: int
    # -> list of n_tokens cell indices, or None when the cache is full
    raise NotImplementedError("find_slot: your code here")


def _from_zero(free, head, used, n_tokens):
    return find_slot(free, 0, 0, n_tokens)


def _past_head(free, head, used, n_tokens):
    return find_slot(free, (head + 1) % len(free), used, n_tokens) if head else find_slot(free, 1, 0, n_tokens)


def _first_cells(free, head, used, n_tokens):
    return list(range(n_tokens))


def _from_head_unchecked(free, head, used, n_tokens):
    return [(head + k) % len(free) for k in range(n_tokens)]


def _check(out, engine):
    if out is None:
        if engine is None:
            return None
        raise BadOutput("returned None (cache full) though there are enough free cells")
    try:
        cells = [int(x) for x in out]
    except (TypeError, ValueError):
        raise BadOutput(f"returned {type(out).__name__}; the cache needs a list of cell indices") from None
    n = len(engine) if engine is not None else None
    if n is not None and len(cells) != n:
        raise BadOutput(f"returned {len(cells)} cells for {n} tokens")
    return cells


def _install(probe):
    from ...llama import kv_cache as K
    from ...llama.hparams import HParams

    orig = K.KVCache.find_slot

    def find(self, ubatch, cont=False, trace=None):
        got = orig(self, ubatch, cont, trace)
        if cont or trace is not None:
            return got
        free = self.pos < 0
        if self.swa_type != "none":
            pmax = {s: self.seq_pos_max(s) for s in range(self.n_seq_max)}
            for i in np.flatnonzero(~free):
                ids = np.flatnonzero(self.seq[i])
                if len(ids) == 1 and HParams.is_masked_swa(self.n_swa, self.swa_type, self.pos[i], pmax[int(ids[0])] + 1):
                    free[i] = True
        engine = None if got is None else [int(i) for i in got.idxs]
        where = Where(f"cells of {ubatch.n_tokens} token{'s' if ubatch.n_tokens > 1 else ''}", "FIND_SLOT", None,
                      f"head {self.head}, {self.used} used of {self.size}")
        cells = probe(where, (free.copy(), int(self.head), int(self.used), int(ubatch.n_tokens)), engine)
        if cells is None:
            return None
        bad = [c for c in cells if not 0 <= c < self.size]
        if bad or len(set(cells)) != len(cells):
            what = f"cell {bad[0]} outside 0..{self.size - 1}" if bad else "a cell twice"
            probe.stop(where, f"find_slot() returned {what}")
        return K.Slot(np.array(cells, dtype=np.int32))
    return swap_attr(K.KVCache, "find_slot", find)


register_slot(Slot(
    name="find_slot", notebook="04",
    signature="find_slot(free: bool[size], head: int, used: int, n_tokens: int) -> list[int] | None",
    used_for="every micro-batch (the prompt, each new token): the cells its K and V go to, in every cache "
             "(Gemma 3's sliding-window cache too)",
    reference=find_slot, skeleton=find_slot_skeleton, install=_install, models=("smollm2", "gemma3"),
    check=_check,
    mistakes=[
        Mistake("always from cell 0", _from_zero,
                "started at cell 0: llama.cpp starts at the cache's head and goes back to 0 only when many cells "
                "before it are free (head > used + 2 n_tokens)"),
        Mistake("one past the head", _past_head,
                "started one cell past the head: the head is the first cell to test (the cache moved it past the "
                "last token already), so a hole is left"),
        Mistake("cells 0..n-1", _first_cells,
                "returned cells 0..n-1 without looking: they hold earlier tokens, whose K and V were overwritten"),
        Mistake("cells from the head, unchecked", _from_head_unchecked,
                "took the cells from the head without checking they are free"),
    ],
    hint_different="the first micro-batch placed differently: {node} ({detail}): walk from the head, take free "
                   "cells, wrap at the end"))
