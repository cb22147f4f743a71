"""The cells of a KV cache: per cell, the position of the token it holds and the sequences that see it
(llama.cpp's ``llama_kv_cells``, ``src/llama-kv-cells.h``), and the ``llama_memory_seq_*`` operations, which
are bookkeeping on them alone.

The metadata are NumPy arrays (``pos``, ``shift``, a boolean ``seq[cell, seq_id]`` matrix), so each
operation reads as one line of array math. ``head``, where the next slot search starts, sits beside
the cells as in ``llama_kv_cache``: freeing cells before it pulls it back.
"""
from __future__ import annotations

import numpy as np

from .batch import LLAMA_MAX_SEQ


def _range(p0, p1):
    """llama.cpp's convention: a negative (or None) p0 means 0, a negative (or None) p1 means infinity."""
    p0 = 0 if p0 is None or p0 < 0 else int(p0)
    p1 = np.iinfo(np.int32).max if p1 is None or p1 < 0 else int(p1)
    return p0, p1


class KVCells:
    """``size`` cells for up to ``n_seq_max`` sequences, all empty."""

    def __init__(self, size: int, n_seq_max: int = 1):
        if size < 1:
            raise ValueError(f"KV cache size must be >= 1 cell, not {size}")
        if not 1 <= n_seq_max <= LLAMA_MAX_SEQ:
            raise ValueError(f"n_seq_max = {n_seq_max} is outside [1, {LLAMA_MAX_SEQ}]")
        self.size = int(size)
        self.n_seq_max = int(n_seq_max)
        self.pos = np.full(self.size, -1, np.int32)          # -1: empty
        self.shift = np.zeros(self.size, np.int32)           # accumulated position shift since the last K-shift
        self.seq = np.zeros((self.size, self.n_seq_max), bool)
        self.has_shift = False
        self.head = 0

    # -- cell queries -------------------------------------------------------------------------------------------
    @property
    def used(self) -> int:
        """Number of non-empty cells."""
        return int((self.pos >= 0).sum())

    def used_max_p1(self) -> int:
        """Index of the last non-empty cell + 1 (0 if none)."""
        nz = np.flatnonzero(self.pos >= 0)
        return int(nz[-1]) + 1 if len(nz) else 0

    def is_empty(self, i: int) -> bool:
        return bool(self.pos[i] < 0)

    def seq_ids(self, i: int) -> frozenset[int]:
        """The set of sequences cell ``i`` belongs to."""
        return frozenset(np.flatnonzero(self.seq[i]).tolist())

    def seq_pos_min(self, seq_id: int) -> int:
        """Smallest position of ``seq_id`` in the cache, -1 if it has none."""
        p = self.pos[self.seq[:, self._sid(seq_id)]]
        return int(p.min()) if len(p) else -1

    def seq_pos_max(self, seq_id: int) -> int:
        """Largest position of ``seq_id`` in the cache, -1 if it has none."""
        p = self.pos[self.seq[:, self._sid(seq_id)]]
        return int(p.max()) if len(p) else -1

    def cells(self) -> list[tuple[int, frozenset[int]]]:
        """(pos, seq ids) of every cell: the picture of the cache."""
        return [(int(p), self.seq_ids(i)) for i, p in enumerate(self.pos)]

    def _sid(self, seq_id: int) -> int:
        if not 0 <= seq_id < self.n_seq_max:
            raise ValueError(f"seq_id {seq_id} is outside [0, {self.n_seq_max})")
        return int(seq_id)

    # -- clearing cells -----------------------------------------------------------------------------------------
    def _clear(self, sel: np.ndarray) -> None:
        """Empty the cells selected by the boolean mask ``sel`` and pull ``head`` back to the first of them."""
        self.pos[sel] = -1
        self.shift[sel] = 0
        self.seq[sel] = False
        freed = np.flatnonzero(sel)
        if len(freed) and freed[0] < self.head:
            self.head = int(freed[0])

    def clear(self) -> None:
        """Empty all cells (``llama_memory_clear``); the data is left as is."""
        self._clear(np.ones(self.size, bool))
        self.head = 0
        self.has_shift = False

    # -- sequence operations ------------------------------------------------------------------------------------
    def seq_rm(self, seq_id: int, p0: int | None = None, p1: int | None = None) -> bool:
        """Remove ``seq_id`` from the cells at positions [p0, p1); ``seq_id < 0`` removes every sequence there.

        A cell left with no sequence becomes empty; ``head`` moves back to the
        first freed cell if that is before it. Returns True (a KV cache can
        always remove a range).
        """
        p0, p1 = _range(p0, p1)
        in_range = (self.pos >= p0) & (self.pos < p1)
        if seq_id < 0:
            self._clear(in_range)
            return True
        s = self._sid(seq_id)
        hit = in_range & self.seq[:, s]
        self.seq[hit, s] = False
        self._clear(hit & ~self.seq.any(axis=1))
        return True

    def seq_cp(self, seq_src: int, seq_dst: int, p0: int | None = None, p1: int | None = None) -> None:
        """Let ``seq_dst`` also see the cells of ``seq_src`` at positions [p0, p1): shared, not copied."""
        a, b = self._sid(seq_src), self._sid(seq_dst)
        if a == b:
            return
        p0, p1 = _range(p0, p1)
        self.seq[(self.pos >= p0) & (self.pos < p1) & self.seq[:, a], b] = True

    def seq_keep(self, seq_id: int) -> None:
        """Keep only ``seq_id``: its cells lose every other sequence, all other cells are emptied."""
        s = self._sid(seq_id)
        mine = self.seq[:, s].copy()
        self.seq[mine] = False
        self.seq[mine, s] = True
        self._clear((self.pos >= 0) & ~mine)

    def seq_add(self, seq_id: int, p0: int | None, p1: int | None, delta: int) -> None:
        """Shift the positions of ``seq_id``'s cells in [p0, p1) by ``delta`` (``llama_memory_seq_add``).

        Cells pushed below position 0 are emptied. The shift is also recorded
        per cell (``shift``) so the K rows can be re-rotated later
        (:meth:`apply_k_shift`). ``head`` goes to the first freed cell, or to 0.
        """
        s = self._sid(seq_id)
        if delta == 0:
            return
        p0, p1 = _range(p0, p1)
        if p0 == p1:
            return
        hit = (self.pos >= p0) & (self.pos < p1) & self.seq[:, s]
        self.pos[hit] += delta
        self.shift[hit] += delta
        self.has_shift = True
        gone = hit & (self.pos < 0)
        self._clear(gone)
        freed = np.flatnonzero(gone)
        self.head = int(freed[0]) if len(freed) else 0

    def seq_div(self, seq_id: int, p0: int | None, p1: int | None, d: int) -> None:
        """Divide the positions of ``seq_id``'s cells in [p0, p1) by ``d`` (self-extend), recording the shift."""
        s = self._sid(seq_id)
        if d == 1:
            return
        if d < 1:
            raise ValueError(f"seq_div needs d >= 1, not {d}")
        p0, p1 = _range(p0, p1)
        if p0 == p1:
            return
        hit = (self.pos >= p0) & (self.pos < p1) & self.seq[:, s]
        old = self.pos[hit]
        self.pos[hit] = old // d
        self.shift[hit] += old - self.pos[hit]
        self.has_shift = True

    def state(self):
        """The cell metadata, copied (``state_write`` without the K/V data): :meth:`restore` puts it back."""
        return self.pos.copy(), self.shift.copy(), self.seq.copy(), self.head, self.has_shift

    def restore(self, state) -> None:
        pos, shift, seq, self.head, self.has_shift = state
        self.pos, self.shift, self.seq = pos.copy(), shift.copy(), seq.copy()


__all__ = ["KVCells"]
