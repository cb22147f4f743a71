"""4-bit floats: mxfp4 (OCP microscaling: E2M1 values, one E8M0 power-of-two scale per 32)
and nvfp4 (NVIDIA: E2M1 values, one unsigned E4M3 scale per 16, 64 values per block).

The E2M1 code table is kept doubled (0, 1, 2, 3, 4, 6, 8, 12, and negatives) so it fits
int8; the scale decoders return half the true scale to compensate.
"""
from __future__ import annotations

import numpy as np

from .core import float32, register

KVALUES_MXFP4 = np.array([0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12], np.int8)

BLOCK_MXFP4 = np.dtype([("e", "u1"), ("qs", "u1", (16,))])
BLOCK_NVFP4 = np.dtype([("d", "u1", (4,)), ("qs", "u1", (32,))])


def e8m0_to_fp32_half(e: np.ndarray) -> np.ndarray:
    """ggml_e8m0_to_fp32_half: 2^(e - 127) / 2, built from bits (e < 2 lands in the subnormals)."""
    e = np.asarray(e).astype(np.uint32)
    bits = np.where(e < 2, np.uint32(0x00200000) << e, (e - 1) << 23).astype(np.uint32)
    return bits.view(float32)


def ue4m3_to_fp32_half(x: np.ndarray) -> np.ndarray:
    """Unsigned E4M3 (bias 7) scale, halved; 0 and 0x7F (NaN) read as 0."""
    x = np.asarray(x)
    exp = (x >> 3).astype(np.int32) & 0xF
    man = (x & 0x7).astype(float32)
    raw = np.where(exp == 0, man * float32(2.0 ** -9), (float32(1) + man / float32(8)) * (float32(2) ** (exp.astype(float32) - float32(7))))
    return np.where((x == 0) | (x == 0x7F), float32(0), raw * float32(0.5)).astype(float32)


def fp4_codes(qs: np.ndarray) -> np.ndarray:
    """Bytes (..., k) -> doubled E2M1 values (..., 2k): low nibbles first."""
    return KVALUES_MXFP4[np.concatenate([qs & 0x0F, qs >> 4], axis=-1)]


def dequantize_mxfp4(b):
    return e8m0_to_fp32_half(b["e"])[:, None] * fp4_codes(b["qs"]).astype(float32)


def dequantize_nvfp4(b):
    n = b.shape[0]
    d = ue4m3_to_fp32_half(b["d"])[..., None]                      # (n, 4, 1)
    return (d * fp4_codes(b["qs"].reshape(n, 4, 8)).astype(float32)).reshape(n, 64)


def quantize_mxfp4(x):
    """e = floor(log2(amax)) - 2 + 127 (so amax lands near the top code 6), then each value takes
    the code with the smallest |code * scale - x| (first one on ties)."""
    amax = np.abs(x).max(-1)
    with np.errstate(divide="ignore"):
        e = np.where(amax > 0, np.floor(np.log2(amax)) - float32(2) + float32(127), float32(0)).astype(np.uint8)
    d = e8m0_to_fp32_half(e)
    err = np.abs(d[:, None, None] * KVALUES_MXFP4.astype(float32) - x[..., None])
    q = np.argmin(err, axis=-1).astype(np.uint8)
    out = np.zeros(len(x), BLOCK_MXFP4)
    out["e"], out["qs"] = e, q[:, :16] | (q[:, 16:] << 4)
    return out


def fp32_to_ue4m3(x: np.ndarray) -> np.ndarray:
    """ggml_fp32_to_ue4m3: clamp to [0, 448]; normals keep 3 mantissa bits, rounded up on the 4th
    (an overflow of the mantissa carries into the exponent, saturating at 0x7E); below 2^-6 the
    subnormal code is round(x * 512) in 1..7."""
    x = np.clip(np.asarray(x, float32), float32(0), float32(448)).astype(float32)
    bits = x.view(np.uint32)
    e0 = ((bits >> 23) & 0xFF).astype(np.int32) - 127 + 7          # the exponent decides the branch
    man = ((bits >> 20) & 0x7).astype(np.int32) + ((bits >> 19) & 1).astype(np.int32)
    exp = np.where(man > 7, e0 + 1, e0)
    man = np.where(man > 7, 0, man)
    normal = np.where((exp >= 15) | (e0 >= 15), 0x7E, (exp << 3) | man)
    sub = np.clip((x * float32(512) + float32(0.5)).astype(np.int32), 0, 7)
    out = np.where(e0 <= 0, sub, normal)
    return np.where(x <= 0, 0, out).astype(np.uint8)


def _best_index(x: np.ndarray, d: np.ndarray) -> np.ndarray:
    """best_index_mxfp4: the code with the smallest |code * d - x|, the first one on ties."""
    err = np.abs(d[..., None] * KVALUES_MXFP4.astype(float32) - x[..., None])
    return np.argmin(err, axis=-1).astype(np.uint8)


def quantize_nvfp4(x):
    """Per 16 values: scale = ue4m3(amax / 6) (6 is the largest E2M1 value), then the nearest code."""
    n = x.shape[0]
    xs = x.reshape(n, 4, 16)
    ue = fp32_to_ue4m3(np.abs(xs).max(-1) / float32(6))
    q = _best_index(xs, np.broadcast_to(ue4m3_to_fp32_half(ue)[..., None], xs.shape))
    out = np.zeros(n, BLOCK_NVFP4)
    out["d"], out["qs"] = ue, (q[..., :8] | (q[..., 8:] << 4)).reshape(n, 32)
    return out


register("mxfp4", BLOCK_MXFP4, dequantize_mxfp4, quantize_mxfp4)
register("nvfp4", BLOCK_NVFP4, dequantize_nvfp4, quantize_nvfp4)
