"""ctypes bridge to the real ggml shipped inside llama-cpp-python (test helper only).

Gives the tests llama.cpp's own answers: ``ggml_quantize_chunk`` (the reference quantizers
llama-quantize runs), the type table's ``to_float``, and ggml-cpu's ``type_traits_cpu``
(``from_float`` for activations and ``vec_dot``) as this machine's build runs them.
"""
from __future__ import annotations

import ctypes as C
import os
from functools import lru_cache

import numpy as np

from llmlab.ggml.types import ggml_type


class TypeTraits(C.Structure):
    _fields_ = [("type_name", C.c_char_p), ("blck_size", C.c_int64), ("blck_size_interleave", C.c_int64),
                ("type_size", C.c_size_t), ("is_quantized", C.c_bool), ("to_float", C.c_void_p),
                ("from_float_ref", C.c_void_p)]


class TypeTraitsCPU(C.Structure):
    _fields_ = [("from_float", C.c_void_p), ("vec_dot", C.c_void_p), ("vec_dot_type", C.c_int), ("nrows", C.c_int64)]


TO_FLOAT = C.CFUNCTYPE(None, C.c_void_p, C.c_void_p, C.c_int64)
FROM_FLOAT = C.CFUNCTYPE(None, C.c_void_p, C.c_void_p, C.c_int64)
VEC_DOT = C.CFUNCTYPE(None, C.c_int, C.POINTER(C.c_float), C.c_size_t, C.c_void_p, C.c_size_t, C.c_void_p, C.c_size_t, C.c_int)


@lru_cache(maxsize=None)
def libs():
    import llama_cpp  # noqa: F401  (raises ImportError when llama-cpp-python is missing)
    d = os.path.join(os.path.dirname(llama_cpp.__file__), "lib")
    base = C.CDLL(os.path.join(d, "libggml-base.so"), mode=C.RTLD_GLOBAL)
    cpu = C.CDLL(os.path.join(d, "libggml-cpu.so"), mode=C.RTLD_GLOBAL)
    base.ggml_quantize_chunk.restype = C.c_size_t
    base.ggml_quantize_chunk.argtypes = [C.c_int, C.c_void_p, C.c_void_p, C.c_int64, C.c_int64, C.c_int64, C.c_void_p]
    base.ggml_get_type_traits.restype = C.POINTER(TypeTraits)
    base.ggml_get_type_traits.argtypes = [C.c_int]
    cpu.ggml_get_type_traits_cpu.restype = C.POINTER(TypeTraitsCPU)
    cpu.ggml_get_type_traits_cpu.argtypes = [C.c_int]
    cpu.ggml_cpu_init()
    return base, cpu


def quantize_chunk(x: np.ndarray, qtype) -> np.ndarray:
    """llama.cpp's quantizer (no importance matrix): rows of x (nrows, n) -> raw bytes."""
    t = ggml_type(qtype)
    base, _ = libs()
    x = np.ascontiguousarray(x, np.float32)
    nrows, n = x.reshape(-1, x.shape[-1]).shape
    out = np.zeros(nrows * t.row_size(n), np.uint8)
    base.ggml_quantize_init(t.id)
    base.ggml_quantize_chunk(t.id, x.ctypes.data, out.ctypes.data, 0, nrows, n, None)
    return out


def to_float(raw: np.ndarray, qtype) -> np.ndarray:
    t = ggml_type(qtype)
    base, _ = libs()
    raw = np.ascontiguousarray(raw, np.uint8)
    n = raw.size // t.type_size * t.block_size
    out = np.zeros(n, np.float32)
    fn = base.ggml_get_type_traits(t.id).contents.to_float
    if not fn:
        raise NotImplementedError(f"ggml has no to_float for {t.name}")
    TO_FLOAT(fn)(raw.ctypes.data, out.ctypes.data, n)
    return out


def cpu_traits(qtype):
    _, cpu = libs()
    return cpu.ggml_get_type_traits_cpu(ggml_type(qtype).id).contents


def activation_quantize(x: np.ndarray, partner) -> np.ndarray:
    """ggml-cpu's from_float for the partner type, one row."""
    t = ggml_type(partner)
    x = np.ascontiguousarray(x, np.float32).reshape(-1)
    out = np.zeros(t.row_size(x.size), np.uint8)
    FROM_FLOAT(cpu_traits(t).from_float)(x.ctypes.data, out.ctypes.data, x.size)
    return out


def vec_dot(w_row: np.ndarray, qtype, x: np.ndarray) -> float:
    """ggml-cpu: quantize x to the partner type, then vec_dot with one weight row."""
    tr = cpu_traits(qtype)
    a = activation_quantize(x, tr.vec_dot_type)
    s = C.c_float(0)
    w_row = np.ascontiguousarray(w_row, np.uint8)
    VEC_DOT(tr.vec_dot)(x.size, C.byref(s), 0, w_row.ctypes.data, 0, a.ctypes.data, 0, 1)
    return s.value


def quantize_row_ref(x: np.ndarray, qtype) -> np.ndarray:
    """ggml-base's ``quantize_row_<type>_ref`` called by name (for q8_1 / q8_K, which quantize_chunk skips)."""
    t = ggml_type(qtype)
    base, _ = libs()
    fn = getattr(base, f"quantize_row_{t.name.replace('_k', '_K')}_ref")
    x = np.ascontiguousarray(x, np.float32).reshape(-1)
    out = np.zeros(x.size // t.block_size * t.type_size, np.uint8)
    fn.argtypes = [C.c_void_p, C.c_void_p, C.c_int64]
    fn(x.ctypes.data, out.ctypes.data, x.size)
    return out


def _one_op(op: str, srcs: list[tuple[int, int, int, np.ndarray]], out_shape: tuple, mem: int,
            n_threads: int) -> np.ndarray:
    """``ggml_<op>(ctx, *srcs)`` on 2-D tensors given as (ggml type id, ne0, ne1, bytes), computed by
    ggml-cpu's ggml_graph_compute_with_ctx; the result as float32 ``out_shape``."""
    from llmlab.llamacpp.ggml_tensor import GGMLInitParams, GGMLTensor, check_layout
    check_layout()
    base, cpu = libs()
    for lib, fn, args, res in [
        (base, "ggml_init", [GGMLInitParams], C.c_void_p),
        (base, "ggml_free", [C.c_void_p], None),
        (base, "ggml_new_tensor_2d", [C.c_void_p, C.c_int, C.c_int64, C.c_int64], C.c_void_p),
        (base, f"ggml_{op}", [C.c_void_p] * (1 + len(srcs)), C.c_void_p),
        (base, "ggml_new_graph", [C.c_void_p], C.c_void_p),
        (base, "ggml_build_forward_expand", [C.c_void_p, C.c_void_p], None),
        (cpu, "ggml_graph_compute_with_ctx", [C.c_void_p, C.c_void_p, C.c_int], C.c_int),
    ]:
        f = getattr(lib, fn)
        f.argtypes, f.restype = args, res
    ctx = base.ggml_init(GGMLInitParams(mem, None, False))
    try:
        tensors = []
        for type_id, ne0, ne1, data in srcs:
            t = base.ggml_new_tensor_2d(ctx, type_id, ne0, ne1)
            C.memmove(GGMLTensor.from_address(t).data, data.ctypes.data, data.nbytes)
            tensors.append(t)
        d = getattr(base, f"ggml_{op}")(ctx, *tensors)
        g = base.ggml_new_graph(ctx)
        base.ggml_build_forward_expand(g, d)
        if cpu.ggml_graph_compute_with_ctx(ctx, g, n_threads) != 0:
            raise RuntimeError("ggml_graph_compute_with_ctx failed")
        out = np.empty(out_shape, np.float32)
        C.memmove(out.ctypes.data, GGMLTensor.from_address(d).data, out.nbytes)
    finally:
        base.ggml_free(ctx)
    return out


def mul_mat(raw: np.ndarray, qtype, x: np.ndarray, n_threads: int = 2) -> np.ndarray:
    """ggml-cpu's whole MUL_MAT op on a plain (not repacked) weight: rows raw (R, row_bytes) of
    ``qtype`` times activations x (T, n) -> (T, R), through ggml_graph_compute_with_ctx, so ggml
    picks the kernel itself (vec_dot, llamafile's sgemm, the tiled K-quant kernels...)."""
    t = ggml_type(qtype)
    x = np.ascontiguousarray(x, np.float32).reshape(-1, x.shape[-1])
    T, n = x.shape
    raw = np.ascontiguousarray(raw, np.uint8).reshape(-1)
    R = raw.size // t.row_size(n)
    mem = raw.size + 8 * x.nbytes + 8 * T * R + (n_threads + 2) * (1 << 20) + (8 << 20)
    return _one_op("mul_mat", [(t.id, n, R, raw), (0, n, T, x)], (T, R), mem, n_threads)


def unary(op: str, x: np.ndarray, n_threads: int = 2) -> np.ndarray:
    """ggml-cpu's whole op ``ggml_<op>(ctx, x)`` (soft_max, silu, gelu, ...) on f32 rows x (T, n)."""
    x = np.ascontiguousarray(x, np.float32).reshape(-1, x.shape[-1])
    T, n = x.shape
    mem = 4 * x.nbytes + (n_threads + 2) * (1 << 20) + (8 << 20)
    return _one_op(op, [(0, n, T, x)], (T, n), mem, n_threads)
