"""Fast twins of ``llmlab.ggml.cpu.quants.mul_mat`` (ggml-cpu's quants.c: one ``ggml_vec_dot_*`` per
output, in the AVX2 kernels' order): the legacy quants q4_0, q4_1, q5_0, q8_0 and the K-quants q4_K, q6_K.
The weights are repacked once, G rows side by side, so that every inner loop runs across rows.

Legacy packed layout (``pack_legacy``), for row group g (rows gG .. gG+G-1, the last group zero-padded)
and block b: q4_0 / q4_1 ``qs[g, b, i, r]`` byte i of row r's block (low nibble value i, high nibble
i+16); q8_0 and q5_0 ``qs[g, b, i, r]`` the int8 code of value i (q5_0's 5-bit codes minus 16, its
fifth bits merged at load: one code kind less, 12 bytes more per block); ``d[g, b, r]`` and q4_1's
``m``: the float16 scales as their bits (widened in the inner loop by the F16C instruction).

Each block gives 8 lane sums (lane j: the exact integer sum of products 4j..4j+3), then the float
step of the reference, ``acc_j = fma(d_x * d_w, lane_j, acc_j)`` (the FMA instruction, as ggml),
block after block; at the end hsum_float_8 over the lanes (q4_1: + the fma sum of m_w * s_x). One
body for the four types, plain loops across the G rows that LLVM vectorizes (tests/test_machine_code.py
reads the machine code); a block's codes are unpacked once into W (32, G) int16.

K-quant packed layout (``pack_q4_k`` / ``pack_q6_k``), G rows side by side per super-block b: q4_K
``qs[g, b, l, r]`` byte l of row r (low nibble: value 64(l//32) + l%32, high nibble: +32), ``sc``/``mn
[g, b, c, r]`` the 6-bit scale and min of 32-value sub-block c (int16), ``d``/``dmin`` float32; q6_K
``W6[g, b, i, r]`` the unsigned 6-bit code (0..63) of value i (its -32 comes back through the q8_K
block sums), ``sc[g, b, 16, r]`` (int16), ``d`` float32.
"""
from __future__ import annotations

import numpy as np
from numba import njit, prange, types
from numba.extending import overload

from ._common import G, NOPYTHON, as_f32, fma, hsum8

# ---- legacy quants ----------------------------------------------------------------------------
# The kind of a packed weight is in the type of its m: q4_1's scales (3-D), an empty int8 array for int8
# codes (q8_0, q5_0; stored as uint8 bits), an empty uint16 array for q4_0. numba compiles a kernel once
# per kind, taking these helpers' implementations for it, so the loops have no branch on the type.

def codes(qs, m, g, b, i, r):
    """The int16 codes of byte i of block b of row r: (value i, value i + 16)."""


def lane(m, w0, w1, w2, w3, a0, a1, a2, a3):
    """One lane sum, w0 * a0 + .. + w3 * a3: int16 where it fits (|sum| <= 4 * 16 * 127 for 4- and
    5-bit codes), for q8_0 int32 as the sum of two int16 pair sums (2 * 128 * 127 fits)."""


def min_term(m, as_, g, b, t, r, summ):
    """q4_1: summ[r] = fma(m_w, s_x, summ[r]), once per block; nothing for the other types."""


def plus_min(m, v, s):
    """q4_1: v + s (the min term after hsum_float_8); the other types: v."""


@njit(inline="always", **NOPYTHON)
def _s8(u):
    """The int8 value of the bits u, as int16: u - ((u >> 7) << 8) keeps LLVM in int16 (a sign extension
    of int8 made it widen every product to int64)."""
    return np.int16(u) - (np.int16(u >> np.uint8(7)) << np.int16(8))


@overload(codes, inline="always")
def _codes(qs, m, g, b, i, r):
    if m.dtype == types.int8:                                   # q8_0, q5_0: int8 codes as uint8 bits
        return lambda qs, m, g, b, i, r: (_s8(qs[g, b, i, r]), _s8(qs[g, b, i + 16, r]))
    if m.ndim == 3:                                             # q4_1
        return lambda qs, m, g, b, i, r: (np.int16(qs[g, b, i, r] & np.uint8(15)), np.int16(qs[g, b, i, r] >> np.uint8(4)))
    return lambda qs, m, g, b, i, r: (np.int16(qs[g, b, i, r] & np.uint8(15)) - np.int16(8),    # q4_0
                                       np.int16(qs[g, b, i, r] >> np.uint8(4)) - np.int16(8))


@overload(lane, inline="always")
def _lane(m, w0, w1, w2, w3, a0, a1, a2, a3):
    if m.dtype == types.int8:
        return lambda m, w0, w1, w2, w3, a0, a1, a2, a3: np.int32(np.int16(w0 * a0 + w1 * a1) + np.int16(w2 * a2 + w3 * a3))
    return lambda m, w0, w1, w2, w3, a0, a1, a2, a3: np.int16(w0 * a0 + w1 * a1 + w2 * a2 + w3 * a3)


@overload(min_term, inline="always")
def _min_term(m, as_, g, b, t, r, summ):
    if m.ndim != 3:
        return lambda m, as_, g, b, t, r, summ: None

    def q4_1(m, as_, g, b, t, r, summ):
        summ[r] = fma(as_f32(m[g, b, r]), as_[t, b], summ[r])
    return q4_1


@overload(plus_min, inline="always")
def _plus_min(m, v, s):
    if m.ndim != 3:
        return lambda m, v, s: v
    return lambda m, v, s: v + s


@njit(inline="always", **NOPYTHON)
def _acts(a, t, o):
    """Activations o .. o+3 and o+16 .. o+19 of row t (the two lanes of bytes o .. o+3) as int16."""
    return (np.int16(a[t, o]), np.int16(a[t, o + 1]), np.int16(a[t, o + 2]), np.int16(a[t, o + 3]),
            np.int16(a[t, o + 16]), np.int16(a[t, o + 17]), np.int16(a[t, o + 18]), np.int16(a[t, o + 19]))


@njit(inline="always", **NOPYTHON)
def hsum_lanes(acc, r):
    """hsum_float_8 of the 8 lanes acc[:, r]."""
    return hsum8(acc[0, r], acc[1, r], acc[2, r], acc[3, r], acc[4, r], acc[5, r], acc[6, r], acc[7, r])


@njit(inline="always", **NOPYTHON)
def _lanes(W, m, r, i, a, dd, acc):
    """Lane i // 4 (codes i .. i+3 of row r) and lane 4 + i // 4 (codes i+16 .. i+19), each
    acc[j, r] = fma(dd, lane, acc[j, r]); a: the 8 activations of the two lanes."""
    j = i >> 2
    acc[j, r] = fma(dd, lane(m, W[i, r], W[i + 1, r], W[i + 2, r], W[i + 3, r], a[0], a[1], a[2], a[3]), acc[j, r])
    acc[j + 4, r] = fma(dd, lane(m, W[i + 16, r], W[i + 17, r], W[i + 18, r], W[i + 19, r], a[4], a[5], a[6], a[7]),
                        acc[j + 4, r])


@njit(inline="always", **NOPYTHON)
def _vec_dot_legacy(qs, d, m, aq, ad, as_):
    """qs (ng, nb, 16 or 32, G) uint8, d, m (ng, nb, G) f16 bits (m: q4_1, else empty);
    aq (T, K) int8, ad, as_ (T, nb) float32 (q8_0, or q8_1 with s for q4_1) -> (T, ng*G) float32.
    Per block the codes of the G rows are unpacked once into W (32, G) int16 (faster than taking
    them from the packed bytes per activation row, even for one row)."""
    ng, nb = qs.shape[0], qs.shape[1]
    T = aq.shape[0]
    out = np.empty((T, ng * G), np.float32)
    for g in prange(ng):
        acc = np.zeros((T, 8, G), np.float32)
        summ = np.zeros((T, G), np.float32)
        W = np.empty((32, G), np.int16)
        for b in range(nb):
            for i in range(16):
                for r in range(G):
                    W[i, r], W[i + 16, r] = codes(qs, m, g, b, i, r)
            for t in range(T):
                p0 = _acts(aq, t, 32 * b)           # the activations as values, not memory: LLVM keeps
                p1 = _acts(aq, t, 32 * b + 4)       # them in registers across the rows (a store to the
                p2 = _acts(aq, t, 32 * b + 8)       # accumulators could change an array's, so it would
                p3 = _acts(aq, t, 32 * b + 12)      # load them again)
                dab = ad[t, b]
                at, st = acc[t], summ[t]
                for r in range(G):                  # vectorized across the G rows
                    dd = dab * as_f32(d[g, b, r])
                    _lanes(W, m, r, 0, p0, dd, at)  # written out, not a loop: LLVM vectorizes only
                    _lanes(W, m, r, 4, p1, dd, at)  # innermost loops, and leaves an inner loop of 4
                    _lanes(W, m, r, 8, p2, dd, at)  # rolled when its body is large (q8_0)
                    _lanes(W, m, r, 12, p3, dd, at)
                    min_term(m, as_, g, b, t, r, st)
        for t in range(T):
            for r in range(G):
                out[t, g * G + r] = plus_min(m, hsum_lanes(acc[t], r), summ[t, r])
    return out


# the entry points: threaded (prange over row groups) and serial (for small work, where waking the
# other threads costs more than it saves; the same body, inlined, so the same bits)

@njit(parallel=True, **NOPYTHON)
def vec_dot_legacy(qs, d, m, aq, ad, as_):
    return _vec_dot_legacy(qs, d, m, aq, ad, as_)


@njit(**NOPYTHON)
def vec_dot_legacy_serial(qs, d, m, aq, ad, as_):
    return _vec_dot_legacy(qs, d, m, aq, ad, as_)


def groups(a: np.ndarray, R: int, size: int = G, axis: int = -1) -> np.ndarray:
    """(R, nb, ...) -> (ng, nb, ..., size) with the rows of a group at ``axis`` (last by default): rows
    padded with zeros to a multiple of ``size``, then moved there. Every packed layout of the fast
    kernels is made by it."""
    ng = -(-R // size)
    if ng * size != R:
        a = np.concatenate([a, np.zeros((ng * size - R,) + a.shape[1:], a.dtype)])
    a = a.reshape((ng, size) + a.shape[1:])
    return np.ascontiguousarray(np.moveaxis(a, 1, axis))


def pack_legacy(raw: np.ndarray, tname: str, K: int, layout: str = "rows") -> tuple:
    """Raw rows (R, row_bytes) uint8 of q4_0/q4_1/q5_0/q8_0 -> the packed arrays of one of two layouts:
    ``rows`` (qs, d, m): G rows side by side, a code per value (see the module doc); ``quads`` (qs, qh, d,
    m): dot4's 16-row groups of 4-byte quads, q8_0's codes plus 128 (see ``dot4_pack``)."""
    from ...quant import legacy as L
    blocks = {"q4_0": L.BLOCK_Q4_0, "q4_1": L.BLOCK_Q4_1, "q5_0": L.BLOCK_Q5_0, "q8_0": L.BLOCK_Q8_0}[tname]
    nb = K // 32
    w = np.ascontiguousarray(raw).reshape(-1).view(blocks).reshape(-1, nb)
    R = w.shape[0]
    n = 16 if layout == "quads" else G
    f16 = lambda name: groups(np.ascontiguousarray(w[name]).view(np.uint16), R, n)
    qs = np.ascontiguousarray(w["qs"])
    if layout == "quads":
        codes = qs.view(np.uint8) ^ np.uint8(0x80) if tname == "q8_0" else qs.view(np.uint8)   # w + 128 unsigned
        g = groups(codes.reshape(R, nb, -1, 4), R, n, axis=-2)                                 # (row, block, lane, k)
        qh = (groups(np.ascontiguousarray(w["qh"]).view("<u4").reshape(R, nb), R, n) if tname == "q5_0"
              else np.zeros((0, nb, n), np.uint32))
        m = f16("m") if tname == "q4_1" else np.zeros((0, nb, n), np.uint16)
        return g.reshape(g.shape[0], nb, -1), qh, f16("d"), m
    if tname == "q5_0":                          # the 5-bit codes minus 16, as q8_0 holds its codes
        qs = (L.q5_codes(w.reshape(-1)).astype(np.int16) - 16).astype(np.int8).reshape(R, nb, 32)
    eight = tname in ("q5_0", "q8_0")           # the empty m slot tells the kernel: int8 codes (as uint8 bits)
    return (groups(qs.view(np.uint8), R), f16("d"),
            f16("m") if tname == "q4_1" else np.zeros(0, np.int8 if eight else np.uint16))


# ---- K-quants (q4_K, q6_K x q8_K) ---------------------------------------------------------------

@njit(inline="always", **NOPYTHON)
def unpack_q4_k(qs, g, b, W, nr):
    for l in range(128):
        base = 64 * (l >> 5) + (l & 31)
        for r in range(nr):
            v = qs[g, b, l, r]
            W[base, r] = np.int16(v & np.uint8(15))
            W[base + 32, r] = np.int16(v >> np.uint8(4))


@njit(inline="always", **NOPYTHON)
def widen_q6_k(W6, g, b, W, nr):
    """q6_K's unsigned codes of super-block b into W (256, nr) int16 (uint8 operands made LLVM multiply
    in int64)."""
    for i in range(256):
        for r in range(nr):
            W[i, r] = W6[g, b, i, r]


@njit(inline="always", **NOPYTHON)
def _quad(W, i, r, a, t, o):
    """One lane sum: W[i..i+3, r] . a[t, o..o+3] (int16)."""
    return np.int16(np.int16(W[i, r]) * np.int16(a[t, o]) + np.int16(W[i + 1, r]) * np.int16(a[t, o + 1])
                    + np.int16(W[i + 2, r]) * np.int16(a[t, o + 2]) + np.int16(W[i + 3, r]) * np.int16(a[t, o + 3]))


@njit(inline="always", **NOPYTHON)
def chunk_dots(W, a, t, o, D, nr, n):
    """D[c, r] = the integer dot of chunk c (4n values: n = 8 for q4_K's 32-value sub-blocks, 4 for
    q6_K's 16) of row r's codes W with activation row t; exact in int32, in any order."""
    for c in range(256 // (4 * n)):
        for r in range(nr):
            s = np.int32(0)
            for u in range(n):                  # unrolled by LLVM, vectorized across the rows
                i = 4 * (n * c + u)
                s = np.int32(s + np.int32(_quad(W, i, r, a, t, o + i)))
            D[c, r] = s


@njit(inline="always", **NOPYTHON)
def q4_k_superblocks(qs, sc, mn, d, dmin, aq, ad, bsums, steps):
    """The loop the tiled and REPACK q4_K kernels share: per super-block b the codes unpacked once, per
    activation row t the 8 sub-block dots D (32 values each), then ``steps(sc, mn, d, dmin, D, bsums, t,
    b, d_x, gemm, acc, acc_m)``, the path's float steps for the G rows (gemm: t in the groups of 4 rows
    of REPACK's gemm kernel). Result acc - acc_m (acc_m stays 0 where a path has none)."""
    ng, nb, nr = qs.shape[0], qs.shape[1], qs.shape[3]
    T = aq.shape[0]
    n_gemm = T - T % 4
    out = np.empty((T, ng * nr), np.float32)
    for g in prange(ng):
        W = np.empty((256, nr), np.int16)
        D = np.empty((8, nr), np.int32)
        acc = np.zeros((T, nr), np.float32)
        accm = np.zeros((T, nr), np.float32)
        for b in range(nb):
            unpack_q4_k(qs, g, b, W, nr)
            for t in range(T):
                chunk_dots(W, aq, t, 256 * b, D, nr, 8)
                steps(sc[g, b], mn[g, b], d[g, b], dmin[g, b], D, bsums, t, b, ad[t, b], t < n_gemm, acc[t], accm[t])
        for t in range(T):
            for r in range(nr):
                out[t, g * nr + r] = acc[t, r] - accm[t, r]
    return out


@njit(inline="always", **NOPYTHON)
def pair_sums(bsums, t, k):
    """q8_K's block sums bsums[t, k:k+16] (16 values each) added in pairs: the sums over the 8 sub-blocks
    of 32 values that the q4_K mins multiply."""
    return (np.int32(bsums[t, k + 0]) + np.int32(bsums[t, k + 1]), np.int32(bsums[t, k + 2]) + np.int32(bsums[t, k + 3]),
            np.int32(bsums[t, k + 4]) + np.int32(bsums[t, k + 5]), np.int32(bsums[t, k + 6]) + np.int32(bsums[t, k + 7]),
            np.int32(bsums[t, k + 8]) + np.int32(bsums[t, k + 9]), np.int32(bsums[t, k + 10]) + np.int32(bsums[t, k + 11]),
            np.int32(bsums[t, k + 12]) + np.int32(bsums[t, k + 13]), np.int32(bsums[t, k + 14]) + np.int32(bsums[t, k + 15]))


@njit(inline="always", **NOPYTHON)
def _mad2(a, x, b, y):
    """a*x + b*y in int32 (numba widens int32 products to int64 unless told)."""
    return np.int32(np.int32(np.int32(a) * np.int32(x)) + np.int32(np.int32(b) * np.int32(y)))


@njit(inline="always", **NOPYTHON)
def _k_lanes(W, sc, g, b, aq, t, o, L, nr, cs, hs):
    """vec_dot's 8 int32 lanes: L[u, r] = the sum over 32-value chunks c of scale x quad u of chunk c, the
    scale sc[g, b, cs c + hs (u >> 2)] (q4_K: one per chunk; q6_K: lanes 0-3 take 2c, lanes 4-7 2c+1).
    One output stream per loop: few runtime alias checks."""
    for u in range(8):
        h = hs * (u >> 2)
        for r in range(nr):
            L[u, r] = np.int32(sc[g, b, h, r] * _quad(W, 4 * u, r, aq, t, o + 4 * u))
        for c in range(1, 8):
            i = 32 * c + 4 * u
            s = cs * c + h
            for r in range(nr):
                L[u, r] += np.int32(sc[g, b, s, r] * _quad(W, i, r, aq, t, o + i))


@njit(parallel=True, **NOPYTHON)
def vec_dot_q4_k(qs, sc, mn, d, dmin, aq, ad, bsums):
    """ggml_vec_dot_q4_K_q8_K: acc (8 lanes) = fma(d_x d_w, lane, acc); acc_m (4 lanes) = fma(-d_x
    dmin_w, mins . block sums, acc_m); hsum(acc) + ((m0 + m2) + (m1 + m3))."""
    ng, nb, nr = qs.shape[0], qs.shape[1], qs.shape[3]
    T = aq.shape[0]
    out = np.empty((T, ng * nr), np.float32)
    for g in prange(ng):
        W = np.empty((256, nr), np.int16)
        L = np.empty((8, nr), np.int32)
        acc = np.zeros((T, 8, nr), np.float32)
        accm = np.zeros((T, 4, nr), np.float32)
        for b in range(nb):
            unpack_q4_k(qs, g, b, W, nr)
            for t in range(T):
                _k_lanes(W, sc, g, b, aq, t, 256 * b, L, nr, 1, 0)
                ya = ad[t, b]
                p = pair_sums(bsums, t, 16 * b)
                for r in range(nr):
                    dd = ya * d[g, b, r]
                    for u in range(8):
                        acc[t, u, r] = fma(dd, L[u, r], acc[t, u, r])
                    dm = -ya * dmin[g, b, r]
                    for k in range(4):
                        mk = _mad2(mn[g, b, 2 * k, r], p[2 * k], mn[g, b, 2 * k + 1, r], p[2 * k + 1])
                        accm[t, k, r] = fma(dm, mk, accm[t, k, r])
        for t in range(T):
            for r in range(nr):
                m = (accm[t, 0, r] + accm[t, 2, r]) + (accm[t, 1, r] + accm[t, 3, r])
                out[t, g * nr + r] = hsum_lanes(acc[t], r) + m
    return out


@njit(parallel=True, **NOPYTHON)
def vec_dot_q6_k(W6, sc, d, aq, ad, bsums):
    """ggml_vec_dot_q6_K_q8_K: lanes from the unsigned codes, lane u minus 32 (sc[2u] bsum[2u] + sc[2u+1]
    bsum[2u+1]); acc = fma(d_x d_w, lane, acc); hsum."""
    ng, nb, nr = W6.shape[0], W6.shape[1], W6.shape[3]
    T = aq.shape[0]
    out = np.empty((T, ng * nr), np.float32)
    for g in prange(ng):
        L = np.empty((8, nr), np.int32)
        acc = np.zeros((T, 8, nr), np.float32)
        W = np.empty((256, nr), np.int16)
        for b in range(nb):
            widen_q6_k(W6, g, b, W, nr)
            for t in range(T):
                _k_lanes(W, sc, g, b, aq, t, 256 * b, L, nr, 2, 1)
                ya = ad[t, b]
                k = 16 * b
                for u in range(8):
                    b0 = np.int32(bsums[t, k + 2 * u])
                    b1 = np.int32(bsums[t, k + 2 * u + 1])
                    for r in range(nr):
                        L[u, r] -= np.int32(32 * _mad2(sc[g, b, 2 * u, r], b0, sc[g, b, 2 * u + 1, r], b1))
                for r in range(nr):
                    dd = ya * d[g, b, r]
                    for u in range(8):
                        acc[t, u, r] = fma(dd, L[u, r], acc[t, u, r])
        for t in range(T):
            for r in range(nr):
                out[t, g * nr + r] = hsum_lanes(acc[t], r)
    return out


def pack_q4_k(raw: np.ndarray, tname: str, K: int) -> tuple:
    """Raw rows of q4_K -> (qs, sc, mn, d, dmin) (see the module doc)."""
    from ...quant import k_quants as KQ
    nb = K // 256
    w = np.ascontiguousarray(raw).reshape(-1).view(KQ.BLOCK_Q4_K).reshape(-1, nb)
    R = w.shape[0]
    sc, mn = KQ.scale_min_k4(w.reshape(-1)["scales"])
    return (groups(np.ascontiguousarray(w["qs"]), R), groups(sc.astype(np.int16).reshape(R, nb, 8), R),
            groups(mn.astype(np.int16).reshape(R, nb, 8), R), groups(w["d"].astype(np.float32), R),
            groups(w["dmin"].astype(np.float32), R))


def pack_q6_k(raw: np.ndarray, tname: str, K: int) -> tuple:
    """Raw rows of q6_K -> (W6, sc, d) (see the module doc)."""
    from ...quant import k_quants as KQ
    nb = K // 256
    w = np.ascontiguousarray(raw).reshape(-1).view(KQ.BLOCK_Q6_K).reshape(-1, nb)
    R = w.shape[0]
    codes = (KQ.q6k_codes(w.reshape(-1)).astype(np.int16) + 32).astype(np.uint8).reshape(R, nb, 256)
    return groups(codes, R), groups(w["scales"].astype(np.int16), R), groups(w["d"].astype(np.float32), R)
