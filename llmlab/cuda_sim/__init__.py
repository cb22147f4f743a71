"""llama.cpp's CUDA decode kernel ``mul_mat_vec_q`` (MMVQ), simulated exactly on the CPU.

During decoding every weight matrix meets one activation vector (or a handful): memory-bound work.
ggml-cuda quantizes the activations to q8_1, and each GPU thread multiplies a few packed bytes of
weights with a few packed bytes of activations using ``dp4a``, a four-way int8 dot product.

=============  =================================================================
``dp4a``       dp4a, byte-wise helpers, aligned loads from a flat device :class:`Memory`
``q8_1``       ``quantize_q8_1`` of quantize.cu (one warp per block of 32)
``vecdotq``    ``vec_dot_<type>_q8_1`` of vecdotq.cuh and the type traits (qk, qi, vdr)
``launch``     ``should_use_mmvq``, ``calc_nwarps``, ``calc_rows_per_block``, small_k, ``launch_params``
``mmvq``       the whole-grid simulator (``simulate``), ``mul_mat_vec_q``, the float64 ``reference``
``launch``     also: ``mul_mat_kernel`` (MMVF -> MMF -> MMVQ -> MMQ -> cuBLAS), MUL_MAT_ID limits and
               ``moe_launch_params``, ``launch_bounds``
``fastdiv``    division by a launch constant with a multiply-high and a shift
``load``       the pinned-buffer upload ring, padding behind quantized tensors, load-time requantization
=============  =================================================================

What is exact: every integer (codes, dp4a sums, which thread reads which byte) and the q8_1 bytes.
Floats are float32 in the kernel's order of operations, with IEEE division and without fused
multiply-adds; a real build uses ``-use_fast_math`` (approximate ``x / d``) and lets nvcc fuse
multiply-adds, so a GPU may differ from the simulation in the last bits (and, for an activation sitting
within 2 ulp of a rounding boundary, in one q8_1 code). Source: the llama.cpp that llama-cpp-python
0.3.36 vendors; NVIDIA parameter tables only.

>>> import numpy as np, llmlab.cuda_sim as cs
>>> int(cs.dp4a(0x01020304, 0x01010101, 10))
20
>>> cs.launch_params("q4_K", 4096, 4096)["threads"]
524288
"""
from .dp4a import Memory, dp4a, get_int_b2, get_int_b4, vsub4, vsubss4
from . import fastdiv, launch, load
from .launch import (ARCHS, blocks_per_iter, calc_nwarps, calc_rows_per_block, launch_bounds, launch_params, mmid_max_batch,
                     moe_launch_params, mul_mat_kernel, should_use_mmq, should_use_mmvq, small_k)
from .mmvq import Launch, mul_mat_vec_q, reference, simulate
from .q8_1 import MATRIX_ROW_PADDING, quantize_q8_1
from .vecdotq import (CUDA_TYPES, cuda_type, vec_dot_q4_0_q8_1, vec_dot_q4_1_q8_1, vec_dot_q4_K_q8_1, vec_dot_q5_0_q8_1,
                      vec_dot_q6_K_q8_1, vec_dot_q8_0_q8_1)

__all__ = ["dp4a", "vsub4", "vsubss4", "get_int_b2", "get_int_b4", "Memory", "quantize_q8_1", "MATRIX_ROW_PADDING",
           "vec_dot_q4_0_q8_1", "vec_dot_q4_1_q8_1", "vec_dot_q5_0_q8_1", "vec_dot_q8_0_q8_1", "vec_dot_q4_K_q8_1",
           "vec_dot_q6_K_q8_1", "CUDA_TYPES", "cuda_type", "ARCHS", "should_use_mmvq", "calc_nwarps",
           "calc_rows_per_block", "blocks_per_iter", "small_k", "launch_params", "mul_mat_kernel", "should_use_mmq",
           "mmid_max_batch", "moe_launch_params", "launch_bounds", "fastdiv", "launch", "load", "simulate", "Launch",
           "mul_mat_vec_q", "reference"]
