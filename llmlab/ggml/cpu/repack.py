"""ggml-cpu's REPACK buffer (repack.cpp): weights interleaved at load time, multiplied by their own
gemv/gemm kernels (those llmlab reproduces are in ``repack_gemm``).

:class:`RepackPlugin` is an "extra buffer type" (``traits``) in the spirit of REPACK, for teaching:
weights rearranged once, mul_mat on them computed by the plug-in, the plain path as fallback.
"""
from __future__ import annotations

import numpy as np

from .ops import f32, mul_mat_quantized
from .traits import ExtraBufferType
from ..tensor import Tensor


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
