"""SIMD arithmetic in NumPy (ggml-cpu's simd-mappings.h): fused multiply-adds and horizontal sums.

Every float kernel of ggml-cpu comes down to two things this module reproduces:

- **fused multiply-add** ``fma(a, b, c) = a*b + c`` rounded once. The product of two float32
  values is exact in float64, so ``a * b + c`` in float64 rounded to float32 is the hardware
  result, except where the float64 sum lands exactly halfway between two float32 values without
  being exact (double rounding). Those rare sums are moved one float64 ulp towards the exact
  value (its error is exact by Knuth's TwoSum), which makes the second rounding the right one.
- **horizontal sums**: the lanes of a register added into one number. Which lanes meet first is a
  *reduction tree*, and it differs between instruction sets: ``_mm512_reduce_add_ps`` on AVX-512,
  ``hsum_float_8`` or ``GGML_F32x8_REDUCE`` (two ``hadd``) on AVX2. A tree is plain data here: a
  lane index, or a pair of trees added in float32, e.g. ``((0, 4), (2, 6))``.
"""
from __future__ import annotations

from typing import Union

import numpy as np
from numpy import float32, float64

Tree = Union[int, tuple]


def fma(a, b, c) -> np.ndarray:
    """float32 fused multiply-add a*b + c, rounded once (as the FMA instruction does)."""
    return fma64(np.asarray(a, float32).astype(float64), np.asarray(b, float32), np.asarray(c, float32))


_MID = np.uint64(1 << 28)              # a float64 whose low 29 bits are 1000...0 lies halfway between floats
_LOW = np.uint64((1 << 29) - 1)
_TINY = np.uint64(0x3810000000000000)  # |x| < 2**-126: float32 subnormals round higher up; check them all


def fma64(a, b, c) -> np.ndarray:
    """As :func:`fma` for operands already held in float64 whose product is exact (float32 values,
    integers below 2**24); returns float32."""
    p = np.asarray(a * b, float64)
    s = np.asarray(p + c, float64)
    u = s.view(np.uint64)
    mag = u & np.uint64(0x7FFFFFFFFFFFFFFF)
    risky = ((u & _LOW) == _MID) | ((mag < _TINY) & (mag != 0))
    if risky.any():                     # rare: fix the double-rounding cases exactly
        p, c = np.broadcast_to(p, s.shape)[risky], np.broadcast_to(np.asarray(c, float64), s.shape)[risky]
        t = s[risky]
        bb = t - p
        err = (p - (t - bb)) + (c - bb)                 # t + err == p + c exactly (TwoSum)
        odd = t.view(np.uint64) | np.uint64(0)
        nudge = (err != 0) & ((odd & np.uint64(1)) == 0)    # round to odd: then one rounding to float32 is right
        step = np.where((err > 0) == (t > 0), 1, -1).astype(np.int64)
        odd = np.where(nudge, (odd.view(np.int64) + step).view(np.uint64), odd)
        s = s.copy()
        s[risky] = odd.view(float64)
    return s.astype(float32)


def fma_f16(a, b, c) -> np.ndarray:
    """float16 fused multiply-add a*b + c rounded once to float16 (NEON's ``vfmaq_f16``/``fmla .8h``).

    The product of two halves is exact in float64; the sum is made exact-enough by rounding it to odd
    (TwoSum's error nudges an inexact float64 sum to the odd neighbour), so the one rounding to float16
    that follows is the hardware's."""
    p = np.asarray(a, np.float16).astype(float64) * np.asarray(b, np.float16).astype(float64)
    c = np.asarray(c, np.float16).astype(float64)
    s = np.asarray(p + c, float64)
    bb = s - p
    err = (p - (s - bb)) + (c - bb)
    bits = s.view(np.int64)
    nudge = (err != 0) & ((bits & 1) == 0) & np.isfinite(s)
    if nudge.any():
        step = np.where((err > 0) == (s > 0), 1, -1).astype(np.int64)
        s = np.where(nudge, (bits + step).view(float64), s)
    with np.errstate(over="ignore"):
        return s.astype(np.float16)


def reduce_tree(acc: np.ndarray, tree: Tree) -> np.ndarray:
    """Add the lanes (last axis) of float32 registers in the order ``tree`` gives; float32 result."""
    if isinstance(tree, int):
        return np.asarray(acc[..., tree], float32)
    a, b = tree
    return (reduce_tree(acc, a) + reduce_tree(acc, b)).astype(float32)


def tree_lanes(tree: Tree) -> int:
    """How many lanes a tree reads."""
    return 1 if isinstance(tree, int) else tree_lanes(tree[0]) + tree_lanes(tree[1])


def halves(n: int) -> Tree:
    """The tree of "add the upper half onto the lower half" repeated down to two lanes, then those
    two (extract + add, movehl + add, movehdup + add_ss: ``hsum_float_8`` for 8 lanes, llamafile's
    ``hsum``, GCC's ``_mm512_reduce_add_ps`` for 16)."""
    lanes: list[Tree] = list(range(n))
    while len(lanes) > 2:
        h = len(lanes) // 2
        lanes = [(lanes[i], lanes[i + h]) for i in range(h)]
    return (lanes[0], lanes[1])


def pairwise(n: int) -> Tree:
    """Neighbours first, repeated: ``((0+1) + (2+3))`` for 4 lanes. AArch64's ``vaddvq_f32`` compiles to
    two ``faddp`` (pairwise adds), so every NEON horizontal sum of a float32x4_t follows this tree."""
    lanes: list[Tree] = list(range(n))
    while len(lanes) > 1:
        lanes = [(lanes[i], lanes[i + 1]) for i in range(0, len(lanes), 2)]
    return lanes[0]


def hadd_tree(n: int) -> Tree:
    """8 lanes: upper 128 bits onto the lower, then ``_mm_hadd_ps`` twice (``GGML_F32x8_REDUCE``):
    neighbours first, ((0+4) + (1+5)) + ((2+6) + (3+7))."""
    assert n == 8
    q = [(j, j + 4) for j in range(4)]
    return ((q[0], q[1]), (q[2], q[3]))


def reduce_registers(acc: np.ndarray) -> np.ndarray:
    """GGML_F32_VEC_REDUCE's first part: ARR registers (axis -2) folded pairwise, upper half onto
    lower, until one register is left: with 4, (0+2), (1+3), then those two."""
    a = acc
    while a.shape[-2] > 1:
        h = a.shape[-2] // 2
        a = (a[..., :h, :] + a[..., h:2 * h, :]).astype(float32)
    return a[..., 0, :]
