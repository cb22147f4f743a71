"""Other arithmetic for quantized matmuls, to measure what llama.cpp's exact path is made of.

:func:`f32_activations` leaves out ggml-cpu's 8-bit activations; :func:`vec_dot_everywhere` keeps
them but uses one kernel order for every shape.

ggml-cpu multiplies a quantized weight by an activation only after quantizing the
activation to the weight's ``vec_dot_type`` (q8_0, q8_1 or q8_K: 8-bit codes, one
scale per block), so that the dot product runs on integers. llmlab reproduces
that (``ops.mul_mat_quantized``). :func:`f32_activations` is an executor ``dispatch``
hook that instead dequantizes the weight rows to float32 and multiplies them
by the float32 activations as they are: the same weights, no activation
rounding. Everything else (f16 KV cache, softmax, norms) is unchanged.

    ctx.decode(batch, dispatch=f32_activations)
"""
from __future__ import annotations

import numpy as np

from .ops import dequantize_rows, f32
from ..tensor import Tensor

ROWS_PER_CHUNK = 8192      # dequantize big weights (a 262144-row LM head) a slice at a time


def mul_mat_f32(raw: np.ndarray, qtype, x: np.ndarray) -> np.ndarray:
    """x [N, K] times quantized weight rows raw [M, row_bytes] -> [N, M], all in float32."""
    out = np.empty((x.shape[0], raw.shape[0]), np.float32)
    for r0 in range(0, raw.shape[0], ROWS_PER_CHUNK):
        w = dequantize_rows(raw[r0:r0 + ROWS_PER_CHUNK], qtype)
        np.matmul(x, w.T, out=out[:, r0:r0 + w.shape[0]])
    return out


def _each_matrix(node: Tensor, mul) -> bool:
    """Run ``mul(raw_rows, qtype, x)`` for every 2-D matrix of a quantized MUL_MAT (with broadcast)."""
    a, b = node.src
    A, B, out = a.array(), f32(b), node.array()
    r2, r3 = b.ne[2] // a.ne[2], b.ne[3] // a.ne[3]
    for i3 in range(b.ne[3]):
        for i2 in range(b.ne[2]):
            out[i3, i2] = mul(A[i3 // r3, i2 // r2], a.type, np.ascontiguousarray(B[i3, i2]))
    return True


def _quantized_mul_mat(node: Tensor) -> bool:
    return node.op == "MUL_MAT" and node.src[0].type.block_size > 1


def f32_activations(node: Tensor) -> bool:
    """Executor dispatch: compute MUL_MAT with a quantized weight in float32; leave every other node alone."""
    return _quantized_mul_mat(node) and _each_matrix(node, mul_mat_f32)


def vec_dot_everywhere(node: Tensor) -> bool:
    """Executor dispatch: every quantized MUL_MAT through ggml's ``vec_dot`` order, for every batch size.

    ggml-cpu really picks its kernel by shape (the tiled K-quant matmul from 8 activation rows, the
    REPACK kernels for repacked weights); all of them compute the same exact integer block sums and
    differ only in the order of the float steps. This path ignores that choice, to measure what a
    float32-noise difference becomes once 8-bit activation rounding meets it."""
    from .quants import TYPE_TRAITS_CPU, mul_mat
    if not _quantized_mul_mat(node) or node.src[0].type.name not in TYPE_TRAITS_CPU:
        return False
    return _each_matrix(node, mul_mat)
