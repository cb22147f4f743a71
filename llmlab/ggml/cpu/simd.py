"""SIMD arithmetic in NumPy (ggml-cpu's simd-mappings.h): fused multiply-adds and horizontal sums.

Every float kernel of ggml-cpu comes down to two things this module reproduces:

- **fused multiply-add** ``fma(a, b, c) = a*b + c`` rounded once. The product of two float32
  values is exact in float64, so ``(a * b + c)`` in float64 rounded to float32 is the hardware
  result except for vanishingly rare double-rounding ties.
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
    """float32 fused multiply-add a*b + c, rounded once (via float64)."""
    return (np.asarray(a, float32).astype(float64) * np.asarray(b, float32) + np.asarray(c, float32)).astype(float32)


def fma64(a, b, c) -> np.ndarray:
    """As :func:`fma` for operands already held in float64 (exact float32 values or exact integers)."""
    return (a * b + c).astype(float32)


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
