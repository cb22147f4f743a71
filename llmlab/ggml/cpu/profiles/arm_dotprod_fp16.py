"""ARMv8.2-A with DOTPROD and FP16 vector arithmetic (``GGML_CPU_ARM_ARCH=armv8.2-a+dotprod+fp16``):
Apple M1, AWS Graviton2, Raspberry Pi 5. llama.cpp reports ``NEON ARM_FMA FP16_VA DOTPROD LLAMAFILE REPACK``.

A third arithmetic, next to the two x86 ones. Float registers hold 4 lanes (GGML_F32_EPR 4) and every
horizontal sum is ``vaddvq_f32``, two pairwise ``faddp``: neighbours first. With FP16 vector
arithmetic, ``ggml_vec_dot_f16`` and tinyBLAS's f16 kernel *accumulate in half precision*
(``vfmaq_f16`` on float16x8_t), so attention scores are sums rounded to 11 bits at every step. The
quantized dot products are arch/arm/quants.c's: two blocks a step, ``vdotq_s32`` lanes of 4 products,
an even-block and an odd-block accumulator (``vmlaq_n_f32``, not fused), ``vaddvq_f32`` of each;
the activations are quantized with ``id = 1/d`` and ``vcvtnq_s32_f32`` (ties to even). REPACK takes
q8_0 (4x4) besides q4_0 (4x4) and the K-quants (8x4); there is no tiled K-quant matmul (x86 only).
``ggml_v_expf`` is the same polynomial as AVX2's (2^n from the exponent bits, ``fma(k, j, k)``)."""
from ..simd import hadd_tree, pairwise
from . import CPUProfile

PROFILE = CPUProfile(
    name="arm_dotprod_fp16",
    title="AArch64 NEON with DOTPROD and FP16 vector arithmetic (armv8.2-a+dotprod+fp16, 4 float lanes)",
    requires=frozenset({"asimd", "asimddp", "asimdhp"}),
    system_info={"NEON": "1", "DOTPROD": "1", "FP16_VA": "1", "MATMUL_INT8": "0"},
    f32_lanes=4,                              # GGML_F32_EPR 4, GGML_F32_STEP 16
    f32_arr=4,
    vec_reduce_tree=pairwise(4),              # vaddvq_f32: faddp, faddp
    hsum_tree=pairwise(4),
    expf="bits",
    sgemm_lanes=8,                            # tinyBLAS<8, float16x8_t, ...>
    sgemm_hsum_tree=hadd_tree(8),             # hsum(float16x8_t): low half + high half, then vaddvq_f32
    sgemm_min_batch=8,                        # "if (n < 8) return false" on FP16_VA
    sgemm_row_multiple=4,
    sgemm_tiles=(4, 6),                       # VECTOR_REGISTERS 32
    quant_hsum_tree=pairwise(4),              # vaddvq_f32 of each accumulator
    tiled_min_batch=8,
    tiled_types=frozenset(),                  # tiled/ is compiled for x86 only
    repack_types=frozenset({"q4_0", "q4_k", "q5_k", "q6_k", "iq4_nl", "mxfp4", "q8_0"}),
    repack_row_multiple=4,
    repack_layouts={"q4_0": "q4_0_4x4", "q4_k": "q4_K_8x4", "q5_k": "q5_K_8x4", "q6_k": "q6_K_8x4",
                    "iq4_nl": "iq4_nl_4x4", "mxfp4": "mxfp4_4x4", "q8_0": "q8_0_4x4"},
    notes=("ggml_vec_dot_f16 accumulates in float16 (vfmaq_f16, 4 registers x 8 halves, 32 elements a step)",
           "every horizontal sum is vaddvq_f32: pairwise, neighbours first",
           "quantized vec_dot: two blocks a step, vdotq_s32 lanes, even and odd accumulators, mul then add",
           "q8_0/q8_1 activations: id = 1/d, rounded to nearest even (vcvtnq_s32_f32)",
           "q8_0 weights go to the REPACK buffer (4x4); no tiled K-quant matmul"),
    f16_lanes=8,                              # GGML_F16_EPR 8, GGML_F16_STEP 32
    f16_arr=4,
    f16_acc="f16",
    f16_reduce_tree=hadd_tree(8),             # GGML_F16x8_REDUCE: low + high halves as float32, then faddp
    sgemm_acc="f16",
    rope_vec_pairs=4,                         # GCC vectorizes NORM's rotate_pairs: y0 = fma(-x1, sin, x0*cos)
    rope_vec_min_pairs=7,
    arch="aarch64",
    build="armv8.2-a+dotprod+fp16",
    quant_kernels="neon",
)
