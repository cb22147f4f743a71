"""Quantized matmuls by byte dot products (q4_0, q4_1, q5_0, q8_0, q6_K, and q4_K in the REPACK buffer):
the integer sums four byte products at a time, then ggml's float steps. This module chooses the
instruction set; the kernels are ``dot4_legacy`` and ``dot4_kquants``, their LLVM IR pieces ``dot4_ir``,
their packed layouts ``dot4_pack``.

ggml's 8 float lanes of a 32-value block are sums of 4 consecutive products (lane j: values 4j..4j+3),
exact integers. AVX512-VNNI's ``vpdpbusd`` computes exactly such sums: in each 32-bit lane, 4 unsigned
bytes times 4 signed bytes, added; on AVX2, ``pmaddubsw`` (pairs into int16) then ``pmaddwd`` by ones
(pairs of pairs into int32) give the same sums. So with the weights laid out 16 rows side by side, 4
codes per row and lane, one instruction (or two) gives one float lane of a block for 16 rows, where the
generic kernels (``quants``) spend a multiply and an add per code. The codes must be unsigned: q4_1's
are (0..15); q4_0's c - 8, q5_0's c - 16 and q8_0's w are used as c and w + 128, and the kernel
subtracts 8 (16, 128) times the lane's activation sum, which is exact in int32 (on AVX2, where w + 128
would saturate pmaddubsw's int16 pairs, q8_0 takes ggml's |w| x sign(a, w) instead). The float steps
that follow are the generic kernels': the same bits.

:data:`ISA` is the best set the host runs ("vnni", "avx2"), when numba compiles for the host (under a
shipped target: the best the target has and the host runs);
``LLMLAB_DOT4=avx2`` picks a lesser one, ``LLMLAB_DOT4=0`` turns these kernels off (the generic ones
run). Every choice gives the same bits.
"""
from __future__ import annotations

import functools

import numba

from .... import config
from .dot4_kquants import mul_mat_q4_k_avx2, mul_mat_q4_k_vnni, mul_mat_q6_k_avx2, mul_mat_q6_k_vnni
from .dot4_legacy import R16, mul_mat_avx2, mul_mat_multi_avx2, mul_mat_multi_vnni, mul_mat_vnni
from .dot4_pack import pack_legacy_quads, pack_q4_k, pack_q6_k

__all__ = ["R16", "KERNELS", "host_isas", "pack_legacy_quads", "pack_q4_k", "pack_q6_k"]
TYPES = ("q4_0", "q4_1", "q5_0", "q8_0")


def host_isas() -> tuple[str, ...]:
    """The byte-dot instruction sets this host runs: "vnni" (AVX512-VNNI with AVX512BW), "avx2"."""
    from ..profiles import cpu_flags, machine        # the one CPU detector (x86 flags only on an x86 machine)
    feats = cpu_flags() if machine() == "x86_64" else set()
    out = []
    if {"avx512_vnni", "avx512bw"} <= feats:
        out.append("vnni")
    if {"avx2", "fma", "f16c"} <= feats:
        out.append("avx2")
    return tuple(out)


def _compiles_for_host() -> bool:
    return (numba.config.CPU_NAME or "host") == "host" and not numba.config.CPU_FEATURES


def target_isas() -> tuple[str, ...]:
    """The byte-dot instruction sets numba's machine code may use here: the host's; under a shipped target
    (``shipped_kernels``) those of the target that the host also runs; under any other CPU model numba was
    told to compile for, none (its features are not known here)."""
    if _compiles_for_host():
        return host_isas()
    from ..shipped_kernels import active
    t = active()
    return tuple(i for i in t.isas if i in host_isas()) if t is not None else ()


@functools.cache
def _choose() -> str | None:
    """LLMLAB_DOT4 (config.dot4): unset (the best the host runs), 0 (none: the generic kernels), or one of
    host_isas(); read on first use."""
    want = config.dot4()
    if want == "0":
        return None
    isas = target_isas()
    if want and want in isas:
        return want
    return isas[0] if isas else None


def __getattr__(name: str):
    """ISA (the kernels dispatch takes: the best the host has, None: the generic ones) and AVAILABLE."""
    if name in ("ISA", "AVAILABLE"):
        return _choose() if name == "ISA" else _choose() is not None
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


# the entry points per instruction set for the legacy quants, q4_K and q6_K: each takes n_threads last
# (1 for work too small to wake other threads, 0 for the step's count), so one compiled kernel serves both
KERNELS = {"vnni": {"legacy": mul_mat_vnni, "q4_k": mul_mat_q4_k_vnni, "q6_k": mul_mat_q6_k_vnni},
           "avx2": {"legacy": mul_mat_avx2, "q4_k": mul_mat_q4_k_avx2, "q6_k": mul_mat_q6_k_avx2}}
# several legacy weights sharing one activation matrix, one region (tuples: packed arrays, outputs)
MULTI = {"vnni": {"legacy": mul_mat_multi_vnni}, "avx2": {"legacy": mul_mat_multi_avx2}}

