"""The inputs and the comparison the fast kernels' tests share (test_fast_kernels, test_fast_arm): random
activations with the edge cases the quantizers must meet, random quantized rows, equality to the bit."""
from __future__ import annotations

import numpy as np

from llmlab.ggml.quant.core import random_blocks
from llmlab.ggml.types import ggml_type


def same_bits(a, b) -> bool:
    a, b = np.asarray(a, np.float32), np.asarray(b, np.float32)
    return a.shape == b.shape and np.array_equal(a.view(np.uint32), b.view(np.uint32))


def acts(T: int, K: int, seed: int = 0) -> np.ndarray:
    """(T, K) float32 activations of varied scale per row, with an all-zero block (amax = 0) and a
    negative extreme."""
    rng = np.random.default_rng(seed)
    x = (rng.standard_normal((T, K)) * rng.uniform(0.01, 20, (T, 1))).astype(np.float32)
    x[0, :32] = 0
    x[-1, 40] = -np.abs(x[-1, 32:64]).max() * 2
    return x


def raw_rows(tname: str, R: int, K: int, seed: int = 1) -> np.ndarray:
    """R rows of K values of type tname, as the file stores them (R, row bytes)."""
    return random_blocks(tname, R * K // ggml_type(tname).block_size, seed=seed).reshape(R, -1)
