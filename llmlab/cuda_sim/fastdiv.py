"""``fastdiv``: integer division by a divisor known at launch, as one multiply-high, one add and one shift.

GPUs have no integer divide instruction; ``n / d`` compiles to a slow sequence of dozens of instructions.
When ``d`` is fixed for a whole launch (how many activation channels share one weight matrix, how many
tokens an expert slot cycles over), the host computes a magic multiplier once (``init_fastdiv_values`` in
common.cuh, after Granlund and Montgomery, PLDI 1994, figure 4.1) and the kernel divides with

    n / d = (umulhi(n, mp) + n) >> L          with L = ceil(log2 d), mp = 2^32 (2^L - d) / d + 1

MMVQ uses it for ``channel_x = fastdiv(channel_dst, channel_ratio)`` (broadcast of one weight matrix over
several activation channels) and for ``fastmodulo(channel_dst, nchannels_y)`` in MUL_MAT_ID.
All arithmetic below is exact uint32 arithmetic, as on the GPU (the ``hi + n`` sum wraps at 2^32 there too).
"""
from __future__ import annotations

import numpy as np

U32 = np.uint64(0xFFFFFFFF)


def init_fastdiv_values(d: int) -> tuple[int, int, int]:
    """(mp, L, d) for a divisor 1 <= d < 2^32, computed on the host."""
    if not 1 <= d <= 0xFFFFFFFF:
        raise ValueError(f"divisor must be in 1..2^32-1, got {d}")
    L = 0
    while L < 32 and (1 << L) < d:
        L += 1
    mp = ((1 << 32) * ((1 << L) - d) // d + 1) & 0xFFFFFFFF
    return mp, L, d


def umulhi(n, mp) -> np.ndarray:
    """``__umulhi``: the high 32 bits of the 64-bit product of two uint32."""
    return (np.asarray(n, np.uint64) * np.uint64(mp)) >> np.uint64(32)


def fastdiv(n, fd: tuple[int, int, int]) -> np.ndarray:
    """``fastdiv``: n / d for uint32 n, with (hi + n) wrapping at 2^32 like the kernel's uint32 add."""
    mp, L, _ = fd
    hi = umulhi(n, mp)
    return (((hi + np.asarray(n, np.uint64)) & U32) >> np.uint64(L)).astype(np.uint32)


def fastmodulo(n, fd: tuple[int, int, int]) -> np.ndarray:
    """``fastmodulo``: n - fastdiv(n) * d."""
    return (np.asarray(n, np.uint64) - fastdiv(n, fd).astype(np.uint64) * np.uint64(fd[2])).astype(np.uint32)
