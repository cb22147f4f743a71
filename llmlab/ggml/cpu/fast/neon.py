"""Fast twins of the ARM builds' quantized products (arch/arm/quants.c and arch/arm/repack.cpp), on the
packed layouts of ``quants`` (``pack_legacy``, ``pack_q4_k``, ``pack_q6_k``: G rows side by side).

The integer sums are exact whatever order adds them, so they are the x86 twins' (int16 quads across the
G rows, vectorized); what makes a kernel ARM's is where its floats round, which is data here as in the
references (``llmlab.ggml.cpu.quants`` ``vec_dot_*_neon`` / ``*_mmla``, ``llmlab.ggml.cpu.repack_gemm``):

- NEON vec_dot (q4_0, q4_1, q5_0, q8_0 x q8_0/q8_1): 4 int32 lanes per block (vdotq_s32: lane j sums
  values 4j..4j+3 of every 16), ``acc += (float) lane * d`` (multiply, then add) into an even-block and
  an odd-block accumulator, ``vaddvq_f32`` of each (pairwise), a scalar tail for an odd last block;
- i8mm's 2x2 steps (q4_1, where ``vec_dot_rows`` gives 2): one accumulator per output,
  ``acc += (float) isum * d`` per block, the min terms fused;
- REPACK q8_0 4x4 / 4x8, q4_K 8x4 / 8x8, q6_K 8x4 / 8x8: one float step per block (or per 32 or 64
  values), fused or not, as each layout's gemv and gemm round.

Nothing here is ARM code: the float order is data, so these kernels run (and are tested) on x86 too;
a fused step is LLVM's ``llvm.fma`` (``_common.fma``), an unfused one a plain multiply and add (numba
does not contract them).
"""
from __future__ import annotations

import numpy as np
from numba import njit, prange, types
from numba.extending import overload

from ._common import G, NOPYTHON, as_f32, fma
from .quants import _acts, _mad2, chunk_dots, codes, lane, pair_sums, q4_k_superblocks, widen_q6_k
from .quants import pack_legacy as _pack_legacy
from ..quants import MMLA_THREADS

# kernel modes of the legacy body (a constant per entry point, folded by LLVM after inlining)
VEC_DOT, MMLA, REPACK_4X4, REPACK_4X8 = 0, 1, 2, 3


@njit(inline="always", **NOPYTHON)
def _neon_lanes(W, m, a, L):
    """L[j, r] = NEON lane j of the block (values 4j..4j+3 and 16+4j..16+4j+3 of row r's codes W times
    the activations a: the 8 values of _acts at offsets 4j), exact in int32."""
    for j in range(4):
        aj = a[j]
        for r in range(W.shape[1]):
            L[j, r] = (np.int32(lane(m, W[4 * j, r], W[4 * j + 1, r], W[4 * j + 2, r], W[4 * j + 3, r],
                                     aj[0], aj[1], aj[2], aj[3]))
                       + np.int32(lane(m, W[4 * j + 16, r], W[4 * j + 17, r], W[4 * j + 18, r], W[4 * j + 19, r],
                                       aj[4], aj[5], aj[6], aj[7])))


@njit(inline="always", **NOPYTHON)
def _pair_tree(a0, a1, a2, a3):
    """vaddvq_f32: two faddp, neighbours first."""
    return (a0 + a1) + (a2 + a3)


@njit(inline="always", **NOPYTHON)
def _mmla_span(n_rows, n_act):
    """vec_dot_rows' chunking (MMLA_THREADS threads): the chunk lengths (d0 along rows, d1 along
    activation rows) of the 2x2 decision, or (0, 0) when no output takes 2x2 steps."""
    if n_rows % 2 or n_act % 2:
        return 0, 0
    size = 64 if n_rows == 1 or n_act == 1 else 16
    nc0, nc1 = -(-n_rows // size), -(-n_act // size)
    if nc0 * nc1 < MMLA_THREADS * 4:
        if n_rows > n_act:
            nc0, nc1 = MMLA_THREADS, 1
        else:
            nc0, nc1 = 1, MMLA_THREADS
    return -(-n_rows // nc0), -(-n_act // nc1)


@njit(inline="always", **NOPYTHON)
def _even_chunk(i, d, n):
    """Is the chunk of length d holding index i (of n) of even length?"""
    i0 = i - i % d
    return (min(i0 + d, n) - i0) % 2 == 0


@njit(inline="always", **NOPYTHON)
def finish(acc, summ, acc1, summ1, last, ad, t, r, o, R, nb, k, repack, d0, d1):
    """Output o (row r of its group) for activation row t, from the legacy kernels' accumulators (see
    _legacy; k: 0 q4_0, 1 q4_1, else int8 codes): REPACK's one accumulator; i8mm's 2x2 sum where both
    chunks are even (d0, d1: _mmla_span's); else vec_dot's even and odd float32x4 by vaddvq_f32, q4_1's
    min terms, and an odd last block's scalar step."""
    if repack:
        return acc1[t, r]
    if d0 > 0 and _even_chunk(o, d0, R) and _even_chunk(t, d1, acc.shape[0]):
        return acc1[t, r] + summ1[t, r]
    e, od = acc[t, 0], acc[t, 1]
    s = _pair_tree(e[0, r], e[1, r], e[2, r], e[3, r]) + _pair_tree(od[0, r], od[1, r], od[2, r], od[3, r])
    if k == 1:
        s = s + summ[t, r]
    if nb % 2 == 1:
        lt = last[t]
        if k == 0:                      # sumf += sumi * d_w * d_x, the last product fused
            s = fma(lt[0, r] * lt[1, r], ad[t, nb - 1], s)
        elif k == 1:                    # sumf + fma(d, sumi, m*s)
            s = s + fma(lt[1, r], lt[0, r], lt[2, r])
        else:
            s = fma(lt[1, r], lt[0, r], s)
    return s


def kind(m):
    """The code kind of a packed legacy weight (from its m slot, as ``quants.codes`` reads it): 0 q4_0,
    1 q4_1, 2 int8 codes (q5_0, q8_0); a compile-time constant."""


def m_of(m, g, b, r):
    """q4_1's min of row r as float32 (0 for the other kinds, whose m slot is empty)."""


@overload(m_of, inline="always")
def _m_of(m, g, b, r):
    if m.ndim == 3:
        return lambda m, g, b, r: as_f32(m[g, b, r])
    return lambda m, g, b, r: np.float32(0)


@overload(kind, inline="always")
def _kind(m):
    k = 1 if m.ndim == 3 else (2 if m.dtype == types.int8 else 0)
    return lambda m: k


@njit(inline="always", **NOPYTHON)
def _legacy(qs, d, m, aq, ad, as_, nrows, mode):
    """The ARM legacy kernels on quants.pack_legacy's layout (qs (ng, nb, 16 or 32, G), d / m f16 bits;
    m: q4_1's mins, else an empty array whose dtype tells the code kind) with the NEON activations
    (aq (T, K) int8, ad, as_ (T, nb)); ``mode``: VEC_DOT, MMLA (VEC_DOT where vec_dot_rows says 1;
    ``nrows`` (ng,): the real rows per group, for its chunking), REPACK_4X4 or REPACK_4X8 (q8_0)."""
    ng, nb = qs.shape[0], qs.shape[1]
    T = aq.shape[0]
    out = np.empty((T, ng * G), np.float32)
    k = kind(m)
    repack = mode == REPACK_4X4 or mode == REPACK_4X8
    n_gemm = T - T % 4 if mode == REPACK_4X4 else 0
    R = nrows.sum()
    d0, d1 = _mmla_span(R, T) if mode == MMLA else (0, 0)
    for g in prange(ng):
        W = np.empty((32, G), np.int16)
        L = np.empty((4, G), np.int32)
        isum = np.empty(G, np.float32)
        acc = np.zeros((T, 2, 4, G), np.float32)      # vec_dot: the even and odd blocks' float32x4
        summ = np.zeros((T, G), np.float32)           # vec_dot: q4_1's min terms
        acc1 = np.zeros((T, G), np.float32)           # REPACK / MMLA: one accumulator per output
        summ1 = np.zeros((T, G), np.float32)          # MMLA: its fused min terms
        last = np.zeros((T, 3, G), np.float32)        # an odd last block: sumi, d_x d_w (q4_0: d_w), m s
        m_even = np.zeros(G, np.float32)              # q4_1: the even block's m (its s is a scalar)
        for b in range(nb):
            for i in range(16):
                for r in range(G):
                    W[i, r], W[i + 16, r] = codes(qs, m, g, b, i, r)
            par = b % 2
            tail = b == nb - 1 and par == 0
            if k == 1:
                for r in range(G):
                    m_even[r] = m_of(m, g, b, r) if par == 0 else m_even[r]
            for t in range(T):
                o = 32 * b
                a = (_acts(aq, t, o), _acts(aq, t, o + 4), _acts(aq, t, o + 8), _acts(aq, t, o + 12))
                _neon_lanes(W, m, a, L)
                da = ad[t, b]
                for r in range(G):
                    isum[r] = np.float32(L[0, r] + L[1, r] + L[2, r] + L[3, r])
                if repack:
                    at1 = acc1[t]
                    if t < n_gemm:                                      # 4x4 gemm: vmlaq_f32, fmul + fadd
                        for r in range(G):
                            at1[r] = at1[r] + (da * as_f32(d[g, b, r])) * isum[r]
                    else:                                               # gemv, 4x8 gemm: vfmaq_f32
                        for r in range(G):
                            at1[r] = fma(isum[r], da * as_f32(d[g, b, r]), at1[r])
                    continue
                if mode == MMLA:
                    at1, st1 = acc1[t], summ1[t]
                    for r in range(G):
                        at1[r] = at1[r] + isum[r] * (da * as_f32(d[g, b, r]))
                    if k == 1:
                        s = as_[t, b]
                        for r in range(G):
                            st1[r] = fma(m_of(m, g, b, r), s, st1[r])
                if tail:
                    lt = last[t]
                    for r in range(G):
                        dw = as_f32(d[g, b, r])
                        lt[0, r] = isum[r]
                        lt[1, r] = dw if k == 0 else da * dw
                    if k == 1:
                        for r in range(G):
                            lt[2, r] = m_of(m, g, b, r) * as_[t, b]
                    continue
                at = acc[t, par]
                for r in range(G):
                    dd = da * as_f32(d[g, b, r])
                    for j in range(4):
                        at[j, r] = at[j, r] + np.float32(L[j, r]) * dd
                if k == 1 and par == 1:                 # summs += fma(m0, s0, m1*s1), per pair of blocks
                    s0, s1 = as_[t, b - 1], as_[t, b]
                    st = summ[t]
                    for r in range(G):
                        st[r] = st[r] + fma(m_even[r], s0, m_of(m, g, b, r) * s1)
        n = min(G, R - g * G)
        for t in range(T):
            for r in range(n):
                out[t, g * G + r] = finish(acc, summ, acc1, summ1, last, ad, t, r, g * G + r, R, nb, k, repack, d0, d1)
    return out


def _entry(name: str, mode: int, parallel: bool, doc: str | None = None):
    """An entry point of _legacy with its mode: threaded (prange over row groups) or its serial twin for small
    work, the same body. The closure holds only the mode and the flag (plain values: numba's cache key)."""
    def entry(qs, d, m, nrows, aq, ad, as_):
        return _legacy(qs, d, m, aq, ad, as_, nrows, mode)
    entry.__name__ = entry.__qualname__ = name
    entry.__doc__ = doc
    return njit(parallel=parallel, **NOPYTHON)(entry)


vec_dot = _entry("vec_dot", VEC_DOT, True, "arch/arm/quants.c ggml_vec_dot_q4_0/q4_1/q5_0/q8_0 (NEON dotprod).")
vec_dot_serial = _entry("vec_dot_serial", VEC_DOT, False)
vec_dot_mmla = _entry("vec_dot_mmla", MMLA, True, "The same with MATMUL_INT8: 2x2 vmmlaq_s32 steps where vec_dot_rows gives 2.")
vec_dot_mmla_serial = _entry("vec_dot_mmla_serial", MMLA, False)
q8_0_4x4 = _entry("q8_0_4x4", REPACK_4X4, True, "ggml_gemv/gemm_q8_0_4x4_q8_0: fused gemv, unfused gemm (rows in groups of 4).")
q8_0_4x8 = _entry("q8_0_4x8", REPACK_4X8, True, "ggml_gemv/gemm_q8_0_4x8_q8_0: one fma per block in both.")


def pack_legacy_nrows(raw: np.ndarray, tname: str, K: int) -> tuple:
    """quants.pack_legacy's arrays and the real rows of each group (nrows (ng,) int64)."""
    R = raw.shape[0]
    qs, d, m = _pack_legacy(raw, tname, K)
    nrows = np.minimum(G, R - G * np.arange(qs.shape[0])).astype(np.int64)
    return qs, d, m, nrows


# ---- K-quants in the REPACK buffer (quants.pack_q4_k / pack_q6_k layouts, q8_K activations of NEON) ----

@njit(inline="always", **NOPYTHON)
def _bias(m_, p, r):
    """The mins' integer sum of a q4_K super-block: sum over the 8 sub-blocks of min x bsum of 32."""
    return np.int32(np.int32(_mad2(m_[0, r], p[0], m_[1, r], p[1]) + _mad2(m_[2, r], p[2], m_[3, r], p[3]))
                    + np.int32(_mad2(m_[4, r], p[4], m_[5, r], p[5]) + _mad2(m_[6, r], p[6], m_[7, r], p[7])))


@njit(inline="always", **NOPYTHON)
def _steps_8x4(s_, m_, dw, dmw, D, bsums, t, b, ya, gemm, acc, accm):
    """ggml_gemv/gemm_q4_K_8x4_q8_K: per 64 values acc = fma(isum, d_w d_x, acc), then
    acc -= (float) bias * (dmin_w d_x), multiplied and subtracted."""
    p = pair_sums(bsums, t, 16 * b)
    for r in range(acc.shape[0]):
        dd = dw[r] * ya
        a = fma(_mad2(s_[0, r], D[0, r], s_[1, r], D[1, r]), dd, acc[r])
        a = fma(_mad2(s_[2, r], D[2, r], s_[3, r], D[3, r]), dd, a)
        a = fma(_mad2(s_[4, r], D[4, r], s_[5, r], D[5, r]), dd, a)
        a = fma(_mad2(s_[6, r], D[6, r], s_[7, r], D[7, r]), dd, a)
        acc[r] = a - np.float32(_bias(m_, p, r)) * (dmw[r] * ya)


@njit(inline="always", **NOPYTHON)
def _steps_8x8(s_, m_, dw, dmw, D, bsums, t, b, ya, gemm, acc, accm):
    """ggml_gemv_q4_K_8x8_q8_K (per 32 values acc = fma(sc dot, d_w d_x, acc), then the mins) and
    ggml_gemm_q4_K_8x8_q8_K (gemm rows: acc = (acc - (float) bias * dm) + (float) isum * d, unfused)."""
    p = pair_sums(bsums, t, 16 * b)
    for r in range(acc.shape[0]):
        dd = dw[r] * ya
        mins = np.float32(_bias(m_, p, r)) * (dmw[r] * ya)
        if gemm:
            isum = np.int32(0)
            for j in range(8):
                isum = np.int32(isum + np.int32(np.int32(s_[j, r]) * D[j, r]))
            acc[r] = (acc[r] - mins) + np.float32(isum) * dd
        else:
            a = acc[r]
            for j in range(8):
                a = fma(np.int32(np.int32(s_[j, r]) * D[j, r]), dd, a)
            acc[r] = a - mins


@njit(parallel=True, **NOPYTHON)
def q4_k_8x4(qs, sc, mn, d, dmin, aq, ad, bsums):
    return q4_k_superblocks(qs, sc, mn, d, dmin, aq, ad, bsums, _steps_8x4)


@njit(parallel=True, **NOPYTHON)
def q4_k_8x8(qs, sc, mn, d, dmin, aq, ad, bsums):
    return q4_k_superblocks(qs, sc, mn, d, dmin, aq, ad, bsums, _steps_8x8)


@njit(inline="always", **NOPYTHON)
def _q6_k(W6, sc, d, aq, ad, bsums, fused_gemv):
    """ARM's q6_K REPACK kernels: the super-block's integer dot (codes - 32, times the 16 scales) in one
    int32, then one float step: acc + (float) isum * d_w d_x, fused in the gemv rows where ``fused_gemv``
    (8x4), unfused elsewhere."""
    ng, nb, nr = W6.shape[0], W6.shape[1], W6.shape[3]
    T = aq.shape[0]
    n_fma = T - T % 4 if fused_gemv else T
    out = np.empty((T, ng * nr), np.float32)
    for g in prange(ng):
        W = np.empty((256, nr), np.int16)
        D = np.empty((16, nr), np.int32)
        S = np.empty(nr, np.int32)
        acc = np.zeros((T, nr), np.float32)
        for b in range(nb):
            widen_q6_k(W6, g, b, W, nr)
            for t in range(T):
                chunk_dots(W, aq, t, 256 * b, D, nr, 4)
                S[:] = 0
                for s in range(16):
                    bs = np.int32(32 * np.int32(bsums[t, 16 * b + s]))
                    for r in range(nr):
                        S[r] = np.int32(S[r] + np.int32(np.int32(sc[g, b, s, r]) * np.int32(D[s, r] - bs)))
                ya = ad[t, b]
                at = acc[t]
                if t < n_fma:
                    for r in range(nr):
                        at[r] = at[r] + np.float32(S[r]) * (d[g, b, r] * ya)
                else:
                    for r in range(nr):
                        at[r] = fma(S[r], d[g, b, r] * ya, at[r])
        for t in range(T):
            for r in range(nr):
                out[t, g * nr + r] = acc[t, r]
    return out


@njit(parallel=True, **NOPYTHON)
def q6_k_8x4(W6, sc, d, aq, ad, bsums):
    return _q6_k(W6, sc, d, aq, ad, bsums, True)


@njit(parallel=True, **NOPYTHON)
def q6_k_8x8(W6, sc, d, aq, ad, bsums):
    return _q6_k(W6, sc, d, aq, ad, bsums, False)
