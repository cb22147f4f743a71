"""The memory a context decodes into (llama.cpp's ``llama_memory_i``, ``src/llama-memory.h``), and what
llama.cpp's tools do when it is full (the context shift).

:class:`~llmlab.llama.kv_cache.KVCache` and :class:`~llmlab.llama.kv_cache_iswa.KVCacheISWA` implement
:class:`Memory`; a recurrent or paged memory would too.
"""
from __future__ import annotations

from typing import Protocol, Sequence, runtime_checkable

import numpy as np

from .. import LLMLabError
from .batch import UBatch


class ContextFullError(LLMLabError):
    """The KV cache has no room for a batch (llama_decode's return value 1)."""


# --------------------------------------------------------------------------------------------------------------
# the memory interface (llama_memory_i)
# --------------------------------------------------------------------------------------------------------------
@runtime_checkable
class Memory(Protocol):
    """What a context asks of its memory, whichever it is (llama.cpp's ``llama_memory_i`` and the
    ``llama_memory_context_i`` it hands out per batch): :class:`KVCache` and :class:`KVCacheISWA` implement it,
    a recurrent or paged memory would too.

    - a batch: ``prepare(ubatches)`` places every micro-batch as a dry run and returns one placement each
      (raises :class:`ContextFullError`, leaving the memory unchanged); ``apply_ubatch(placement, ubatch)``
      really places one;
    - per layer: ``layer_cache(il)`` holds its K/V rows (``k(il, n)``, ``v(il, n)``, ``size``, ``type_k``,
      ``type_v``), ``n_kv(il)`` cells are attended, ``k_idxs(placement, il)`` are the cells this micro-batch
      writes, ``kq_mask(ubatch, n_kv, il=il)`` is its mask;
    - sequences: ``seq_rm``, ``seq_cp``, ``seq_keep``, ``seq_add``, ``seq_div``, ``seq_pos_min``,
      ``seq_pos_max``, ``clear``;
    - ``state()`` / ``restore(state)``: the bookkeeping, saved and put back.
    """

    def prepare(self, ubatches: Sequence[UBatch]) -> list: ...
    def apply_ubatch(self, placement, ubatch: UBatch) -> None: ...
    def layer_cache(self, il: int) -> "KVCache": ...   # noqa: F821 (llmlab.llama.kv_cache.KVCache)
    def n_kv(self, il: int | None = None) -> int: ...
    def k_idxs(self, placement, il: int) -> np.ndarray: ...
    def kq_mask(self, ubatch: UBatch, n_kv: int | None = None, causal: bool = True,
                il: int | None = None) -> np.ndarray: ...
    def seq_rm(self, seq_id: int, p0: int | None = None, p1: int | None = None) -> bool: ...
    def seq_cp(self, seq_src: int, seq_dst: int, p0: int | None = None, p1: int | None = None) -> None: ...
    def seq_keep(self, seq_id: int) -> None: ...
    def seq_add(self, seq_id: int, p0: int | None, p1: int | None, delta: int) -> None: ...
    def seq_div(self, seq_id: int, p0: int | None, p1: int | None, d: int) -> None: ...
    def seq_pos_min(self, seq_id: int) -> int: ...
    def seq_pos_max(self, seq_id: int) -> int: ...
    def clear(self) -> None: ...
    def state(self): ...
    def restore(self, state) -> None: ...


# --------------------------------------------------------------------------------------------------------------
# running out of room: the context shift of llama.cpp's tools
# --------------------------------------------------------------------------------------------------------------
def context_shift(cache: Memory, seq_id: int = 0, n_keep: int = 0, n_discard: int | None = None) -> int:
    """Make room in a full context as llama.cpp's CLI and server do; returns the number of positions dropped.

    Keeps the first ``n_keep`` positions (e.g. the system prompt), drops the
    next ``n_discard`` (default: half of the rest) and slides the remainder
    down by ``n_discard`` with :meth:`KVCache.seq_add`. The stored K rows must
    then be re-rotated (``apply_k_shift``) before the next decode.
    """
    if not cache.can_shift:
        raise ContextFullError("this KV cache cannot shift its context (the sliding-window cache is smaller than "
                               "the base cache; use swa_full)")
    n_past = cache.seq_pos_max(seq_id) + 1
    n_left = n_past - n_keep
    if n_discard is None:
        n_discard = n_left // 2
    if n_discard <= 0 or n_left <= 0:
        raise ContextFullError(f"nothing to discard: sequence {seq_id} has {n_past} positions, {n_keep} kept")
    n_discard = min(n_discard, n_left)
    cache.seq_rm(seq_id, n_keep, n_keep + n_discard)
    cache.seq_add(seq_id, n_keep + n_discard, n_past, -n_discard)
    return n_discard


__all__ = ["Memory", "ContextFullError", "context_shift"]
