"""ggml-cpu's REPACK buffer (repack.cpp, arch/x86/repack.cpp): weights interleaved at load time,
multiplied by their own gemv/gemm kernels.

llama.cpp's default CPU build moves some weights into the ``CPU_REPACK`` buffer type when it loads
a model (``ggml_repack_get_optimal_repack_type``): on x86, q4_0, q4_K, iq4_nl and mxfp4 with AVX2,
q2_K only with AVX-512, each when the row count is a multiple of 8 (the profile's
``repack_types``). Their products then never see the plain kernels.

Two things live here:

- the numerics: :func:`mul_mat_q4_k_repacked` (``ggml_gemv/gemm_q4_K_8x8_q8_K``), which keeps one
  super-block's integer dot per output in one lane: ``acc = fma(isum, d_w*d_x, acc)`` and
  ``acc_min = fma(imins, dmin_w*d_x, acc_min)``, result ``acc - acc_min``; the 512-bit and 256-bit
  variants take the same steps;
- :class:`RepackPlugin`, an "extra buffer type" in the spirit of REPACK for teaching: weights
  rearranged once, mul_mat on them computed by the plug-in, the plain path as fallback.
"""
from __future__ import annotations

from typing import Callable

import numpy as np
from numpy import float32, float64

from .quants import quantize_activations, weight_blocks
from .simd import fma64
from ..sched.backend import ExtraBufferType
from ..tensor import Tensor

ROW_CHUNK = 4096


def mul_mat_q4_k_repacked(raw: np.ndarray, qtype, x: np.ndarray, cpu=None) -> np.ndarray:
    """Activation rows in groups of 4 go through the gemm kernel, which adds the integer sums of each
    pair of sub-blocks (64 values) into the float accumulators separately; the rows left over go
    through the gemv kernel, which adds a whole super-block at once."""
    from ..quant import k_quants as K
    x = np.asarray(x, float32).reshape(-1, x.shape[-1])
    w = weight_blocks(raw, qtype, x.shape[1])
    a = quantize_activations(x, "q8_K")
    nb = w.shape[1]
    T, R = a.shape[0], w.shape[0]
    n_gemm = T - T % 4
    qa = a["qs"].astype(float64).reshape(T, nb, 4, 64)
    ya = a["d"].astype(float32)
    bs = a["bsums"].astype(float64).reshape(T, nb, 4, 4)               # four 16-sums per 64 values
    out = np.empty((T, R), float32)
    for r0 in range(0, R, ROW_CHUNK):
        ws = w[r0:r0 + ROW_CHUNK]
        n = len(ws)
        flat = ws.reshape(-1)
        sc, mn = K.scale_min_k4(flat["scales"])
        W = (K.q4k_codes(flat["qs"]).astype(np.int32).reshape(n * nb, 8, 32) * sc[:, :, None].astype(np.int32))
        W = W.reshape(n, nb, 4, 64).astype(float64)
        mins = np.repeat(mn.astype(float64).reshape(n, nb, 4, 2), 2, axis=-1)  # min of each 32 over its two 16-sums
        dw, dmin = ws["d"].astype(float32), ws["dmin"].astype(float32)
        acc = np.zeros((T, n), float64)
        accm = np.zeros((T, n), float64)
        for b in range(nb):
            isub = np.einsum("tsk,rsk->trs", qa[:, b], W[:, b])              # (T, n, 4) exact
            imsub = np.einsum("tsk,rsk->trs", bs[:, b], mins[:, b])
            d = (dw[None, :, b] * ya[:, b, None]).astype(float32).astype(float64)
            dm = (dmin[None, :, b] * ya[:, b, None]).astype(float32).astype(float64)
            g = slice(0, n_gemm)
            for sb in range(4):                                              # gemm: one fma per 64 values
                acc[g] = fma64(isub[g, :, sb], d[g], acc[g])
                accm[g] = fma64(imsub[g, :, sb], dm[g], accm[g])
            v = slice(n_gemm, T)                                             # gemv: one fma per super-block
            acc[v] = fma64(isub[v].sum(-1), d[v], acc[v])
            accm[v] = fma64(imsub[v].sum(-1), dm[v], accm[v])
        out[:, r0:r0 + n] = (acc.astype(float32) - accm.astype(float32)).astype(float32)
    return out


# the repacked types whose kernels llmlab reproduces; the others fall back to the vec_dot order
REPACKED_MUL_MAT: dict[str, Callable] = {"q4_k": mul_mat_q4_k_repacked}


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
        from .ops import f32, mul_mat_quantized
        w, x = node.src
        p = self.repack(w)
        X = f32(x).reshape(-1, x.ne[0])
        out = node.array().reshape(-1, node.ne[0])
        for i in range(p.shape[0]):                  # one row group: its blocks are contiguous in p[i]
            rows = p[i].transpose(1, 0, 2).reshape(self.rows, -1)
            out[:, i * self.rows:(i + 1) * self.rows] = mul_mat_quantized(rows, w.type, X, cpu=self.cpu)
