"""The KV cache, managed the way llama.cpp manages it.

llama.cpp keeps, per layer, a K and a V tensor of ``size`` rows ("cells") and,
beside them, a little metadata per cell (``src/llama-kv-cells.h``): the
token position the cell holds (``-1``: empty) and the set of sequences that
see it. Everything the cache does is bookkeeping on that metadata
(``src/llama-kv-cache.cpp``):

- ``find_slot``: walk the ring of cells from the ``head`` pointer, wrapping
  around, and take the free cells a micro-batch needs;
- ``prepare``: place all micro-batches of a batch as a dry run, then roll the
  cells back, so a batch that does not fit leaves the cache untouched;
- ``apply_ubatch``: really place one micro-batch and move ``head`` past it;
- ``seq_rm``, ``seq_cp``, ``seq_keep``, ``seq_add``, ``seq_div``: the
  ``llama_memory_seq_*`` operations (forget, share, keep-only, shift and
  compress positions);
- ``kq_mask``: the ``[n_tokens, n_kv]`` additive mask (0 or -inf) that lets a
  token see exactly the cells of its own sequence at positions ``<=`` its own,
  and, for a sliding-window cache, less than ``n_swa`` positions back.

Models with sliding-window layers (Gemma 3) get two caches
(:class:`~llmlab.llama.kv_cache_iswa.KVCacheISWA`, ``llama-kv-cache-iswa.cpp``):
one for the global layers and one, whose cells may be recycled once they fall
out of the window, for the local layers. The interface both offer a context is
:class:`~llmlab.llama.memory.Memory` (``llama-memory.h``); the sliding-window
rule is the hyperparameters' (:meth:`~llmlab.llama.hparams.HParams.is_masked_swa`).

The metadata here is NumPy arrays (``pos``, ``shift``, a boolean
``seq[cell, seq_id]`` matrix) so each operation reads as one line of array
math; the K/V data are arrays of the cache type (``float16`` for f16,
``float32`` for f32, raw q8_0 blocks for q8_0), one row per cell::

    cache = make_kv_cache(n_ctx=512, n_layer=30, n_embd_k_gqa=192)   # kv_cache_iswa; or KVCache(...)
    ubatches = BatchAllocator(Batch.from_tokens(ids), memory=cache).split_all(n_ubatch=512)
    slots = cache.prepare(ubatches)               # raises ContextFullError if they do not fit
    for ub, slot in zip(ubatches, slots):
        cache.apply_ubatch(slot, ub)
        mask = cache.kq_mask(ub)                  # (n_tokens, n_kv) float32
        for il in range(n_layer):
            cache.store(il, slot, k_cur, v_cur)   # rows (n_tokens, n_embd_k_gqa)
            k = cache.k(il)                       # (n_kv, n_embd_k_gqa), cache dtype

``n_kv()`` is what llama.cpp's attention reads: the used cells padded to 256
(``get_n_kv``), so the KQ matrix of a short prompt is ``[256, n_tokens]``.
A graph that keeps its own K/V tensors can use the cache for its cells only
(``allocate=False``) and write rows at ``slot.idxs``. With a quantized cache
(q8_0) this llama.cpp rotates K and V (``attn_inp_k_rot``) before storing.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence

import numpy as np

from .batch import UBatch
from .hparams import HParams
from .kv_cells import KVCells
from .memory import ContextFullError
from ..ggml.cpu.journal import rows_written
from ..ggml.cpu.quants import quantize_activations
from ..ggml.quant import dequantize
from ..ggml.types import GGMLType, ggml_type

N_KV_PAD = 256   # llama_kv_cache::get_n_kv pads the attended cells so the graph keeps its shape and can be reused
CACHE_TYPES = ("f32", "f16", "q8_0")


# --------------------------------------------------------------------------------------------------------------
# memory accounting
# --------------------------------------------------------------------------------------------------------------
CTX_PAD = 256     # llama_context pads n_ctx to a multiple of 256


def padded_n_ctx(n_ctx: int) -> int:
    """The cells a context of ``n_ctx`` tokens gets (llama_context: ``GGML_PAD(n_ctx, 256)``)."""
    return -(-n_ctx // CTX_PAD) * CTX_PAD


def cache_type(t: str | GGMLType) -> GGMLType:
    t = ggml_type(t)
    if t.name not in CACHE_TYPES:
        raise ValueError(f"unsupported KV cache type {t.name!r} (supported: {', '.join(CACHE_TYPES)})")
    return t


def kv_cache_bytes(n_ctx: int, n_layer: int, n_embd_k_gqa: int, n_embd_v_gqa: int | None = None,
                   type_k: str = "f16", type_v: str | None = None) -> int:
    """n_ctx x n_layer x (K row + V row): with one type, n_ctx x n_layer x 2 x n_embd_gqa x sizeof(type).

    ``sizeof(type)`` is bytes per element: 4 (f32), 2 (f16), 34/32 (q8_0).
    """
    n_embd_v_gqa = n_embd_k_gqa if n_embd_v_gqa is None else n_embd_v_gqa
    tk, tv = cache_type(type_k), cache_type(type_v or type_k)
    return n_ctx * n_layer * (tk.row_size(n_embd_k_gqa) + tv.row_size(n_embd_v_gqa))


# --------------------------------------------------------------------------------------------------------------
# the cache
# --------------------------------------------------------------------------------------------------------------
@dataclass
class Slot:
    """Where a micro-batch goes (``slot_info``): the cell index of each of its tokens."""

    idxs: np.ndarray   # int32 [n_tokens]

    def __len__(self) -> int:
        return len(self.idxs)

    @property
    def is_contiguous(self) -> bool:
        return bool(len(self.idxs) == 0 or (np.diff(self.idxs) == 1).all())

    def __repr__(self) -> str:
        i = self.idxs
        where = f"[{i[0]}, {i[-1] + 1})" if self.is_contiguous and len(i) else str(i.tolist())
        return f"Slot({len(i)} cells {where})"


class KVCache(KVCells):
    """A unified (single-stream) ``llama_kv_cache``: its cells (:class:`~llmlab.llama.kv_cells.KVCells`:
    positions, sequences and the ``seq_*`` operations), plus the K/V rows, the slot search and the mask.

    Parameters: ``size`` cells; ``layers``: the layer indices it stores (an int
    ``n`` means ``range(n)``); ``n_embd_k_gqa``/``n_embd_v_gqa``: the width of
    a K/V row (n_head_kv x head size); ``type_k``/``type_v`` one of f32, f16,
    q8_0; ``n_seq_max`` sequences; ``n_swa``/``swa_type``: the sliding window
    of this cache (``"none"`` for a global cache); ``allocate=False`` keeps
    only the cell metadata (for pictures and accounting).
    """

    def __init__(self, size: int, layers: int | Sequence[int], n_embd_k_gqa: int, n_embd_v_gqa: int | None = None,
                 type_k: str = "f16", type_v: str | None = None, n_seq_max: int = 1,
                 n_swa: int = 0, swa_type: str = "none", allocate: bool = True):
        super().__init__(size, n_seq_max)                   # the cell metadata (llama_kv_cells)
        if swa_type not in HParams.SWA_TYPES:
            raise ValueError(f"unknown swa_type {swa_type!r} (known: {', '.join(HParams.SWA_TYPES)})")
        if swa_type != "none" and n_swa < 1:
            raise ValueError(f"a sliding-window cache needs n_swa >= 1, not {n_swa}")
        self.layers = list(range(layers)) if isinstance(layers, int) else [int(i) for i in layers]
        self.n_embd_k_gqa = int(n_embd_k_gqa)
        self.n_embd_v_gqa = int(n_embd_k_gqa if n_embd_v_gqa is None else n_embd_v_gqa)
        self.type_k = cache_type(type_k)
        self.type_v = cache_type(type_v or type_k)
        self.n_swa = int(n_swa)
        self.swa_type = swa_type
        # data: one row per cell
        self._k: dict[int, np.ndarray] = {}
        self._v: dict[int, np.ndarray] = {}
        if allocate:
            self.allocate()

    # -- data ---------------------------------------------------------------------------------------------------
    def allocate(self) -> None:
        """Create the K/V arrays (zeros), ``total_bytes()`` in all."""
        for il in self.layers:
            self._k[il] = _alloc(self.type_k, self.size, self.n_embd_k_gqa)
            self._v[il] = _alloc(self.type_v, self.size, self.n_embd_v_gqa)

    def k(self, il: int, n_kv: int | None = None) -> np.ndarray:
        """The stored K rows of layer ``il`` for the first ``n_kv`` cells (default: ``self.n_kv()``), cache dtype."""
        return self._k[il][: self.n_kv() if n_kv is None else n_kv]

    def v(self, il: int, n_kv: int | None = None) -> np.ndarray:
        return self._v[il][: self.n_kv() if n_kv is None else n_kv]

    def k_float(self, il: int, n_kv: int | None = None) -> np.ndarray:
        """K rows as float32 (dequantized for q8_0)."""
        return _to_float(self.type_k, self.k(il, n_kv), self.n_embd_k_gqa)

    def v_float(self, il: int, n_kv: int | None = None) -> np.ndarray:
        return _to_float(self.type_v, self.v(il, n_kv), self.n_embd_v_gqa)

    def store(self, il: int, slot: Slot, k_cur: np.ndarray, v_cur: np.ndarray) -> None:
        """Write a micro-batch's K and V rows into its cells (llama.cpp's ``cpy_k``/``cpy_v``: SET_ROWS).

        ``k_cur``: ``(n_tokens, n_embd_k_gqa)`` float32 (any shape with that many
        elements); converted to the cache type (f16: round to nearest even).
        """
        n = len(slot)
        self._k[il][slot.idxs] = _from_float(self.type_k, np.asarray(k_cur, np.float32).reshape(n, self.n_embd_k_gqa))
        self._v[il][slot.idxs] = _from_float(self.type_v, np.asarray(v_cur, np.float32).reshape(n, self.n_embd_v_gqa))
        rows_written(self._k[il], slot.idxs)
        rows_written(self._v[il], slot.idxs)

    # -- accounting ---------------------------------------------------------------------------------------------
    def size_k_bytes(self) -> int:
        return self.size * len(self.layers) * self.type_k.row_size(self.n_embd_k_gqa)

    def size_v_bytes(self) -> int:
        return self.size * len(self.layers) * self.type_v.row_size(self.n_embd_v_gqa)

    def total_bytes(self) -> int:
        """size x n_layer x (K row + V row) bytes, as llama.cpp reports it."""
        return self.size_k_bytes() + self.size_v_bytes()

    def n_kv(self, il: int | None = None) -> int:
        """Cells the attention looks at (any layer ``il`` of this cache): ``used_max_p1`` padded to 256, at most ``size`` (``get_n_kv``)."""
        return min(self.size, max(N_KV_PAD, -(-self.used_max_p1() // N_KV_PAD) * N_KV_PAD))

    # -- shifting positions -------------------------------------------------------------------------------------
    @property
    def can_shift(self) -> bool:
        return True

    def apply_k_shift(self, rope: Callable[[int, np.ndarray, np.ndarray], np.ndarray]) -> None:
        """Re-rotate the stored K rows of shifted cells, then forget the shifts (llama.cpp's K-shift graph).

        ``rope(il, k, delta)`` gets float32 rows ``(n_cells, n_embd_k_gqa)`` and
        their position deltas, returns the rotated rows. Cells with no shift are
        left alone: rotating by 0 changes nothing.
        """
        cells = np.flatnonzero((self.pos >= 0) & (self.shift != 0))
        if len(cells) and self._k:
            for il in self.layers:
                k = _to_float(self.type_k, self._k[il][cells], self.n_embd_k_gqa)
                self._k[il][cells] = _from_float(self.type_k, np.asarray(rope(il, k, self.shift[cells]), np.float32))
                rows_written(self._k[il], cells)
        self.shift[:] = 0
        self.has_shift = False

    # -- placing micro-batches ----------------------------------------------------------------------------------
    def find_slot(self, ubatch: UBatch, cont: bool = False, trace: list | None = None) -> Slot | None:
        """Find cells for the micro-batch's tokens, walking the ring from ``head`` (``find_slot``).

        A cell is usable when it is empty, or (sliding-window caches) when it
        holds one sequence and has fallen out of that sequence's window. With
        ``cont`` the cells must be consecutive. Returns ``None`` when one full
        turn of the ring finds too few. Nothing is modified. If ``trace`` is a
        list, each tested cell is appended as ``(cell, usable)``.
        """
        n_tokens = ubatch.n_tokens
        size = self.size
        if n_tokens > size:
            return None
        head = self.head
        # many free cells before the head: start from the beginning, hoping to fill the cache densely
        if head > self.used + 2 * n_tokens:
            head = 0
        # the cells' current "max pos" per sequence decides which SWA cells have expired
        pos_max = {}
        if self.swa_type != "none":
            for s in range(self.n_seq_max):
                pos_max[s] = self.seq_pos_max(s)

        def usable(i: int) -> bool:
            if self.pos[i] < 0:
                return True
            ids = np.flatnonzero(self.seq[i])
            if len(ids) != 1 or self.swa_type == "none":
                return False
            return bool(HParams.is_masked_swa(self.n_swa, self.swa_type, self.pos[i], pos_max[int(ids[0])] + 1))

        idxs: list[int] = []
        n_tested = 0
        n_test = n_tokens if cont else 1
        while True:
            if head + n_test > size:             # wrap around
                n_tested += size - head
                head = 0
                continue
            for _ in range(n_test):
                i = head
                head += 1
                n_tested += 1
                ok = usable(i)
                if trace is not None:
                    trace.append((i, ok))
                if ok:
                    idxs.append(i)
                elif cont:
                    break
            if len(idxs) == n_tokens:
                break
            if cont:
                idxs.clear()
            if n_tested >= size:
                return None
        return Slot(np.array(idxs, dtype=np.int32))

    def apply_ubatch(self, slot: Slot, ubatch: UBatch) -> None:
        """Place the micro-batch in its cells and move ``head`` past the last one.

        A recycled (sliding-window) cell drops its old token; then every older
        position of that sequence is purged too, so each sequence stays a
        gap-free run of positions in the cache.
        """
        seq_pos_max_rm: dict[int, int] = {}
        for i, p, ids in zip(slot.idxs.tolist(), ubatch.pos.tolist(), ubatch.seq_ids):
            if self.pos[i] >= 0:
                (s,) = np.flatnonzero(self.seq[i]).tolist()
                seq_pos_max_rm[s] = max(seq_pos_max_rm.get(s, -1), int(self.pos[i]))
                self.pos[i], self.shift[i], self.seq[i] = -1, 0, False
            self.pos[i] = p
            self.seq[i, list(ids)] = True
        for s, pmax in sorted(seq_pos_max_rm.items()):
            pmin = self.seq_pos_min(s)
            if 0 <= pmin <= pmax:
                self.seq_rm(s, pmin, pmax + 1)
        self.head = int(slot.idxs[-1]) + 1

    def snapshot(self) -> "KVCache":
        """A copy of the cell metadata (no K/V data): for pictures of the cache over time."""
        c = KVCache(self.size, self.layers, self.n_embd_k_gqa, self.n_embd_v_gqa, self.type_k.name, self.type_v.name,
                    self.n_seq_max, self.n_swa, self.swa_type, allocate=False)
        c.restore(self.state())
        return c


    def prepare(self, ubatches: Sequence[UBatch]) -> list[Slot]:
        """Find a slot for every micro-batch, as a dry run (``prepare``): the cells are rolled back afterwards.

        Later micro-batches see the earlier ones placed. Raises
        :class:`ContextFullError` if any does not fit; the cache is then
        unchanged. Apply the returned slots in order with :meth:`apply_ubatch`.
        """
        if len(ubatches) == 1:          # a decode step: nothing placed before it to roll back
            return [self._find_or_raise(ubatches[0])]
        saved = self.state()
        slots = []
        try:
            for ub in ubatches:
                slot = self._find_or_raise(ub)
                slots.append(slot)
                self.apply_ubatch(slot, ub)
        finally:
            self.restore(saved)
        return slots

    def _find_or_raise(self, ub: UBatch) -> Slot:
        slot = self.find_slot(ub)
        if slot is None:
            raise ContextFullError(
                f"the KV cache is full: no room for a micro-batch of {ub.n_tokens} tokens "
                f"(cache size {self.size} cells, {self.used} used"
                f"{f', window {self.n_swa}' if self.swa_type != 'none' else ''}); "
                "remove sequences (seq_rm), use a larger n_ctx, or ask for a context shift")
        return slot

    # -- attention mask -----------------------------------------------------------------------------------------
    def kq_mask(self, ubatch: UBatch, n_kv: int | None = None, causal: bool = True, il: int | None = None,
                out: np.ndarray | None = None) -> np.ndarray:
        """The additive KQ mask ``(n_tokens, n_kv)`` float32: 0 where token i may see cell j, -inf elsewhere.

        Visible: the cell is non-empty, belongs to the token's (first) sequence,
        is not in its future (causal), and, for a sliding-window cache, is
        inside the window. Built as ``set_input_kq_mask`` does; llama.cpp stores
        it as ggml ne ``[n_kv, n_tokens]`` (f16 with flash attention). ``out``: a float32
        ``(n_tokens, n_kv)`` array (a graph's input) written in place and returned.
        """
        n_kv = self.n_kv() if n_kv is None else n_kv
        p0 = self.pos[:n_kv][None, :]
        p1 = ubatch.pos[:, None]
        visible = self.seq[:n_kv, ubatch.seq_id0].T.copy()
        if causal:
            visible &= p0 <= p1
        if self.swa_type != "none":
            visible &= ~HParams.is_masked_swa(self.n_swa, self.swa_type, p0, p1)
        if out is None:
            return np.where(visible, np.float32(0), np.float32(-np.inf))
        out.fill(-np.inf)                                   # in place: no mask of floats made and copied
        np.copyto(out, np.float32(0), where=visible)
        return out

    def layer_cache(self, il: int) -> "KVCache":
        """The cache holding layer ``il`` (this one; :class:`KVCacheISWA` picks one of its two)."""
        if il not in self.layers:
            raise KeyError(f"layer {il} has no KV cache here (layers: {self.layers})")
        return self

    @property
    def caches(self) -> tuple["KVCache"]:
        return (self,)

    def k_idxs(self, slot: Slot, il: int) -> np.ndarray:
        """The cells layer ``il`` writes this micro-batch's rows to (``set_input_k_idxs``)."""
        self.layer_cache(il)
        return slot.idxs

    def __repr__(self) -> str:
        swa = f", swa={self.swa_type}:{self.n_swa}" if self.swa_type != "none" else ""
        return (f"KVCache(size={self.size}, used={self.used}, head={self.head}, layers={len(self.layers)}, "
                f"k={self.type_k.name}x{self.n_embd_k_gqa}, v={self.type_v.name}x{self.n_embd_v_gqa}{swa})")



# --------------------------------------------------------------------------------------------------------------
# row conversion for the cache types
# --------------------------------------------------------------------------------------------------------------
_NUMPY = {"f32": np.float32, "f16": np.float16}


def _alloc(t: GGMLType, n_rows: int, n_embd: int) -> np.ndarray:
    if t.name in _NUMPY:
        return np.zeros((n_rows, n_embd), _NUMPY[t.name])
    return np.zeros((n_rows, t.row_size(n_embd)), np.uint8)


def _from_float(t: GGMLType, x: np.ndarray) -> np.ndarray:
    """Rows of float32 -> rows of the cache type, as ggml-cpu's SET_ROWS converts (its ``from_float``).

    f16: round to nearest even (F16C). q8_0: ggml-cpu's quantize_row_q8_0, the same routine that
    quantizes activations for q8_0 dot products.
    """
    if t.name in _NUMPY:
        return x.astype(_NUMPY[t.name])
    blocks = quantize_activations(np.ascontiguousarray(x, np.float32), t.name)
    return np.ascontiguousarray(blocks).view(np.uint8).reshape(len(x), -1)


def _to_float(t: GGMLType, rows: np.ndarray, n_embd: int) -> np.ndarray:
    if t.name in _NUMPY:
        return rows.astype(np.float32)
    return dequantize(np.ascontiguousarray(rows).reshape(-1), t.name).reshape(len(rows), n_embd)


__all__ = ["KVCache", "Slot", "kv_cache_bytes", "cache_type", "CTX_PAD", "padded_n_ctx", "CACHE_TYPES", "N_KV_PAD"]
