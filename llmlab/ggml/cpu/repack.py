"""ggml-cpu's REPACK buffer (repack.cpp): weights interleaved at load time, multiplied by their own
gemv/gemm kernels (those llmlab reproduces are in ``repack_gemm``).

:func:`make_block_q4_Kx8` and :func:`make_block_q6_Kx8` build the K-quants' 8x8 layout as llama.cpp
does (the ARM i8mm and x86 AVX2 builds): 8 weight rows' super-blocks in one struct, their quants in
8-byte slices row after row, so one 16-byte load holds 8 bytes of two rows (one ``vmmlaq_s32``
operand), and the per-sub-block scales regrouped by sub-block instead of by row.

:class:`RepackPlugin` is an "extra buffer type" (``traits``) in the spirit of REPACK, for teaching:
weights rearranged once, mul_mat on them computed by the plug-in, the plain path as fallback.
"""
from __future__ import annotations

import numpy as np

from .ops import f32, mul_mat_quantized
from .traits import ExtraBufferType
from ..quant.k_quants import K_SCALE_SIZE, scale_min_k4
from ..tensor import Tensor
from ..types import QK_K

BLOCK_Q4_Kx8 = np.dtype([("d", "<f2", (8,)), ("dmin", "<f2", (8,)), ("scales", "u1", (K_SCALE_SIZE * 8,)),
                         ("qs", "u1", (QK_K * 4,))])
BLOCK_Q6_Kx8 = np.dtype([("d", "<f2", (8,)), ("scales", "i1", (QK_K // 16 * 8,)), ("ql", "u1", (QK_K // 2 * 8,)),
                         ("qh", "u1", (QK_K // 4 * 8,))])


def _interleave8(b: np.ndarray) -> np.ndarray:
    """(G, 8 rows, nb, nbytes) -> (G, nb, nbytes * 8): byte slice k of rows 0..7, then slice k+1 (8 bytes)."""
    G, _, nb, nbytes = b.shape
    return b.reshape(G, 8, nb, nbytes // 8, 8).transpose(0, 2, 3, 1, 4).reshape(G, nb, nbytes * 8)


def _pack_scale_min_k4(sc: np.ndarray, mn: np.ndarray) -> np.ndarray:
    """The inverse of ``scale_min_k4``: eight 6-bit scales and mins (..., 8) into q4_K's 12 bytes."""
    sc, mn = sc.astype(np.uint8), mn.astype(np.uint8)
    lo = [(v[..., :4] & 63) | ((v[..., 4:] & 48) << 2) for v in (sc, mn)]
    return np.concatenate(lo + [(sc[..., 4:] & 15) | ((mn[..., 4:] & 15) << 4)], axis=-1)


def make_block_q4_Kx8(w: np.ndarray) -> np.ndarray:
    """repack.cpp ``make_block_q4_Kx8`` (interleave 8) for q4_K rows (R, nb), R a multiple of 8 ->
    (R / 8, nb) ``BLOCK_Q4_Kx8``: d and dmin of the 8 rows; qs in 8-byte slices, row by row; the 96
    scale bytes as 8 groups of 12, group k holding sub-block k's scales and mins of the 8 rows packed
    as one q4_K packs its 8 sub-blocks (``decode_q_Kx8_6bit_scales`` reads a group back)."""
    R, nb = w.shape
    g = w.reshape(R // 8, 8, nb)
    out = np.zeros((R // 8, nb), BLOCK_Q4_Kx8)
    out["d"], out["dmin"] = g["d"].transpose(0, 2, 1), g["dmin"].transpose(0, 2, 1)
    out["qs"] = _interleave8(g["qs"])
    sc, mn = scale_min_k4(g["scales"].reshape(-1, K_SCALE_SIZE))
    sc, mn = (v.reshape(R // 8, 8, nb, 8).transpose(0, 2, 3, 1) for v in (sc, mn))    # (G, nb, sub-block, row)
    out["scales"] = _pack_scale_min_k4(sc, mn).reshape(R // 8, nb, -1)
    return out


def make_block_q6_Kx8(w: np.ndarray) -> np.ndarray:
    """repack.cpp ``make_block_q6_Kx8`` (interleave 8) for q6_K rows (R, nb) -> (R / 8, nb)
    ``BLOCK_Q6_Kx8``: d of the 8 rows; ql and qh in 8-byte slices, row by row; scale j of row i at
    ``8 j + i``."""
    R, nb = w.shape
    g = w.reshape(R // 8, 8, nb)
    out = np.zeros((R // 8, nb), BLOCK_Q6_Kx8)
    out["d"] = g["d"].transpose(0, 2, 1)
    out["ql"], out["qh"] = _interleave8(g["ql"]), _interleave8(g["qh"])
    out["scales"] = g["scales"].transpose(0, 2, 3, 1).reshape(R // 8, nb, -1)
    return out


class RepackPlugin(ExtraBufferType):
    """A teaching plug-in: weights interleaved ``rows`` at a time (as ``block_q4_0x8`` puts the same
    block column of 8 rows side by side), read back row group by row group. Faster kernels register
    through exactly this hook."""
    name = "REPACK"

    def __init__(self, types=("q4_0", "q4_1", "q5_0", "q8_0", "q4_k", "q6_k"), rows: int = 4, cpu=None):
        self.types = frozenset(types)
        self.rows = rows
        self.cpu = cpu
        self.packed: dict[int, np.ndarray] = {}     # id(weight) -> interleaved blocks

    def supports_op(self, node: Tensor) -> bool:
        if node.op != "MUL_MAT":
            return False
        w = node.src[0]
        return (w.type.name in self.types and w.view_src is None and w.ne[2] == 1 and w.ne[3] == 1
                and w.ne[1] % self.rows == 0 and w.data is not None)

    def repack(self, w: Tensor) -> np.ndarray:
        """[M, nblk, bs] -> [M/rows, nblk, rows, bs]: block j of rows r..r+rows-1 side by side."""
        p = self.packed.get(id(w))
        if p is None:
            t = w.type
            nblk = w.ne[0] // t.block_size
            raw = w.array()[0, 0].reshape(w.ne[1], nblk, t.type_size)
            p = np.ascontiguousarray(raw.reshape(w.ne[1] // self.rows, self.rows, nblk, t.type_size).transpose(0, 2, 1, 3))
            self.packed[id(w)] = p
        return p

    def compute(self, node: Tensor) -> None:
        w, x = node.src
        p = self.repack(w)
        X = f32(x).reshape(-1, x.ne[0])
        out = node.array().reshape(-1, node.ne[0])
        for i in range(p.shape[0]):                  # one row group: its blocks are contiguous in p[i]
            rows = p[i].transpose(1, 0, 2).reshape(self.rows, -1)
            out[:, i * self.rows:(i + 1) * self.rows] = mul_mat_quantized(rows, w.type, X, cpu=self.cpu)
