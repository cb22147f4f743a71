"""The fast kernel set's entry point: the same contract and the same path choice as the reference
``llmlab.ggml.cpu.ops.mul_mat_quantized``, each path through its numba twin.

    mul_mat_quantized(raw, qtype, x, repacked=False) -> (T, R) float32

* q4_0, q4_1, q5_0, q8_0: ggml's AVX2 vec_dot order (``q32.mul_mat_<type>``), for every T
  (q4_0 in the REPACK buffer computes the same sums here, as in the reference);
* q4_K in the REPACK buffer (``repacked`` and rows % 8 == 0, decided by the caller as ops.mul_mat does):
  gemv / gemm (``kquants.mul_mat_q4_k_repacked``);
* q4_K / q6_K otherwise: vec_dot below 8 activation rows, the tiled kernels from 8 rows on;
* anything else: the NumPy reference.

Weights are repacked once (the packed arrays are cached, keyed by the weight buffer's address, shape
and type; the cache keeps the weight array alive so that the address cannot be reused).
"""
from __future__ import annotations

import numpy as np

from . import kquants, q32
from ._common import set_threads
from .quantize import quantize_q8_0, quantize_q8_1, quantize_q8_k

Q32_TYPES = ("q4_0", "q4_1", "q5_0", "q8_0")
K_TYPES = ("q4_k", "q6_k")
REPACK_TYPES = frozenset({"q4_0", "q4_k", "q2_k", "iq4_nl", "mxfp4"})   # as the x86 profiles list them
TILED_MIN_ROWS = 8                                                      # ggml_tiled_min_batch

_PACKED: dict[tuple, tuple] = {}


def supports(qtype) -> bool:
    return qtype.name in Q32_TYPES or qtype.name in K_TYPES


def path_of(qtype, n_rows: int, repacked: bool = False) -> str:
    """Which kernel the reference takes: 'vec_dot', 'tiled', 'repack' (or 'reference' without a twin)."""
    name = qtype.name
    if name in Q32_TYPES:
        return "vec_dot"
    if name in K_TYPES:
        if repacked and name in REPACK_TYPES:
            return "repack"
        return "tiled" if n_rows >= TILED_MIN_ROWS else "vec_dot"
    return "reference"


def packed(raw: np.ndarray, qtype, K: int) -> tuple:
    """The kernel layout of a weight, made once and cached."""
    arr = np.asarray(raw)
    key = (arr.__array_interface__["data"][0], arr.shape, arr.strides, arr.dtype.str, qtype.name, K)
    hit = _PACKED.get(key)
    if hit is None:
        rows = np.ascontiguousarray(arr).view(np.uint8).reshape(-1, K // qtype.block_size * qtype.type_size)
        name = qtype.name
        if name in Q32_TYPES:
            p = q32.pack_q32(rows, name, K)
        elif name == "q4_k":
            p = kquants.pack_q4_k(rows, K)
        else:
            p = kquants.pack_q6_k(rows, K)
        hit = (arr, rows.shape[0], p)
        _PACKED[key] = hit
    return hit[1], hit[2]


def packed_nbytes() -> int:
    """Bytes held by the packed-weight cache (the extra memory of the fast path)."""
    return sum(a.nbytes for _, _, p in _PACKED.values() for a in p)


def clear_cache() -> None:
    _PACKED.clear()


def mul_mat_quantized(raw: np.ndarray, qtype, x: np.ndarray, repacked: bool = False) -> np.ndarray:
    """x (T, K) float32 times the quantized rows raw (R, row_bytes) -> (T, R) float32, bit for bit
    what the reference ``ops.mul_mat_quantized(raw, qtype, x, repacked)`` returns."""
    if not supports(qtype):
        from ..ops import mul_mat_quantized as reference
        return reference(raw, qtype, x, repacked)
    x = np.ascontiguousarray(x, dtype=np.float32)
    x = x.reshape(-1, x.shape[-1])
    K = x.shape[1]
    R, p = packed(raw, qtype, K)
    name = qtype.name
    path = path_of(qtype, len(x), repacked)
    if name == "q4_1":
        out = q32.mul_mat_q4_1(*p, *quantize_q8_1(x))
    elif name in Q32_TYPES:
        out = getattr(q32, "mul_mat_" + name)(*p, *quantize_q8_0(x))
    else:
        a = quantize_q8_k(x)
        if path == "repack":
            out = kquants.mul_mat_q4_k_repacked(*p, *a)
        elif path == "tiled":
            out = getattr(kquants, f"mul_mat_{name}_tiled")(*p, *a)
        else:
            out = getattr(kquants, f"mul_mat_{name}")(*p, *a)
    return out if out.shape[1] == R else np.ascontiguousarray(out[:, :R])


set_threads()
