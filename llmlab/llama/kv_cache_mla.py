"""The KV cache of multi-head latent attention (MLA: DeepSeek-V2/V3, Kimi K2): K rows only, no V.

With the absorbed form llama.cpp runs (src/models/deepseek2.cpp, ``build_attn_inp_k``), every token
and layer stores one *latent* row of ``kv_lora_rank + n_rot`` values: the normalized compressed KV
(``kv_cmpr``, kv_lora_rank values) followed by the RoPE'd shared key part (``k_pe``, n_rot values).
The attention reads it as one K head shared by all query heads (MQA), and reads its first
``kv_lora_rank`` values again as V: there is no V tensor (``llama_kv_cache``: ``has_v = !is_mla``,
PR #19067). DeepSeek-V3 thus keeps 576 values per token and layer where its 128 heads of 192 + 128
would need 40960 as plain MHA.

:class:`KVCacheMLA` is a :class:`~llmlab.llama.kv_cache.KVCache` whose V part is empty: the same
cells, ring and masks; ``k`` rows of ``kv_lora_rank + n_rot``; ``v`` the view of each K row's first
``kv_lora_rank`` values; no bytes counted for V.
"""
from __future__ import annotations

from typing import Sequence

import numpy as np

from .. import LLMLabError
from ..ggml.cpu.journal import rows_written
from .kv_cache import KVCache, Slot, _alloc, _from_float


class KVCacheMLA(KVCache):
    """One latent row per token and layer (K only); ``kv_lora_rank`` says how much of it V reads."""

    def __init__(self, size: int, layers: int | Sequence[int], n_embd_k_gqa: int, kv_lora_rank: int,
                 type_k: str = "f16", n_seq_max: int = 1, allocate: bool = True):
        if not 0 < kv_lora_rank <= n_embd_k_gqa:
            raise ValueError(f"kv_lora_rank {kv_lora_rank} must be in [1, {n_embd_k_gqa}] (the latent row)")
        self.kv_lora_rank = int(kv_lora_rank)
        super().__init__(size, layers, n_embd_k_gqa, kv_lora_rank, type_k=type_k, type_v=type_k,
                         n_seq_max=n_seq_max, allocate=allocate)

    @property
    def has_v(self) -> bool:
        return False

    def allocate(self) -> None:
        for il in self.layers:
            self._k[il] = _alloc(self.type_k, self.size, self.n_embd_k_gqa)

    def v(self, il: int, n_kv: int | None = None) -> np.ndarray:
        """The values attention reads as V: the first kv_lora_rank of each stored K row (a view, no copy)."""
        if self.type_k.block_size != 1:
            raise LLMLabError("an MLA cache of a quantized type has no element view of V")
        return self.k(il, n_kv)[:, : self.kv_lora_rank]

    def store(self, il: int, slot: Slot, k_cur: np.ndarray, v_cur: np.ndarray | None = None) -> None:
        """Write the latent rows (``v_cur`` is ignored: V is part of K)."""
        n = len(slot)
        self._k[il][slot.idxs] = _from_float(self.type_k, np.asarray(k_cur, np.float32).reshape(n, self.n_embd_k_gqa))
        rows_written(self._k[il], slot.idxs)

    def size_v_bytes(self) -> int:
        return 0

    @property
    def can_shift(self) -> bool:
        return False          # the K-shift would re-rotate only the last n_rot values of each row: not built here

    def snapshot(self) -> "KVCacheMLA":
        c = KVCacheMLA(self.size, self.layers, self.n_embd_k_gqa, self.kv_lora_rank, self.type_k.name,
                       self.n_seq_max, allocate=False)
        c.restore(self.state())
        return c

    def __repr__(self) -> str:
        return (f"KVCacheMLA(size={self.size}, used={self.used}, head={self.head}, layers={len(self.layers)}, "
                f"k={self.type_k.name}x{self.n_embd_k_gqa} (latent {self.kv_lora_rank} + rope "
                f"{self.n_embd_k_gqa - self.kv_lora_rank}), v=none: the first {self.kv_lora_rank} of each K row)")


def mla_cache_bytes(n_ctx: int, n_layer: int, n_embd_k_gqa: int, type_k: str = "f16") -> int:
    """n_ctx x n_layer x one latent row: what an MLA model's cache costs (no V)."""
    from .kv_cache import cache_type
    return n_ctx * n_layer * cache_type(type_k).row_size(n_embd_k_gqa)
