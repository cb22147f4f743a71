"""K-quants through ggml-cpu's tiled matmul (ggml-cpu/tiled/tiled.cpp, tiled-kernel.cpp).

``ggml_compute_forward_mul_mat`` first offers the product to the tiled kernels: a K-quant weight
that is not in the REPACK buffer, times at least ``tiled_min_batch`` (8) activation rows, runs there,
in 256x256 windows of 16x16 micro-tiles. Per super-block the whole integer dot is exact in int32
(s1 = sum_s scale_s * dot_s, with q6_K's -32 and q3_K's -4 taken out through the bsums, and
s2 = sum_s min_s * bsum_s), and each output takes ONE float step per super-block:

    res = d_w * (float) s1            [res = fma(-dmin_w, (float) s2, res) for q2_K/q4_K/q5_K]
    acc = fma(res, d_x, acc)

super-block after super-block, K in order (windows and thread chunks never split K). The AVX-512
VNNI micro-kernel and the AVX2 one form the same integers and take the same float steps.
"""
from __future__ import annotations

import numpy as np
from numpy import float32, float64

from .quants import quantize_activations, weight_blocks
from .simd import fma

ROW_CHUNK = 4096


def tiled_terms(ws: np.ndarray, tname: str):
    """Per-row super-block terms: W (n, nb, 256) signed codes times their sub-block scale, mins
    (n, nb, n_sub) or None, sub-block size, d_w and dmin_w (n, nb)."""
    from ..quant import k_quants as K
    n, nb = ws.shape
    flat = ws.reshape(-1)
    mins, dmin = None, None
    if tname in ("q4_k", "q5_k"):
        sc, mins = K.scale_min_k4(flat["scales"])                       # (n*nb, 8) each
        codes = K.q4k_codes(flat["qs"]) if tname == "q4_k" else K.q5k_codes(flat)
        W = codes.astype(np.int32).reshape(-1, 8, 32) * sc.astype(np.int32)[:, :, None]
        sub = 32
    elif tname == "q6_k":
        W = K.q6k_codes(flat).astype(np.int32).reshape(-1, 16, 16) * flat["scales"].astype(np.int32)[:, :, None]
        sub = 16
    elif tname == "q3_k":
        W = K.q3_codes(flat).astype(np.int32).reshape(-1, 16, 16) * K.q3_scales(flat["scales"]).astype(np.int32)[:, :, None]
        sub = 16
    elif tname == "q2_k":
        sc = flat["scales"].astype(np.int32)
        W = K.crumbs(flat["qs"]).astype(np.int32).reshape(-1, 16, 16) * (sc & 0x0F)[:, :, None]
        mins, sub = sc >> 4, 16
    else:
        raise KeyError(tname)
    if mins is not None:
        mins = mins.astype(np.int64).reshape(n, nb, -1)
        dmin = ws["dmin"].astype(float32)
    return W.reshape(n, nb, 256), mins, sub, ws["d"].astype(float32), dmin


def mul_mat_k_tiled(raw: np.ndarray, qtype, x: np.ndarray, cpu=None) -> np.ndarray:
    """x (T, K) times K-quant rows raw (R, row_bytes) -> (T, R), as the tiled kernels sum it
    (the same on every x86 profile; ``cpu`` is accepted for a uniform kernel signature)."""
    x = np.asarray(x, float32).reshape(-1, x.shape[-1])
    w = weight_blocks(raw, qtype, x.shape[1])
    a = quantize_activations(x, "q8_K")
    nb = w.shape[1]
    T, R = a.shape[0], w.shape[0]
    qa = a["qs"].astype(float64).transpose(1, 0, 2)                    # (nb, T, 256)
    ya = a["d"].astype(float32)                                        # (T, nb)
    bsums = a["bsums"].astype(np.int64)                                # (T, nb, 16): sums of 16 codes
    out = np.empty((T, R), float32)
    for r0 in range(0, R, ROW_CHUNK):
        W, mins, sub, dw, dmin = tiled_terms(w[r0:r0 + ROW_CHUNK], qtype.name)
        n = len(dw)
        s1 = np.matmul(qa, W.astype(float64).transpose(1, 2, 0))      # (nb, T, n): exact integers
        if mins is not None:
            bs = bsums.reshape(T, nb, -1, sub // 16).sum(-1)            # sums over each sub-block
            s2 = np.einsum("tbs,rbs->btr", bs, mins)
        acc = np.zeros((T, n), float32)
        for b in range(nb):
            res = (dw[None, :, b] * s1[b].astype(float32)).astype(float32)
            if mins is not None:
                res = fma(-dmin[None, :, b], s2[b].astype(float32), res)
            acc = fma(res, ya[:, b, None], acc)
        out[:, r0:r0 + n] = acc
    return out
