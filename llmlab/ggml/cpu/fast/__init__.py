"""numba twins of ggml-cpu's kernels: the same bits as the NumPy references, at compiled speed.

Kernels are module-level ``@njit(cache=True)`` functions, so a second process loads them from
numba's cache instead of compiling. Threads: ``LLMLAB_THREADS`` (default: all cores); results
never depend on the count, as ggml's do not.
"""
from __future__ import annotations

import os


def set_threads(n: int | None = None) -> int:
    """Use ``n`` threads (None: ``LLMLAB_THREADS`` or all cores) in the parallel kernels."""
    import numba
    if n is None:
        n = int(os.environ.get("LLMLAB_THREADS", 0) or 0) or numba.config.NUMBA_NUM_THREADS
    if n <= 0:
        raise ValueError(f"the thread count must be positive, not {n}")
    n = min(n, numba.config.NUMBA_NUM_THREADS)
    numba.set_num_threads(n)
    return n
