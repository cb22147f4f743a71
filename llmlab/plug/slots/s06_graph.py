"""Notebook 06, the graph allocator: which free block a node's bytes go to (ggml-alloc's best fit).

While a plan is made, the allocator (``llmlab.ggml.alloc``, ggml_gallocr) walks the nodes in order
and gives each its bytes from one arena; it asks the learner's ``choose_block`` which of the free
holes to take (or the open end of the arena). The values are the same wherever the bytes sit, as
long as no block overlaps a live one; what a choice changes is the arena's size. So here
``bit-identical`` means the same offsets as ggml-alloc, and ``close`` another placement that still
computes the same text.
"""
from __future__ import annotations

from ..hooks import layer_of, swap_attr
from ..probe import Where
from ..registry import BadOutput, Mistake, Slot, register_slot


def choose_block(holes, size):
    """holes: [(offset, size)] of the free blocks before the arena's open end, by offset. The
    best fit: the smallest hole that fits (on a tie the later one); None: take the open end."""
    best = None
    for i, (_, s) in enumerate(holes):
        if s >= size and (best is None or s <= holes[best][1]):
            best = i
    return best


def choose_block_skeleton(holes, size):
    # holes: list of (offset, size) free blocks; size: bytes needed -> index of the hole, or None (the end)
    raise NotImplementedError("choose_block: your code here")


def _first_fit(holes, size):
    return next((i for i, (_, s) in enumerate(holes) if s >= size), None)


def _always_end(holes, size):
    return None


def _worst_fit(holes, size):
    fits = [i for i, (_, s) in enumerate(holes) if s >= size]
    return max(fits, key=lambda i: (holes[i][1], i)) if fits else None


def _earlier_tie(holes, size):
    best = None
    for i, (_, s) in enumerate(holes):
        if s >= size and (best is None or s < holes[best][1]):
            best = i
    return best


def _install(probe):
    from ...ggml import alloc


    def alloc_(self, size):
        holes = [(int(o), int(s)) for o, s in self.blocks[:-1]]
        engine = choose_block(holes, size)
        node = getattr(self, "node", None)
        where = Where(node.name if node is not None else f"block of {size} bytes", "ALLOC",
                      layer_of(node.name) if node is not None else None, f"{size} bytes, {len(holes)} holes")
        i = probe(where, (list(holes), int(size)), engine)
        if i is not None:
            if isinstance(i, bool) or not isinstance(i, int) or not 0 <= i < len(holes):
                probe.stop(where, f"choose_block() returned {i!r}: an index into the {len(holes)} holes, or None")
            if holes[i][1] < size:
                probe.stop(where, f"choose_block() chose hole {i} of {holes[i][1]} bytes for {size} bytes: the "
                                  "node would overwrite the bytes after it")
        # the allocation itself, with the chosen hole (or the end): ggml_dyn_tallocr_alloc's bookkeeping
        k = len(self.blocks) - 1 if i is None else i
        b = self.blocks[k]
        off = b[0]
        b[0] += size
        if b[1] >= 0:
            b[1] -= size
            if b[1] == 0:
                del self.blocks[k]
        self.max_size = max(self.max_size, off + size)
        return off

    return swap_attr(alloc.FreeList, "alloc", alloc_)


def _check_index(out, engine):
    if out is not None and (isinstance(out, bool) or not isinstance(out, int)):
        try:
            import numpy as np
            if isinstance(out, np.integer):
                return int(out)
        except Exception:
            pass
        raise BadOutput(f"returned {out!r}; the allocator needs the index of a hole (an int) or None")
    return out


register_slot(Slot(
    name="choose_block", notebook="06",
    signature="choose_block(holes: list[(offset, size)], size: int) -> int | None",
    used_for="every node that owns bytes, when a graph's plan is made (ggml-alloc's free list): which "
             "free hole it takes, or the arena's open end",
    reference=choose_block, skeleton=choose_block_skeleton, install=_install, models=("smollm2", "gemma3"),
    check=_check_index,
    mistakes=[
        Mistake("first fit", _first_fit,
                "first fit: ggml-alloc takes the smallest hole that fits (best fit), so big holes stay for big nodes"),
        Mistake("never reuses", _always_end,
                "always the open end: freed blocks are never reused, and the arena grows to the sum of all nodes"),
        Mistake("worst fit", _worst_fit, "took the largest hole: ggml-alloc takes the smallest one that fits"),
        Mistake("earlier on ties", _earlier_tie,
                "best fit, but on a tie ggml-alloc takes the later hole (its loop keeps s <= best)"),
    ],
    hint_close="another placement ({node}: {detail}); the values are the same, the arena is not ggml-alloc's",
    hint_different="another placement ({node}: {detail}) and the text changed: blocks overlap"))
