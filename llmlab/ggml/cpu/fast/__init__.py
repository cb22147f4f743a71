"""numba twins of ggml-cpu's kernels (the ``fast`` kernel set): the same bits as the NumPy
references in ``llmlab.ggml.cpu``, at compiled speed.

Kernels are module-level ``@njit(cache=True)`` functions, so a second process loads them from
numba's cache instead of compiling. Threads: ``LLMLAB_THREADS`` (default: ``config.default_threads``), or
:func:`set_threads`; results never depend on the count (each output is summed by one thread in a
fixed order), as ggml's do not.

Modules mirror ``llmlab.ggml.cpu``'s: ``quantize`` (q8_0, q8_1, q8_K activation quantizers), ``quants``
(vec_dot: the legacy quants q4_0, q4_1, q5_0, q8_0 and q4_K, q6_K), ``tiled`` (q4_K, q6_K), ``repack``
(q4_K gemv/gemm), ``dot4`` (the same products by byte dot products: AVX512-VNNI or AVX2, where the host
has them), ``twins`` (the one table: reference -> fast kernels and packers), ``dispatch`` (kernels for
the reference's path, packed-weight cache; entry point :func:`mul_mat_quantized`), ``vec`` (f16 dot products and tinyBLAS, expf, SwiGLU,
softmax), ``ops`` (RMS norm, RoPE). ``llmlab.ggml.cpu.cplan`` binds them to a graph's nodes.
"""
from ._common import set_threads, thread_count, threads, use_threads
from .dispatch import bind, clear_cache, mul_mat_quantized, packed_nbytes, supports

__all__ = ["mul_mat_quantized", "bind", "supports", "packed_nbytes", "clear_cache",
           "set_threads", "thread_count", "threads", "use_threads"]
