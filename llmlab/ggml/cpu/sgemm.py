"""llamafile's tinyBLAS (ggml-cpu/llamafile/sgemm.cpp): ggml-cpu's matmul for f16 x f16.

``ggml_compute_forward_mul_mat`` offers every product to ``llamafile_sgemm`` first. For an f16 weight
(the KV cache: KQ and KQV) with the activations converted to f16, tinyBLAS takes it when

- there are at least 2 activation rows ("only enable sgemm for prompt processing": ``n < 2`` is
  declined, so a one-token decode step runs ``ggml_vec_dot_f16`` per output instead),
- K is a multiple of its register width KN (16 on AVX-512, 8 on AVX2),
- the weight's row count is a multiple of its 4-row tiles.

Each output is one register of KN lanes: lane i accumulates elements i, i+KN, i+2KN, ... with fma,
then ``hsum`` adds the lanes (``_mm512_reduce_add_ps`` / extract, movehl, movehdup). The register
tiles (RM x RN, 4x6 with 32 vector registers, 4x3 with 16) only decide speed, not the sums.

The quantized tinyBLAS (``tinyBLAS_Q0_AVX``: q8_0, q4_0, q5_0, iq4_nl against q8_0 activations) is
the same on both x86 builds and adds exactly what ``ggml_vec_dot_q*_q8_0`` adds (8 lanes of 4
integer products, fma per block, ``hsum_float_8``), so ``quants`` computes it.
"""
from __future__ import annotations

import numpy as np
from numpy import float32, float64

from . import profiles
from .simd import fma64, fma_f16, reduce_tree
from .vec import vec_dot_f16


def takes(cpu, m: int, n: int, k: int) -> bool:
    """Does llamafile_sgemm accept an f16 product of m weight rows, n activation rows, length k?"""
    cpu = profiles.resolve(cpu)
    return (cpu.llamafile and n >= cpu.sgemm_min_batch and k % cpu.sgemm_lanes == 0
            and m % cpu.sgemm_row_multiple == 0)


def mul_mat_f16(A: np.ndarray, B: np.ndarray, cpu=None) -> np.ndarray:
    """tinyBLAS: A (R, K) f16 weights, B (T, K) activations already rounded to f16 -> (T, R)."""
    cpu = profiles.resolve(cpu)
    R, K = A.shape
    T = B.shape[0]
    L = cpu.sgemm_lanes
    if K % L:
        raise ValueError(f"tinyBLAS needs K ({K}) to be a multiple of its {L} lanes")
    if cpu.sgemm_acc == "f16":              # tinyBLAS<8, float16x8_t, ...>: madd = vfmaq_f16, hsum widens
        acc16 = np.zeros((T, R, L), np.float16)
        for s in range(0, K, L):
            acc16 = fma_f16(B[:, None, s:s + L], A[None, :, s:s + L], acc16)
        return reduce_tree(acc16.astype(float32), cpu.sgemm_hsum_tree)
    A = A.astype(float64)
    B = B.astype(float64)
    acc = np.zeros((T, R, L), float64)
    for s in range(0, K, L):
        acc = fma64(B[:, None, s:s + L], A[None, :, s:s + L], acc).astype(float64)
    return reduce_tree(acc.astype(float32), cpu.sgemm_hsum_tree)


def mul_mat_f16_op(A: np.ndarray, B: np.ndarray, cpu=None) -> np.ndarray:
    """ggml-cpu's MUL_MAT for an f16 weight A (R, K) and activations B (T, K) already rounded to f16:
    tinyBLAS where it accepts the shape, otherwise one ``ggml_vec_dot_f16`` per output."""
    cpu = profiles.resolve(cpu)
    if takes(cpu, A.shape[0], len(B), A.shape[1]):
        return mul_mat_f16(A, B, cpu)
    return vec_dot_f16(B[:, None, :], A[None, :, :], cpu)


def mul_mat_f32(A: np.ndarray, B: np.ndarray, cpu=None) -> np.ndarray:
    """tinyBLAS for f32 x f32 (``tinyBLAS<KN, __m256/__m512, ..., float>``): the f16 kernel's registers, fma
    and hsum, on float32 values as they are."""
    cpu = profiles.resolve(cpu)
    L = cpu.sgemm_lanes
    R, K = A.shape
    if K % L:
        raise ValueError(f"tinyBLAS needs K ({K}) to be a multiple of its {L} lanes")
    A = np.asarray(A, float32).astype(float64)
    B = np.asarray(B, float32).astype(float64)
    acc = np.zeros((B.shape[0], R, L), float64)
    for s in range(0, K, L):
        acc = fma64(B[:, None, s:s + L], A[None, :, s:s + L], acc).astype(float64)
    return reduce_tree(acc.astype(float32), cpu.sgemm_hsum_tree)


def mul_mat_f32_op(A: np.ndarray, B: np.ndarray, cpu=None, src1_cont: bool = True) -> np.ndarray:
    """ggml-cpu's MUL_MAT for an f32 weight A (R, K) and f32 activations B (T, K): tinyBLAS where
    llamafile_sgemm takes the shape (only for contiguous activations: it is offered src1 as it is),
    otherwise one ``ggml_vec_dot_f32`` per output."""
    from .vec import vec_dot_f32
    cpu = profiles.resolve(cpu)
    if src1_cont and takes(cpu, A.shape[0], len(B), A.shape[1]):
        return mul_mat_f32(A, B, cpu)
    return vec_dot_f32(np.asarray(B, float32)[:, None, :], np.asarray(A, float32)[None, :, :], cpu)
