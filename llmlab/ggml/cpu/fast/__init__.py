"""numba twins of ggml-cpu's exact quantized kernels (the ``fast`` kernel set).

Every function here returns the same bits as its NumPy reference in ``llmlab.ggml.cpu.kernels`` /
``llmlab.ggml.cpu.quants``; they differ only in speed. Entry point: :func:`mul_mat_quantized`
(same contract as ``llmlab.ggml.cpu.ops.mul_mat_quantized``). Threads: ``LLMLAB_THREADS`` (default all
cores), or :func:`set_threads`; results do not depend on the count (each output row is summed by one
thread in a fixed order).

Modules: ``quantize`` (q8_0, q8_1, q8_K activation quantizers), ``q32`` (q4_0, q4_1, q5_0, q8_0),
``kquants`` (q4_K, q6_K: vec_dot, tiled, REPACK gemv/gemm), ``dispatch`` (path choice, packed-weight cache).
"""
from ._common import set_threads, thread_count
from .dispatch import clear_cache, mul_mat_quantized, packed_nbytes, path_of, supports

__all__ = ["mul_mat_quantized", "path_of", "supports", "packed_nbytes", "clear_cache", "set_threads", "thread_count"]
