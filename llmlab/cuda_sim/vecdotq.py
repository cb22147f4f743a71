"""The per-thread dot products of ggml-cuda/vecdotq.cuh: one quantized weight block meets q8_1 activations.

Every ``vec_dot_<type>_q8_1(vx, vy, kbx, kby, iqs)`` is what one thread computes in one trip of the
matrix kernel's K loop: weight block ``kbx`` of memory ``vx``, the q8_1 block ``kby`` aligned with its
start in ``vy``, and ``iqs``, the first 32-bit word of the block this thread owns. It reads ``vdr``
words of weights (VDR, "vec dot ratio"), unpacks them with masks and shifts while they stay packed
four to a register, multiplies them with ``dp4a`` and applies the float scales once.

The indices may be numpy arrays of any (broadcastable) shape: one call then plays a whole grid of
threads. Pass a list as ``ints`` to collect the integer dp4a accumulators the thread ends with.

``fast_fp16``: on GPUs with fast half arithmetic (Pascal sm_60 and later, except sm_61) q4_1 multiplies
its two half2 scale pairs with ``__hmul2``, so ``d_w * d_x`` and ``m_w * s_x`` are rounded to half.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np

from . import _ggml as G
from .dp4a import Memory, dp4a, get_int_b2, get_int_b4, load_half, vsub4

F32 = np.float32
QK8_1, QI8_1, Q8_1_SIZE = 32, 8, G.BLOCK_Q8_1.itemsize
Q8_1_QS = G.BLOCK_Q8_1.fields["qs"][1]                    # 4: after the half2 ds, so qs is 4-byte aligned


def f32(x) -> np.ndarray:
    """int -> float conversion of CUDA (exact for the sums here, all below 2**24)."""
    return np.asarray(x).astype(F32)


def _fp16_product(a, b) -> np.ndarray:
    """One lane of ``__hmul2``: the product of two halves, rounded to half, widened back to float."""
    return G.fp16(a * b).astype(F32)


@dataclass(frozen=True)
class CudaType:
    """``ggml_cuda_type_traits`` plus the MMVQ vec-dot ratio of one weight type."""
    name: str          # ggml's spelling: q4_K
    qk: int            # values per block
    qr: int            # values per byte-position of a 32-bit word ("quant ratio")
    qi: int            # 32-bit words of quants per block: qk / (4 * qr)
    vdr: int           # words one thread handles per vec_dot call
    bs: int            # bytes per block
    vec_dot: Callable | None = None

    @property
    def threads_per_block(self) -> int:
        """Threads that share one weight block: qi / vdr."""
        return self.qi // self.vdr

    @property
    def weights_per_call(self) -> int:
        """Weights one vec_dot call multiplies: qk * vdr / qi."""
        return self.qk * self.vdr // self.qi


def _field(layout: np.dtype, name: str) -> int:
    return layout.fields[name][1]


# ---------------------------------------------------------------- legacy types: one block of 32 per q8_1 block


def _with_offset(vx: Memory, bx, vy: Memory, by, sumi, offset: int, vdr: int, qi: int, ints):
    """The last step of q4_0's and q5_0's dot (vec_dot_q4_0/q5_0_q8_1_impl): d_x * (sumi * d_y -
    offset * s_y), the codes being stored as value + offset. This thread saw vdr/qi of the block's
    values, so it subtracts that share of ``offset * sum(y)`` (q8_1's s)."""
    if ints is not None:
        ints.append(sumi)
    d = load_half(vx, bx)
    d8, s8 = load_half(vy, by), load_half(vy, by + 2)
    return d * (f32(sumi) * d8 - F32(offset * vdr // qi) * s8)


def vec_dot_q4_0_q8_1(vx: Memory, vy: Memory, kbx, kby, iqs, *, fast_fp16=True, ints=None):
    """q4_0: nibbles kept unsigned 0..15 in the dp4a, the -8 applied once through the activation sum ``s``."""
    vdr, qi = 2, 4
    bq4_0, bq8_1 = np.asarray(kbx) * G.BLOCK_Q4_0.itemsize, np.asarray(kby) * Q8_1_SIZE
    sumi = 0
    for i in range(vdr):
        v = get_int_b2(vx, bq4_0 + _field(G.BLOCK_Q4_0, "qs"), iqs + i)       # qs only 2-byte aligned
        u0 = get_int_b4(vy, bq8_1 + Q8_1_QS, iqs + i)                           # x values 0..15 pair with low nibbles
        u1 = get_int_b4(vy, bq8_1 + Q8_1_QS, iqs + i + qi)                      # x values 16..31 with high nibbles
        sumi = dp4a((v >> 0) & 0x0F0F0F0F, u0, sumi)
        sumi = dp4a((v >> 4) & 0x0F0F0F0F, u1, sumi)
    return _with_offset(vx, bq4_0, vy, bq8_1, sumi, 8, vdr, qi, ints)


def vec_dot_q4_1_q8_1(vx: Memory, vy: Memory, kbx, kby, iqs, *, fast_fp16=True, ints=None):
    """q4_1: ``d*q + m``; the min term is ``m * s``, split evenly between the block's threads."""
    vdr, qi, qr = 2, 4, 2
    bq4_1, bq8_1 = np.asarray(kbx) * G.BLOCK_Q4_1.itemsize, np.asarray(kby) * Q8_1_SIZE
    sumi = 0
    for i in range(vdr):
        v = get_int_b4(vx, bq4_1 + _field(G.BLOCK_Q4_1, "qs"), iqs + i)       # 4-byte aligned: after d and m
        sumi = dp4a((v >> 0) & 0x0F0F0F0F, get_int_b4(vy, bq8_1 + Q8_1_QS, iqs + i), sumi)
        sumi = dp4a((v >> 4) & 0x0F0F0F0F, get_int_b4(vy, bq8_1 + Q8_1_QS, iqs + i + qi), sumi)
    if ints is not None:
        ints.append(sumi)
    d4, m4 = load_half(vx, bq4_1), load_half(vx, bq4_1 + 2)
    d8, s8 = load_half(vy, bq8_1), load_half(vy, bq8_1 + 2)
    if fast_fp16:
        d4d8, m4s8 = _fp16_product(d4, d8), _fp16_product(m4, s8)
    else:
        d4d8, m4s8 = d4 * d8, m4 * s8
    return f32(sumi) * d4d8 + m4s8 / F32(QI8_1 // (vdr * qr))


def vec_dot_q5_0_q8_1(vx: Memory, vy: Memory, kbx, kby, iqs, *, fast_fp16=True, ints=None):
    """q5_0: the fifth bits of ``qh`` are shifted into bit 4 of each byte; -16 goes through ``s`` like q4_0's -8."""
    vdr, qi = 2, 4
    bq5_0, bq8_1 = np.asarray(kbx) * G.BLOCK_Q5_0.itemsize, np.asarray(kby) * Q8_1_SIZE
    sumi = 0
    for i in range(vdr):
        vl = get_int_b2(vx, bq5_0 + _field(G.BLOCK_Q5_0, "qs"), iqs + i)
        vh = get_int_b2(vx, bq5_0 + _field(G.BLOCK_Q5_0, "qh"), 0) >> (4 * (np.asarray(iqs) + i))
        vi0 = (vl >> 0) & 0x0F0F0F0F                       # values 4(iqs+i)..+3: qh bits 0..3 -> bits 4, 12, 20, 28
        vi0 |= (vh << 4) & 0x00000010
        vi0 |= (vh << 11) & 0x00001000
        vi0 |= (vh << 18) & 0x00100000
        vi0 |= (vh << 25) & 0x10000000
        sumi = dp4a(vi0, get_int_b4(vy, bq8_1 + Q8_1_QS, iqs + i), sumi)
        vi1 = (vl >> 4) & 0x0F0F0F0F                       # values 16 + ...: qh bits 16..19
        vi1 |= (vh >> 12) & 0x00000010
        vi1 |= (vh >> 5) & 0x00001000
        vi1 |= (vh << 2) & 0x00100000
        vi1 |= (vh << 9) & 0x10000000
        sumi = dp4a(vi1, get_int_b4(vy, bq8_1 + Q8_1_QS, iqs + i + qi), sumi)
    return _with_offset(vx, bq5_0, vy, bq8_1, sumi, 16, vdr, qi, ints)


def vec_dot_q8_0_q8_1(vx: Memory, vy: Memory, kbx, kby, iqs, *, fast_fp16=True, ints=None):
    """q8_0: already signed bytes, so dp4a straight away; no offset term."""
    vdr = 2
    bq8_0, bq8_1 = np.asarray(kbx) * G.BLOCK_Q8_0.itemsize, np.asarray(kby) * Q8_1_SIZE
    sumi = 0
    for i in range(vdr):
        v = get_int_b2(vx, bq8_0 + _field(G.BLOCK_Q8_0, "qs"), iqs + i)
        sumi = dp4a(v, get_int_b4(vy, bq8_1 + Q8_1_QS, iqs + i), sumi)
    if ints is not None:
        ints.append(sumi)
    return load_half(vx, bq8_0) * load_half(vy, bq8_1) * f32(sumi)


# ---------------------------------------------------------------- K-quants: one super-block of 256 spans 8 q8_1 blocks


def vec_dot_q4_K_q8_1(vx: Memory, vy: Memory, kbx, kby, iqs, *, fast_fp16=True, ints=None):
    """q4_K: 2 x 8 bytes of nibbles (two sub-blocks of 32), their 6-bit scale and min, and the min term
    through ``dp4a(0x01010101, u)`` = sum of the activation codes."""
    qr = 2
    L = G.BLOCK_Q4_K
    iqs = np.asarray(iqs)
    bq4_K, y0 = np.asarray(kbx) * L.itemsize, np.asarray(kby)
    bq8_offset = qr * ((iqs // 2) // (QI8_1 // 2))          # iqs 0,2,..,30 -> first sub-block 0, 2, 4, 6
    q4 = bq4_K + _field(L, "qs") + 16 * bq8_offset + 4 * ((iqs // 2) % 4)
    v0, v1 = get_int_b4(vx, q4, 0), get_int_b4(vx, q4, 4)   # bytes 0..3 and 16..19 of that 32-byte run

    # the two scales and two mins of sub-blocks bq8_offset, +1: 6 bits each, unpacked without a branch
    sc16 = bq4_K + _field(L, "scales")
    j = bq8_offset // 2
    jm = j & 1
    s0, s2, s4 = (vx.load(sc16 + 2 * (jm + k), "<u2").astype(np.uint32) for k in (0, 2, 4))
    hi = (-(j >= 2).astype(np.int64)).astype(np.uint32)   # all ones for sub-blocks 4..7, else zero
    aux0 = (((s0 & 0x3F3F) & ~hi) | ((((s4 >> 0) & 0x0F0F) | ((s0 & 0xC0C0) >> 2)) & hi)) & 0xFFFF
    aux1 = (((s2 & 0x3F3F) & ~hi) | ((((s4 >> 4) & 0x0F0F) | ((s2 & 0xC0C0) >> 2)) & hi)) & 0xFFFF
    sc = (aux0 & 0xFF, aux0 >> 8)
    m = (aux1 & 0xFF, aux1 >> 8)

    sumf_d = sumf_m = F32(0)
    for i in range(qr):
        bq8i = (y0 + bq8_offset + i) * Q8_1_SIZE
        d8 = load_half(vy, bq8i)
        q8 = bq8i + Q8_1_QS + 4 * ((iqs // 2) % 4)
        u0, u1 = get_int_b4(vy, q8, 0), get_int_b4(vy, q8, 4)
        dot1 = dp4a((v1 >> (4 * i)) & 0x0F0F0F0F, u1, dp4a((v0 >> (4 * i)) & 0x0F0F0F0F, u0, 0))
        dot2 = dp4a(0x01010101, u1, dp4a(0x01010101, u0, 0))        # sum of the 8 activation codes
        if ints is not None:
            ints.extend([dot1, dot2])
        sumf_d = sumf_d + d8 * f32(dot1 * sc[i].astype(np.int64))
        sumf_m = sumf_m + d8 * f32(dot2 * m[i].astype(np.int64))
    d, dmin = load_half(vx, bq4_K), load_half(vx, bq4_K + 2)
    return d * sumf_d - dmin * sumf_m


def vec_dot_q6_K_q8_1(vx: Memory, vy: Memory, kbx, kby, iqs, *, fast_fp16=True, ints=None):
    """q6_K: 4 low bits from ``ql``, 2 high bits from ``qh`` moved to bits 4-5, then -32 per byte.

    llama.cpp subtracts with ``__vsub4(v, 0x20202020)``; ``dp4a(v, u) + dp4a(0xE0E0E0E0, u)`` (0xE0 is -32
    as int8) gives the same integer, since v - 32 always fits a byte.
    """
    qr, qi = 2, 32
    L = G.BLOCK_Q6_K
    iqs = np.asarray(iqs)
    bq6_K, y0 = np.asarray(kbx) * L.itemsize, np.asarray(kby)
    bq8_offset = 2 * qr * (iqs // (qi // 2)) + (iqs % (qi // 2)) // (qi // 4)
    scale_offset = (qi // 4) * (iqs // (qi // 2)) + (iqs % (qi // 2)) // (qi // 8)
    vh_shift = 2 * ((iqs % (qi // 2)) // (qi // 4))
    vl = get_int_b2(vx, bq6_K + _field(L, "ql"), iqs)
    vh = get_int_b2(vx, bq6_K + _field(L, "qh"), (qi // 4) * (iqs // (qi // 2)) + iqs % (qi // 4)) >> vh_shift
    scales = bq6_K + _field(L, "scales") + scale_offset

    sumf = F32(0)
    for i in range(qr):
        bq8i = (y0 + bq8_offset + 2 * i) * Q8_1_SIZE
        u = get_int_b4(vy, bq8i + Q8_1_QS, iqs % QI8_1)
        d8 = load_half(vy, bq8i)
        sc = vx.load(scales + 4 * i, "i1").astype(np.int64)
        vil = (vl >> (4 * i)) & 0x0F0F0F0F
        vih = ((vh >> (4 * i)) << 4) & 0x30303030
        dot = dp4a(vsub4(vil | vih, 0x20202020), u, 0)
        if ints is not None:
            ints.append(dot)
        sumf = sumf + d8 * f32(dot * sc)
    return load_half(vx, bq6_K + _field(L, "d")) * sumf


def _t(name, qk, qr, vdr, vec_dot=None):
    return CudaType(name, qk, qr, qk // (4 * qr), vdr, G.ggml_type(name).type_size, vec_dot)


QK_K = G.QK_K
CUDA_TYPES: dict[str, CudaType] = {t.name.lower(): t for t in [
    _t("q4_0", 32, 2, 2, vec_dot_q4_0_q8_1),
    _t("q4_1", 32, 2, 2, vec_dot_q4_1_q8_1),
    _t("q5_0", 32, 2, 2, vec_dot_q5_0_q8_1),
    _t("q5_1", 32, 2, 2),
    _t("q8_0", 32, 1, 2, vec_dot_q8_0_q8_1),
    _t("q2_K", QK_K, 4, 1),
    _t("q3_K", QK_K, 4, 1),
    _t("q4_K", QK_K, 2, 2, vec_dot_q4_K_q8_1),
    _t("q5_K", QK_K, 2, 2),
    _t("q6_K", QK_K, 2, 1, vec_dot_q6_K_q8_1),
]}


def cuda_type(name) -> CudaType:
    """Look up a weight type by ggml name (``q4_K``, ``q4_k`` or an llmlab GGMLType)."""
    key = getattr(name, "name", name).lower()
    if key not in CUDA_TYPES:
        raise ValueError(f"cuda_sim knows no MMVQ type {name!r} (known: {', '.join(t.name for t in CUDA_TYPES.values())})")
    return CUDA_TYPES[key]
