"""The one table of kernel twins: ``(weight type, path) -> Twin``, each NumPy reference kernel of
``llmlab.ggml.cpu`` with the numba kernels that give its bits and the packers of their layouts.

The path is the reference's (``llmlab.ggml.cpu.ops.quantized_path``: vec_dot, tiled or repack, from the
CPU profile); ``generic`` runs on any host, ``byte_dot`` (``dot4``: AVX512-VNNI or AVX2 byte dot
products) where the host has one of those instruction sets. Dispatch, the tests and the docstrings read
this table (each fast kernel's docstring ends with the references it reproduces).

One table per kernel family (a profile's ``quant_kernels``): ``x86`` (arch/x86/quants.c and repack.cpp,
both x86 profiles), ``neon`` (arch/arm: dotprod) and ``neon_i8mm`` (with MATMUL_INT8's 2x2 steps and
the 4x8 / 8x8 REPACK layouts). The ARM twins (``neon``) are generic numba: they run on any host.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np

from .. import ops as ref_ops, quants as ref_quants, repack_gemm as ref_repack, sgemm as ref_sgemm, tiled as ref_tiled
from ...tensor import F16
from . import dot4, dot4_neon, neon, ops, quants, repack, sgemm, tiled, vec
from .quantize import quantize_q8_0, quantize_q8_0_neon, quantize_q8_1, quantize_q8_1_neon, quantize_q8_k, quantize_q8_k_neon


@dataclass(frozen=True)
class Kernels:
    """numba kernels of one layout: ``threaded`` (prange over row groups) and ``serial`` (its twin for
    small work; None: the threaded kernel in a one-thread region), the packer ``pack(rows, tname, K)``,
    and the arguments after the packed arrays: generic kernels take the quantized activations
    (``quantize(x)``), byte-dot ones x and out, then ``extra``, then the thread limit (``n_threads``:
    1 serial, 0 the step's count; they have no serial twin)."""
    threaded: Callable
    serial: Callable | None
    pack: Callable
    quantize: Callable | None = None
    extra: tuple = ()


@dataclass(frozen=True)
class Twin:
    """One reference kernel and the numba kernels that give its bits."""
    reference: Callable          # llmlab.ggml.cpu: (raw, qtype, x, cpu) -> (T, R) float32
    ggml: str                    # the ggml-cpu function reproduced
    generic: Kernels
    byte_dot: dict | None        # instruction set ("vnni", "avx2") -> Kernels, or None


def _byte_dot(family: str, pack: Callable, extra: tuple = ()) -> dict:
    return {isa: Kernels(k[family], None, pack, extra=extra) for isa, k in dot4.KERNELS.items()}


_NO_S = np.zeros((0, 0), np.float32)    # q8_0 activations have no s (q4_1's min term reads q8_1's)


def _legacy(tname: str, partner: str) -> Twin:
    quantize = quantize_q8_1 if partner == "q8_1" else lambda x: (*quantize_q8_0(x), _NO_S)
    return Twin(ref_quants.mul_mat, f"ggml_vec_dot_{tname}_{partner}",
                Kernels(quants.vec_dot_legacy, quants.vec_dot_legacy_serial, quants.pack_legacy, quantize),
                _byte_dot("legacy", dot4.pack_legacy_quads))


TWINS: dict[tuple[str, str], Twin] = {
    ("q4_0", "vec_dot"): _legacy("q4_0", "q8_0"),
    ("q4_1", "vec_dot"): _legacy("q4_1", "q8_1"),
    ("q5_0", "vec_dot"): _legacy("q5_0", "q8_0"),
    ("q8_0", "vec_dot"): _legacy("q8_0", "q8_0"),
    ("q4_k", "vec_dot"): Twin(ref_quants.mul_mat, "ggml_vec_dot_q4_K_q8_K",
                              Kernels(quants.vec_dot_q4_k, None, quants.pack_q4_k, quantize_q8_k), None),
    ("q4_k", "tiled"): Twin(ref_tiled.mul_mat_k_tiled, "tiled-kernel.cpp (q4_K x q8_K)",
                            Kernels(tiled.mul_mat_q4_k_tiled, None, quants.pack_q4_k, quantize_q8_k), None),
    ("q4_k", "repack"): Twin(ref_repack.mul_mat_q4_k_repacked, "ggml_gemv_q4_K_8x8_q8_K / ggml_gemm_q4_K_8x8_q8_K",
                             Kernels(repack.mul_mat_q4_k_repacked, None, quants.pack_q4_k, quantize_q8_k),
                             _byte_dot("q4_k", dot4.pack_q4_k)),
    ("q6_k", "vec_dot"): Twin(ref_quants.mul_mat, "ggml_vec_dot_q6_K_q8_K",
                              Kernels(quants.vec_dot_q6_k, None, quants.pack_q6_k, quantize_q8_k),
                              _byte_dot("q6_k", dot4.pack_q6_k, (False,))),
    ("q6_k", "tiled"): Twin(ref_tiled.mul_mat_k_tiled, "tiled-kernel.cpp (q6_K x q8_K)",
                            Kernels(tiled.mul_mat_q6_k_tiled, None, quants.pack_q6_k, quantize_q8_k),
                            _byte_dot("q6_k", dot4.pack_q6_k, (True,))),
}


def _neon_byte_dot(kernel: str, pack: Callable = dot4.pack_legacy_quads) -> dict:
    """dot4_neon's kernels of one kind per instruction set (x86 hosts with AVX512-VNNI or AVX2)."""
    return {isa: Kernels(k[kernel], None, pack) for isa, k in dot4_neon.KERNELS.items()}


def _neon_legacy(tname: str, partner: str, i8mm: bool) -> Twin:
    quantize = quantize_q8_1_neon if partner == "q8_1" else lambda x: (*quantize_q8_0_neon(x), _NO_S)
    pair = ((neon.vec_dot_mmla, neon.vec_dot_mmla_serial) if i8mm and tname in ref_quants.MMLA_VEC_DOT
            else (neon.vec_dot, neon.vec_dot_serial))
    mmla = i8mm and tname in ref_quants.MMLA_VEC_DOT
    return Twin(ref_quants.mul_mat, f"ggml_vec_dot_{tname}_{partner} (arch/arm{', MATMUL_INT8' if i8mm else ''})",
                Kernels(*pair, neon.pack_legacy_nrows, quantize), _neon_byte_dot("mmla" if mmla else "vec_dot"))


def _neon_repack(layout: str, ggml: str, kernel, pack, quantize, byte_dot: dict | None = None) -> Twin:
    return Twin(ref_repack.REPACKED_MUL_MAT[layout], ggml, Kernels(kernel, None, pack, quantize), byte_dot)


def _q8_0_neon(x):
    return (*quantize_q8_0_neon(x), _NO_S)


NEON: dict[tuple[str, str], Twin] = {
    **{(t, "vec_dot"): _neon_legacy(t, p, False) for t, p in (("q4_0", "q8_0"), ("q4_1", "q8_1"),
                                                               ("q5_0", "q8_0"), ("q8_0", "q8_0"))},
    ("q8_0", "repack"): _neon_repack("q8_0_4x4", "ggml_gemv/gemm_q8_0_4x4_q8_0", neon.q8_0_4x4, neon.pack_legacy_nrows, _q8_0_neon,
                                     _neon_byte_dot("q8_0_4x4")),
    ("q4_k", "repack"): _neon_repack("q4_K_8x4", "ggml_gemv/gemm_q4_K_8x4_q8_K", neon.q4_k_8x4, quants.pack_q4_k,
                                     quantize_q8_k_neon, _neon_byte_dot("q4_k_8x4", dot4.pack_q4_k)),
    ("q6_k", "repack"): _neon_repack("q6_K_8x4", "ggml_gemv/gemm_q6_K_8x4_q8_K", neon.q6_k_8x4, quants.pack_q6_k,
                                     quantize_q8_k_neon, _neon_byte_dot("q6_k_8x4", dot4.pack_q6_k)),
}

NEON_I8MM: dict[tuple[str, str], Twin] = {
    **{(t, "vec_dot"): _neon_legacy(t, p, True) for t, p in (("q4_1", "q8_1"), ("q5_0", "q8_0"))},
    ("q8_0", "repack"): _neon_repack("q8_0_4x8", "ggml_gemv/gemm_q8_0_4x8_q8_0", neon.q8_0_4x8, neon.pack_legacy_nrows, _q8_0_neon,
                                     _neon_byte_dot("q8_0_4x8")),
    ("q4_k", "repack"): _neon_repack("q4_K_8x8_i8mm", "ggml_gemv/gemm_q4_K_8x8_q8_K (MATMUL_INT8)", neon.q4_k_8x8,
                                     quants.pack_q4_k, quantize_q8_k_neon, _neon_byte_dot("q4_k_8x8", dot4.pack_q4_k)),
    ("q6_k", "repack"): _neon_repack("q6_K_8x8_i8mm", "ggml_gemv/gemm_q6_K_8x8_q8_K (MATMUL_INT8)", neon.q6_k_8x8,
                                     quants.pack_q6_k, quantize_q8_k_neon, _neon_byte_dot("q6_k_8x8", dot4.pack_q6_k)),
}

# the kernel families (a profile's ``quant_kernels``) and their tables
FAMILIES: dict[str, dict[tuple[str, str], Twin]] = {"x86": TWINS, "neon": NEON, "neon_i8mm": NEON_I8MM}


@dataclass(frozen=True)
class FusedTwin:
    """A step's numba kernel (one float op, or several graph nodes fused into one call) and the NumPy
    reference of those nodes."""
    reference: Callable
    ggml: str                    # the ggml-cpu functions (or graph ops) whose bits it gives, in order
    kernel: Callable


def twin(tname: str, path: str | None, family: str = "x86") -> Twin | None:
    return FAMILIES.get(family, {}).get((tname, path))


# ---- the fused row ops of the plan's fusions (``cplan.FUSIONS``): each numba kernel and the NumPy
# reference ops it does the work of, chained on arrays (same arguments, same bytes written)

def _rms_norm_mul(x, eps, w, out, a, b):
    if a.shape[0]:
        np.add(a, b, out=x)
    np.multiply(ref_ops.rms_norm_rows(x, eps), w, out=out)


def _rope_scale(x, cos, sin, n_dims, neox, scale, out, vec_pairs=0):
    y = ref_ops.rope_rows(x, cos[:, None, :], sin[:, None, :], n_dims, neox, vec_pairs, np.empty_like(x))
    np.multiply(y, np.float32(scale), out=out)


def _rms_norm_mul_rope(x, H, eps, w, cos, sin, n_dims, neox, scale, scaled, out, vec_pairs=0):
    y = np.multiply(ref_ops.rms_norm_rows(x, eps), w).reshape(-1, H, x.shape[1])
    t = np.arange(y.shape[0])
    y = ref_ops.rope_rows(y, cos[t][:, None, :], sin[t][:, None, :], n_dims, neox, vec_pairs, np.empty_like(y))
    np.copyto(out, (y * np.float32(scale) if scaled else y).reshape(out.shape))


def _set_rows(D, V, I) -> bool:
    """ops.set_rows on arrays: D f16 bits (uint16) or float32 rows."""
    if I.size and (I.min() < 0 or I.max() >= D.shape[0]):
        return False
    D[I] = ref_ops._convert(V, F16).view(np.uint16) if D.dtype == np.uint16 else V
    return True


def _set_rows_pair(Dk, K, Dv, V, I) -> bool:
    if I.size and (I.min() < 0 or I.max() >= min(Dk.shape[0], Dv.shape[0])):
        return False
    return _set_rows(Dk, K, I) and _set_rows(Dv, V, I)


def _rope_set_rows_pair(X, cos, sin, n_dims, neox, Dk, Dv, V, I, vec_pairs=0) -> bool:
    K = ref_ops.rope_rows(X, cos[:, None, :], sin[:, None, :], n_dims, neox, vec_pairs, np.empty_like(X))
    return _set_rows_pair(Dk, K.reshape(X.shape[0], -1), Dv, V, I)


# fused steps (``cplan.FUSIONS``) whose kernel computes more than one node's arithmetic, by kernel name
FUSED: dict[str, FusedTwin] = {
    "attention_one_token": FusedTwin(
        ref_ops.attention_one_token,
        "ggml_vec_dot_f16 (kq), ggml_compute_forward_soft_max_f32, ggml_vec_dot_f16 (kqv): one token's attention",
        vec.attention_f16_tiles),
    "rms_norm_mul": FusedTwin(_rms_norm_mul, "(ADD) RMS_NORM MUL", ops.rms_norm_mul),
    "rope_scale": FusedTwin(_rope_scale, "ROPE SCALE", ops.rope_scale),
    "rms_norm_mul_rope": FusedTwin(_rms_norm_mul_rope, "RMS_NORM MUL ROPE (SCALE)", ops.rms_norm_mul_rope),
    "set_rows_pair": FusedTwin(_set_rows_pair, "SET_ROWS SET_ROWS", ops.set_rows_pair),
    "rope_set_rows_pair": FusedTwin(_rope_set_rows_pair, "ROPE SET_ROWS SET_ROWS", ops.rope_set_rows_pair),
}


# float products a step runs whole (the f16 ones of the KV cache), by kernel name
FLOAT: dict[str, FusedTwin] = {
    "sgemm_f16": FusedTwin(ref_sgemm.mul_mat_f16, "llamafile_sgemm, tinyBLAS<KN, ...> f16 x f16: a prompt's kq and kqv",
                           sgemm.mul_mat_f16),
}


def _document() -> None:
    """Append to each fast kernel's docstring the references it reproduces (read from the tables)."""
    seen: dict[int, tuple] = {}
    for (_tname, path), tw in [kv for table in FAMILIES.values() for kv in table.items()]:
        for k in [tw.generic, *(tw.byte_dot or {}).values()]:
            for fn in (k.threaded, k.serial):
                if fn is not None:
                    seen.setdefault(id(fn), (fn, []))[1].append(f"{tw.ggml} ({path})")
    for name, ft in {**FUSED, **FLOAT}.items():
        seen.setdefault(id(ft.kernel), (ft.kernel, []))[1].append(f"{ft.ggml} ({name})")
    for fn, refs in seen.values():
        twin_of = "Twin of: " + ", ".join(dict.fromkeys(refs)) + "."
        fn.__doc__ = "\n\n".join(s for s in ((fn.__doc__ or "").rstrip(), twin_of) if s)


_document()
