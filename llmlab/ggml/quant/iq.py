"""The i-quants (importance-matrix quants): codes that index into fixed grids of 4 or 8 values.

Instead of storing each weight's level, a group of 8 (or 4) weights stores one index
into a lattice of likely 8-vectors (``iq2xxs_grid`` ...), plus sign bits (often 7 bits
and a parity: ``ksigns_iq2xs``) and a small per-sub-block scale. iq4_nl/iq4_xs keep one
4-bit code per weight but map it through a non-linear table (``kvalues_iq4nl``).
Dequantizers for all of them; reference quantizers for iq4_nl and iq4_xs (the grid-based
ones need ggml's lattice searches and an importance matrix to be worth using).
"""
from __future__ import annotations

import base64
import zlib
from functools import lru_cache

import numpy as np

from ..types import QK_K
from . import _iq_tables
from .core import float32, first_absmax, fp16, nearest_int, nibbles, register, seq_sum

KVALUES_IQ4NL = np.array([-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113], np.int8)
IQ1S_DELTA = float32(0.125)

BLOCK_IQ2_XXS = np.dtype([("d", "<f2"), ("qs", "<u2", (QK_K // 8,))])
BLOCK_IQ2_XS = np.dtype([("d", "<f2"), ("qs", "<u2", (QK_K // 8,)), ("scales", "u1", (QK_K // 32,))])
BLOCK_IQ2_S = np.dtype([("d", "<f2"), ("qs", "u1", (QK_K // 4,)), ("qh", "u1", (QK_K // 32,)), ("scales", "u1", (QK_K // 32,))])
BLOCK_IQ3_XXS = np.dtype([("d", "<f2"), ("qs", "u1", (3 * QK_K // 8,))])
BLOCK_IQ3_S = np.dtype([("d", "<f2"), ("qs", "u1", (QK_K // 4,)), ("qh", "u1", (QK_K // 32,)),
                        ("signs", "u1", (QK_K // 8,)), ("scales", "u1", (QK_K // 64,))])
BLOCK_IQ1_S = np.dtype([("d", "<f2"), ("qs", "u1", (QK_K // 8,)), ("qh", "<u2", (QK_K // 32,))])
BLOCK_IQ1_M = np.dtype([("qs", "u1", (QK_K // 8,)), ("qh", "u1", (QK_K // 16,)), ("scales", "<u2", (QK_K // 64,))])
BLOCK_IQ4_NL = np.dtype([("d", "<f2"), ("qs", "u1", (16,))])
BLOCK_IQ4_XS = np.dtype([("d", "<f2"), ("scales_h", "<u2"), ("scales_l", "u1", (QK_K // 64,)), ("qs", "u1", (QK_K // 2,))])


@lru_cache(maxsize=None)
def grid(name: str) -> np.ndarray:
    """One of ggml's i-quant grids as float32 (entries, 8 or 4)."""
    data = zlib.decompress(base64.b64decode("".join(getattr(_iq_tables, name.upper()))))
    return np.frombuffer(data, np.int8).reshape(getattr(_iq_tables, name.upper() + "_SHAPE")).astype(float32)


@lru_cache(maxsize=None)
def ksigns() -> np.ndarray:
    """ksigns_iq2xs as signs: 128 x 8 of +-1. Entry i: the 7 bits of i, and an 8th bit making the count of -1 even."""
    i = np.arange(128, dtype=np.uint8)
    b = (i[:, None] >> np.arange(7, dtype=np.uint8)) & 1
    parity = b.sum(-1, keepdims=True) & 1
    return np.where(np.concatenate([b, parity], axis=-1) != 0, float32(-1), float32(1))


def _signs8(bytes_: np.ndarray) -> np.ndarray:
    """Plain sign bytes -> +-1 for each bit (bit 0 first)."""
    return np.where(np.unpackbits(bytes_, axis=-1, bitorder="little") != 0, float32(-1), float32(1))


def dequantize_iq2_xxs(b):
    n = b.shape[0]
    d = b["d"].astype(float32)[:, None]
    aux = b["qs"].reshape(n, 8, 4).copy().view(np.uint32)         # (n, 8, 2): grid indices, signs+scale
    db = (d * (float32(0.5) + (aux[..., 1] >> 28).astype(float32)) * float32(0.25))[..., None, None]
    signs = ksigns()[(aux[..., 1:2] >> np.array([0, 7, 14, 21], np.uint32)) & 127]
    g = grid("iq2xxs")[aux[..., 0:1].view(np.uint8).reshape(n, 8, 4)]
    return (db * g * signs).reshape(n, QK_K)


def _iq2_scales(b):
    """iq2_xs's and iq2_s's 16 sub-block scales: d * (0.5 + 4-bit scale) / 4, shaped to broadcast."""
    n = b.shape[0]
    d = b["d"].astype(float32)[:, None]
    sc = nibbles(b["scales"].reshape(n, 8, 1)).reshape(n, 16)
    return n, (d * (float32(0.5) + sc.astype(float32)) * float32(0.25)).reshape(n, 16, 1, 1)


def dequantize_iq2_xs(b):
    n, db = _iq2_scales(b)
    qs = b["qs"]
    g = grid("iq2xs")[qs & 511].reshape(n, 16, 2, 8)
    signs = ksigns()[qs >> 9].reshape(n, 16, 2, 8)
    return (db * g * signs).reshape(n, QK_K)


def dequantize_iq2_s(b):
    n, db = _iq2_scales(b)
    qs, sbytes = b["qs"][:, :32], b["qs"][:, 32:]
    hi = (b["qh"][..., None] >> np.array([0, 2, 4, 6], np.uint8)) & 3
    idx = qs.astype(np.uint16) | (hi.reshape(n, 32).astype(np.uint16) << 8)
    g = grid("iq2s")[idx].reshape(n, 16, 2, 8)
    return (db * g * _signs8(sbytes).reshape(n, 16, 2, 8)).reshape(n, QK_K)


def dequantize_iq3_xxs(b):
    n = b.shape[0]
    d = b["d"].astype(float32)[:, None]
    qs, ss = b["qs"][:, :64], b["qs"][:, 64:].copy().view(np.uint32)   # (n, 8) scale + 4x7 sign bits
    db = (d * (float32(0.5) + (ss >> 28).astype(float32)) * float32(0.5)).reshape(n, 8, 1, 1)
    signs = ksigns()[(ss[..., None] >> np.array([0, 7, 14, 21], np.uint32)) & 127]
    g = grid("iq3xxs")[qs].reshape(n, 8, 4, 8)
    return (db * g * signs).reshape(n, QK_K)


def dequantize_iq3_s(b):
    n = b.shape[0]
    d = b["d"].astype(float32)[:, None]
    sc = nibbles(b["scales"].reshape(n, 4, 1)).reshape(n, 8)
    db = (d * (1 + 2 * sc)).reshape(n, 8, 1, 1)
    hi = np.unpackbits(b["qh"], axis=-1, bitorder="little").astype(np.uint16)
    idx = b["qs"].astype(np.uint16) | (hi << 8)
    g = grid("iq3s")[idx].reshape(n, 8, 4, 8)
    return (db * g * _signs8(b["signs"]).reshape(n, 8, 4, 8)).reshape(n, QK_K)


def dequantize_iq1_s(b):
    n = b.shape[0]
    d = b["d"].astype(float32)[:, None]
    qh = b["qh"]
    dl = (d * (2 * ((qh >> 12) & 7) + 1)).reshape(n, 8, 1, 1)
    delta = np.where((qh & 0x8000) == 0, IQ1S_DELTA, -IQ1S_DELTA).reshape(n, 8, 1, 1)
    hi = (qh[..., None] >> np.array([0, 3, 6, 9], np.uint16)) & 7
    idx = b["qs"].astype(np.uint16) | (hi.reshape(n, 32) << 8)
    g = grid("iq1s")[idx].reshape(n, 8, 4, 8)
    return (dl * (g + delta)).reshape(n, QK_K)


def dequantize_iq1_m(b):
    """iq1_m has no d field: the f16 scale is spread over the top nibbles of the four scale words."""
    n = b.shape[0]
    sc = b["scales"]
    d16 = (sc[:, 0] >> 12) | ((sc[:, 1] >> 8) & 0x00F0) | ((sc[:, 2] >> 4) & 0x0F00) | (sc[:, 3] & 0xF000)
    d = d16.astype(np.uint16).view(np.float16).astype(float32)[:, None]
    s3 = ((sc[..., None] >> np.array([0, 3, 6, 9], np.uint16)) & 7).reshape(n, 16)
    dl = (d * (2 * s3 + 1)).reshape(n, 8, 2, 1, 1)
    qh = b["qh"]
    hi = nibbles(qh.reshape(n, 16, 1)).reshape(n, 32)          # per group of 8: bits 0-2 index, bit 3 delta sign
    idx = b["qs"].astype(np.uint16) | ((hi & 7).astype(np.uint16) << 8)
    delta = np.where((hi & 8) == 0, IQ1S_DELTA, -IQ1S_DELTA).reshape(n, 8, 2, 2, 1)
    g = grid("iq1s")[idx].reshape(n, 8, 2, 2, 8)
    return (dl * (g + delta)).reshape(n, QK_K)


def dequantize_iq4_nl(b):
    return b["d"].astype(float32)[:, None] * KVALUES_IQ4NL[nibbles(b["qs"])].astype(float32)


def dequantize_iq4_xs(b):
    n = b.shape[0]
    d = b["d"].astype(float32)[:, None]
    lo = nibbles(b["scales_l"].reshape(n, 4, 1)).reshape(n, 8)
    hi = ((b["scales_h"][:, None] >> (2 * np.arange(8, dtype=np.uint16))) & 3).astype(np.uint8)
    ls = (lo | (hi << 4)).astype(np.int8) - np.int8(32)
    dl = (d * ls.astype(float32))[..., None]
    q = nibbles(b["qs"].reshape(n, 8, 16))
    return (dl * KVALUES_IQ4NL[q].astype(float32)).reshape(n, QK_K)


# ---------------------------------------------------------------- iq4_nl / iq4_xs quantizers

GROUP_MAX_EPS = float32(1e-15)
_MIDPOINTS2 = (KVALUES_IQ4NL[:-1].astype(np.int32) + KVALUES_IQ4NL[1:]).astype(float32)   # val[j-1] + val[j]


def best_index_int8(x: np.ndarray) -> np.ndarray:
    """Index of the nearest kvalues_iq4nl entry: level j once 2x reaches val[j-1] + val[j] (exact in float)."""
    x2 = np.asarray(x, float32) * float32(2)
    idx = np.searchsorted(_MIDPOINTS2, x2, side="right")          # how many midpoints are <= 2x
    return np.where(np.isnan(x2), 0, idx).astype(np.uint8)


def _nl_sums(x, w, idx):
    q = KVALUES_IQ4NL[idx].astype(float32)
    wq = w * q
    return seq_sum(wq * x), seq_sum(wq * q)


def _iq4_block_scales(x: np.ndarray, ntry: int) -> tuple[np.ndarray, np.ndarray]:
    """quantize_row_iq4_nl_impl's per-32 search (no importance weights: w = x^2). Returns the scale
    of each block and the codes of the first pass. x (m, 32)."""
    w = x * x
    amax, mx = first_absmax(x)
    zero = amax < GROUP_MAX_EPS
    v0 = float32(KVALUES_IQ4NL[0])
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        d = ((-mx if ntry > 0 else mx) / v0).astype(float32)
        L = best_index_int8((float32(1) / d)[:, None] * x)
        sumqx, sumq2 = _nl_sums(x, w, L)
        d = np.where(sumq2 > 0, sumqx / sumq2, float32(0)).astype(float32)
        best = d * sumqx
        for itry in range(-ntry, ntry + 1):
            idt = (float32(itry + int(KVALUES_IQ4NL[0])) / mx).astype(float32)
            sqx, sq2 = _nl_sums(x, w, best_index_int8(idt[:, None] * x))
            take = (sq2 > 0) & (sqx * sqx > best * sq2)
            d = np.where(take, sqx / sq2, d).astype(float32)
            best = np.where(take, d * sqx, best).astype(float32)
    return np.where(zero, float32(0), d), np.where(zero[:, None], 0, L).astype(np.uint8)


def quantize_iq4_nl(x, ntry: int = 7):
    """ggml's quantize_iq4_nl without an importance matrix (what llama-quantize runs; ntry=7 tries
    15 scales around -max/-127). ``quantize_row_iq4_nl_ref`` is the same with ntry=-1, except that
    the build in llama-cpp-python leaves the codes of an all-zero block stale (d = 0 there, so they
    decode to zeros anyway); here they are 0."""
    d, L = _iq4_block_scales(np.asarray(x, float32), ntry)
    if ntry > 0:
        with np.errstate(divide="ignore"):
            inv = np.where(d != 0, float32(1) / d, float32(0)).astype(float32)
        L = best_index_int8(inv[:, None] * x)
    out = np.zeros(len(x), BLOCK_IQ4_NL)
    out["d"], out["qs"] = fp16(d), L[:, :16] | (L[:, 16:] << 4)
    return out


def quantize_iq4_xs(x):
    """Eight iq4_nl-style block scales, quantized to 6 bits against d = -max_scale / 32."""
    n = x.shape[0]
    xs = np.asarray(x, float32).reshape(n * 8, 32)
    scales = _iq4_block_scales(xs, 7)[0].reshape(n, 8)
    _, max_scale = first_absmax(scales)
    d = (-max_scale / float32(32)).astype(float32)
    with np.errstate(divide="ignore", invalid="ignore"):
        inv = np.where(d != 0, float32(1) / d, float32(0)).astype(float32)
        l = np.clip(nearest_int(inv[:, None] * scales), -32, 31)
        dl = d[:, None] * l.astype(float32)
        idl = np.where(dl != 0, float32(1) / dl, float32(0)).astype(float32)
    L = best_index_int8(idl.reshape(-1, 1) * xs).reshape(n, 8, 32)
    l = (l + 32).astype(np.uint16)
    out = np.zeros(n, BLOCK_IQ4_XS)
    out["d"] = fp16(d)
    out["scales_l"] = (l[:, 0::2] & 0xF) | ((l[:, 1::2] & 0xF) << 4)
    out["scales_h"] = ((l >> 4) << (2 * np.arange(8, dtype=np.uint16))).sum(-1)
    out["qs"] = (L[..., :16] | (L[..., 16:] << 4)).reshape(n, 128)
    return out


register("iq2_xxs", BLOCK_IQ2_XXS, dequantize_iq2_xxs, None)
register("iq2_xs", BLOCK_IQ2_XS, dequantize_iq2_xs, None)
register("iq2_s", BLOCK_IQ2_S, dequantize_iq2_s, None)
register("iq3_xxs", BLOCK_IQ3_XXS, dequantize_iq3_xxs, None)
register("iq3_s", BLOCK_IQ3_S, dequantize_iq3_s, None)
register("iq1_s", BLOCK_IQ1_S, dequantize_iq1_s, None)
register("iq1_m", BLOCK_IQ1_M, dequantize_iq1_m, None)
register("iq4_nl", BLOCK_IQ4_NL, dequantize_iq4_nl, quantize_iq4_nl)
register("iq4_xs", BLOCK_IQ4_XS, dequantize_iq4_xs, quantize_iq4_xs)
