"""Interleaved sliding-window attention: two KV caches, one for the global layers and one for the
sliding-window ones (llama.cpp's ``llama_kv_cache_iswa``, ``src/llama-kv-cache-iswa.cpp``), and the
choice between one cache and the pair (``llama_model::create_memory``).

The sliding-window cache may recycle a cell once its token has fallen out of the window, so it needs
only the window plus one micro-batch of cells.
"""
from __future__ import annotations

from typing import Sequence

import numpy as np

from .batch import UBatch
from .kv_cache import KVCache, Slot

# llama_kv_cache_iswa: "the SWA cache is always padded to 256 for performance" (llama.cpp issue 17037),
# so its n_kv, padded to N_KV_PAD, never reads past the cache
SWA_CACHE_PAD = 256


def swa_cache_size(size_base: int, n_swa: int, n_ubatch: int, n_seq_max: int = 1, swa_full: bool = False) -> int:
    """Cells of the sliding-window cache: the window (per sequence) plus one micro-batch, padded to 256.

    With ``swa_full`` (llama.cpp's default context parameter) it is as big as the base cache.
    """
    if swa_full:
        return size_base
    return -(-min(size_base, n_swa * n_seq_max + n_ubatch) // SWA_CACHE_PAD) * SWA_CACHE_PAD


class KVCacheISWA:
    """Two :class:`KVCache` s: ``base`` for the global layers, ``swa`` for the sliding-window ones.

    Sequence operations go to both; ``prepare`` returns, per micro-batch, a
    pair of slots ``(base_slot, swa_slot)``; the per-layer calls (``store``,
    ``k``, ``v``, ``kq_mask``, ``n_kv``) take the layer index and route to the
    layer's cache.
    """

    def __init__(self, size: int, layers_base: Sequence[int], layers_swa: Sequence[int], n_embd_k_gqa: int,
                 n_embd_v_gqa: int | None = None, type_k: str = "f16", type_v: str | None = None,
                 n_seq_max: int = 1, n_swa: int = 512, swa_type: str = "standard", n_ubatch: int = 512,
                 swa_full: bool = False, allocate: bool = True):
        size_swa = swa_cache_size(size, n_swa, n_ubatch, n_seq_max, swa_full)
        kw = dict(n_embd_k_gqa=n_embd_k_gqa, n_embd_v_gqa=n_embd_v_gqa, type_k=type_k, type_v=type_v,
                  n_seq_max=n_seq_max, allocate=allocate)
        self.base = KVCache(size, list(layers_base), **kw)
        self.swa = KVCache(size_swa, list(layers_swa), n_swa=n_swa, swa_type=swa_type, **kw)
        self._by_layer = {il: self.base for il in self.base.layers} | {il: self.swa for il in self.swa.layers}

    @property
    def caches(self) -> tuple[KVCache, KVCache]:
        return self.base, self.swa

    def layer_cache(self, il: int) -> KVCache:
        try:
            return self._by_layer[il]
        except KeyError:
            raise KeyError(f"layer {il} has no KV cache here") from None

    @property
    def size(self) -> int:
        return self.base.size

    @property
    def n_seq_max(self) -> int:
        return self.base.n_seq_max

    # sequence operations: both caches
    def seq_rm(self, seq_id, p0=None, p1=None) -> bool:
        return self.base.seq_rm(seq_id, p0, p1) & self.swa.seq_rm(seq_id, p0, p1)

    def seq_cp(self, seq_src, seq_dst, p0=None, p1=None) -> None:
        self.base.seq_cp(seq_src, seq_dst, p0, p1)
        self.swa.seq_cp(seq_src, seq_dst, p0, p1)

    def seq_keep(self, seq_id) -> None:
        self.base.seq_keep(seq_id)
        self.swa.seq_keep(seq_id)

    def seq_add(self, seq_id, p0, p1, delta) -> None:
        self.base.seq_add(seq_id, p0, p1, delta)
        self.swa.seq_add(seq_id, p0, p1, delta)

    def seq_div(self, seq_id, p0, p1, d) -> None:
        self.base.seq_div(seq_id, p0, p1, d)
        self.swa.seq_div(seq_id, p0, p1, d)

    def clear(self) -> None:
        self.base.clear()
        self.swa.clear()

    # the base cache holds every position the SWA cache holds, and more: ask the SWA cache (as llama.cpp)
    def seq_pos_min(self, seq_id: int) -> int:
        return self.swa.seq_pos_min(seq_id)

    def seq_pos_max(self, seq_id: int) -> int:
        return self.swa.seq_pos_max(seq_id)

    @property
    def can_shift(self) -> bool:
        return self.base.size == self.swa.size

    @property
    def has_shift(self) -> bool:
        return self.base.has_shift or self.swa.has_shift

    def apply_k_shift(self, rope) -> None:
        self.base.apply_k_shift(rope)
        self.swa.apply_k_shift(rope)

    def prepare(self, ubatches: Sequence[UBatch]) -> list[tuple[Slot, Slot]]:
        return list(zip(self.base.prepare(ubatches), self.swa.prepare(ubatches)))

    def apply_ubatch(self, slots: tuple[Slot, Slot], ubatch: UBatch) -> None:
        self.base.apply_ubatch(slots[0], ubatch)
        self.swa.apply_ubatch(slots[1], ubatch)

    def state(self):
        return self.base.state(), self.swa.state()

    def restore(self, state) -> None:
        self.base.restore(state[0])
        self.swa.restore(state[1])

    # per layer
    def _slot(self, il, slots):
        return slots[0] if self.layer_cache(il) is self.base else slots[1]

    def k_idxs(self, slots: tuple[Slot, Slot], il: int) -> np.ndarray:
        return self._slot(il, slots).idxs

    def store(self, il: int, slots: tuple[Slot, Slot], k_cur, v_cur) -> None:
        self.layer_cache(il).store(il, self._slot(il, slots), k_cur, v_cur)

    def k(self, il, n_kv=None):
        return self.layer_cache(il).k(il, n_kv)

    def v(self, il, n_kv=None):
        return self.layer_cache(il).v(il, n_kv)

    def k_float(self, il, n_kv=None):
        return self.layer_cache(il).k_float(il, n_kv)

    def v_float(self, il, n_kv=None):
        return self.layer_cache(il).v_float(il, n_kv)

    def n_kv(self, il: int | None = None) -> int:
        return (self.base if il is None else self.layer_cache(il)).n_kv()

    def kq_mask(self, ubatch: UBatch, n_kv: int | None = None, causal: bool = True, il: int | None = None,
                out: np.ndarray | None = None) -> np.ndarray:
        """The mask of layer ``il``'s cache (``il=None``: the base cache's)."""
        return (self.base if il is None else self.layer_cache(il)).kq_mask(ubatch, n_kv, causal, out=out)

    def total_bytes(self) -> int:
        return self.base.total_bytes() + self.swa.total_bytes()

    def __repr__(self) -> str:
        return f"KVCacheISWA(base={self.base!r}, swa={self.swa!r})"


def make_kv_cache(n_ctx: int, n_layer: int, n_embd_k_gqa: int, n_embd_v_gqa: int | None = None,
                  swa_layers: Sequence[int] = (), n_swa: int = 0, swa_type: str = "standard",
                  type_k: str = "f16", type_v: str | None = None, n_seq_max: int = 1, n_ubatch: int = 512,
                  swa_full: bool = False, allocate: bool = True) -> KVCache | KVCacheISWA:
    """The cache llama.cpp creates for a model (``llama_model::create_memory``).

    A plain :class:`KVCache` of ``n_ctx`` cells for all layers, or, when some
    layers use a sliding window (``swa_layers``, e.g. Gemma 3's ``il % 6 < 5``),
    a :class:`KVCacheISWA`. ``n_ctx`` is the context size after llama.cpp's
    padding (a multiple of 256).
    """
    kw = dict(n_embd_k_gqa=n_embd_k_gqa, n_embd_v_gqa=n_embd_v_gqa, type_k=type_k, type_v=type_v,
              n_seq_max=n_seq_max, allocate=allocate)
    swa = sorted(set(int(i) for i in swa_layers))
    if not swa:
        return KVCache(n_ctx, n_layer, **kw)
    base = [il for il in range(n_layer) if il not in swa]
    return KVCacheISWA(n_ctx, base, swa, n_swa=n_swa, swa_type=swa_type, n_ubatch=n_ubatch, swa_full=swa_full, **kw)


__all__ = ["KVCacheISWA", "make_kv_cache", "swa_cache_size", "SWA_CACHE_PAD"]
