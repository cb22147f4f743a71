"""Which rows of a buffer changed since a reader last looked.

A decode step's attention reads the same cache rows step after step. The fast KQ kernel keeps them
transposed between steps and must redo exactly the rows that changed. So every writer of cache rows
notes them here (SET_ROWS in the reference ops and in the compiled plan, the KV cache's own store
and K-shift), and each reader holds one flag per row of the buffer, which those notes set. A buffer
is known by the array that owns its memory; rows are rows of that array's first axis.
"""
from __future__ import annotations

import weakref

import numpy as np

_READERS: dict[int, list[weakref.ref]] = {}      # id(owner) -> its readers' flag arrays


def owner(a: np.ndarray) -> np.ndarray:
    while isinstance(a.base, np.ndarray):
        a = a.base
    return a


def _same_rows(a: np.ndarray, root: np.ndarray) -> bool:
    """Does ``a``'s row i lie on the owner's row i (same start, same row stride)?"""
    return (a.ndim >= 1 and root.ndim >= 1 and a.strides[0] == root.strides[0]
            and a.__array_interface__["data"][0] == root.__array_interface__["data"][0])


def reader(a: np.ndarray) -> np.ndarray | None:
    """Flags (uint8, one per row of ``a``'s owner, all set at first) that writers of those rows set;
    None when ``a``'s rows are not the owner's rows."""
    root = owner(a)
    if not _same_rows(a, root):
        return None
    flags = np.ones(root.shape[0], np.uint8)
    refs = _READERS.setdefault(id(root), [])
    refs[:] = [r for r in refs if r() is not None]
    refs.append(weakref.ref(flags))
    return flags


FEW_ROWS = 16      # up to this many row indices are set one by one: numpy's fancy-index assignment costs
                   # several microseconds per call, paid per reader by every SET_ROWS of a decode step


def _mark(refs: list, n: int, rows, few: list | None = None) -> None:
    """Set the flags of ``rows`` (all of them when None) in every live reader of an n-row owner; ``few``:
    the rows as a list, set one by one (found here for a short integer array when not given)."""
    if few is None and isinstance(rows, np.ndarray) and rows.ndim == 1 and rows.dtype.kind in "iu" \
            and rows.shape[0] <= FEW_ROWS:
        few = rows.tolist()                             # an index out of range raises IndexError as numpy's does
    for ref in refs:
        flags = ref()
        if flags is not None and flags.shape[0] == n:
            if rows is None:
                flags[:] = 1
            elif few is not None:
                for r in few:
                    flags[r] = 1
            else:
                flags[rows] = 1


def index_writer(arrays: list[np.ndarray], index: np.ndarray):
    """``note()``: rows_written(a, index) for each of ``arrays``, with ``index`` (a 1-D integer buffer a
    SET_ROWS reads: its rows checked in range by then) read when called, and the owners and readers
    looked up once, for a writer bound to its buffers (a plan's SET_ROWS steps): one call a step for a
    layer's K and V caches. Readers registered later are seen too (it holds the live lists)."""
    groups = []
    for a in arrays:
        root = owner(a)
        groups.append((_READERS.setdefault(id(root), []), root.shape[0], _same_rows(a, root)))
    few = index.ndim == 1 and index.shape[0] <= FEW_ROWS

    def note() -> None:
        rows = index.tolist() if few else None          # listed once for both caches
        for refs, n, exact in groups:
            _mark(refs, n, index if exact else None, rows)
    return note


def rows_written(a: np.ndarray, rows=None) -> None:
    """Note that rows ``rows`` of ``a`` (all of them when None) were written."""
    root = owner(a)
    refs = _READERS.get(id(root))
    if refs:
        _mark(refs, root.shape[0], rows if rows is not None and _same_rows(a, root) else None)
