"""Compatibility: the names ``llmlab.ggml.cpu.kernels`` had before ggml-cpu's numerics were laid out
like ggml-cpu itself. New code imports from the modules that own them:

- ``vec``: vec_dot_f16, v_expf (expf_scalef / expf_bits), v_silu, silu, soft_max_rows, gelu;
- ``sgemm``: mul_mat_f16 (tinyBLAS), mul_mat_f16_op (tinyBLAS or vec_dot_f16 by shape);
- ``quants``: mul_mat (every quantized type through its vec_dot), quantize_activations;
- ``tiled``: mul_mat_k_tiled;  ``repack``: mul_mat_q4_k_repacked;
- ``ops``: mul_mat_quantized (the kernel choice), rope_cache, rotate;
- ``profiles``: lane counts, thresholds and REPACK types per instruction set.

Every function takes ``cpu=`` (a profile, its name, or None for this machine's)."""
from .ops import rope_cache, rotate  # noqa: F401
from .quants import TYPE_TRAITS_CPU
from .quants import mul_mat as mul_mat_q32  # noqa: F401
from .quants import mul_mat as mul_mat_k  # noqa: F401
from .repack import REPACKED_MUL_MAT, mul_mat_q4_k_repacked  # noqa: F401
from .sgemm import mul_mat_f16, mul_mat_f16_op  # noqa: F401
from .tiled import mul_mat_k_tiled
from .vec import soft_max_rows, v_expf, v_silu, vec_dot_f16  # noqa: F401

EXACT_MUL_MAT = {name: mul_mat_q32 for name in TYPE_TRAITS_CPU}
TILED_MUL_MAT = {t: mul_mat_k_tiled for t in ("q2_k", "q3_k", "q4_k", "q5_k", "q6_k")}
TILED_MIN_ROWS = 8
