"""Checkers of notebook 04_kv_cache: find_slot's cells, the context shift."""
from __future__ import annotations

from .verdict import Verdict, needs_answer


@needs_answer("answer")
def check_find_slot(cache, ubatch, answer) -> Verdict:
    """The cells ``find_slot`` gives a micro-batch, in the order it takes them (the cache is not changed)."""
    want = [int(i) for i in cache.find_slot(ubatch).idxs]
    got = [int(i) for i in answer]
    if got == want:
        return Verdict.correct(f"cells {want}")
    if len(got) != len(want):
        return Verdict.not_yet(f"{len(got)} cells", f"the micro-batch has {len(want)} tokens: one cell each")
    busy = [c for c in got if not cache.is_empty(c)] if hasattr(cache, "is_empty") else \
        [c for c in got if cache.pos[c] >= 0]
    if busy:
        return Verdict.not_yet(f"cells {got}", f"cell {busy[0]} is occupied: find_slot skips it")
    if sorted(got) == sorted(want):
        return Verdict.not_yet(f"cells {got}", "the right cells, in the wrong order: they are taken in the order "
                               "the search visits them, from head to the end of the ring, then from cell 0")
    if got and got[0] != want[0]:
        return Verdict.not_yet(f"cells {got}", f"the search starts at head ({cache.head}), not at cell 0")
    return Verdict.not_yet(f"cells {got}", "walk the ring from head, take each free cell, wrap around at the end")


@needs_answer("dropped")
def check_context_shift(n_past: int, n_keep: int, dropped: int, next_pos: int) -> Verdict:
    """llama.cpp's context shift: keep ``n_keep``, drop half of the rest, slide the remainder down."""
    want = (n_past - n_keep) // 2
    if dropped != want:
        return Verdict.not_yet(f"{dropped} dropped", "half of the positions after the kept ones (n_past - n_keep) // 2")
    if next_pos != n_past - want:
        return Verdict.not_yet(f"next position {next_pos}", "the remaining positions slide down by the number dropped; "
                               "the next token comes right after the last of them")
    return Verdict.correct(f"{want} positions dropped, the next token goes to position {n_past - want}")
