"""The activation side: ``quantize_q8_1`` as ggml-cuda's quantize.cu runs it, one warp per block of 32.

Each of the 32 lanes holds one activation. Two butterfly reductions over the warp give every lane
the block's ``amax`` and the float ``sum`` of its inputs; then ``d = amax / 127``, each lane stores
``q = roundf(x / d)`` and lane 0 stores ``ds = (d, sum)`` as a half2. ``s`` is the sum of the *float*
inputs, not ``d * sum(q)``: it is what the q4_0/q4_1/q5_0 dot products use for their offset term.

The host pads every activation row to a multiple of ``MATRIX_ROW_PADDING`` = 512 values with zeros,
so the matrix kernel can read whole blocks without bounds checks.
"""
from __future__ import annotations

import numpy as np

from ._ggml import BLOCK_Q8_1, fp16, roundf

QK8_1 = 32
MATRIX_ROW_PADDING = 512
F32 = np.float32


def warp_reduce(x: np.ndarray, op=np.add, width: int = 32) -> np.ndarray:
    """``for (offset = width/2; offset > 0; offset >>= 1) x = op(x, __shfl_xor_sync(x, offset))`` over the last axis.

    Lane ``l`` combines its value with lane ``l ^ offset``'s; after log2(width) steps every lane holds
    the same total (float addition is commutative, so partners compute identical sums).
    """
    lanes = np.arange(x.shape[-1])
    offset = width // 2
    while offset > 0:
        x = op(x, x[..., lanes ^ offset])
        offset //= 2
    return x


def pad_row(x: np.ndarray) -> np.ndarray:
    """Zero-pad the last axis to a multiple of 512 (ggml-cuda's ``ne10_padded``)."""
    k = x.shape[-1]
    return np.concatenate([x, np.zeros(x.shape[:-1] + (-k % MATRIX_ROW_PADDING,), F32)], axis=-1)


def quantize_q8_1(x) -> np.ndarray:
    """float32 activations ``(K,)`` or ``(ncols, K)`` -> raw q8_1 blocks, uint8 ``(ncols, K_padded / 32 * 36)``.

    Bit for bit what quantize.cu's ``quantize_q8_1`` writes on a GPU with IEEE division (see the
    notes in :mod:`llmlab.cuda_sim`); a 1-D input gives one row.
    """
    x = np.atleast_2d(np.asarray(x, F32))
    lanes = pad_row(x).reshape(x.shape[0], -1, QK8_1)         # (col, block, lane)
    amax = warp_reduce(np.abs(lanes), np.maximum)
    total = warp_reduce(lanes)
    d = amax / F32(127)
    with np.errstate(divide="ignore", invalid="ignore"):
        q = np.where(amax == 0, F32(0), roundf(lanes / d))
    y = np.zeros(lanes.shape[:2], BLOCK_Q8_1)
    y["qs"] = q.astype(np.int8)
    y["d"], y["s"] = fp16(d[..., 0]), fp16(total[..., 0])
    return y.view(np.uint8).reshape(x.shape[0], -1)
