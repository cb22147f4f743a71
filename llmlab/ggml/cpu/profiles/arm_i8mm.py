"""ARMv8.6-A with DOTPROD, FP16 vector arithmetic and the int8 matrix multiply (``GGML_CPU_ARM_ARCH=
armv8.6-a+dotprod+i8mm+fp16``): Apple M2 and later, AWS Graviton3. llama.cpp reports ``NEON ARM_FMA
FP16_VA MATMUL_INT8 DOTPROD REPACK``: no LLAMAFILE, ggml-cpu.c turns tinyBLAS off with MATMUL_INT8.

Everything of ``arm_dotprod_fp16`` holds, except:

- no tinyBLAS: every f16 product (KQ, KQV) is ``ggml_vec_dot_f16``, half-precision accumulators
  whatever the batch;
- q4_0, q4_1, q8_0, q4_K and q6_K set ``.nrows = 2``: where both the weight's and the activations' row
  counts are even, one ``vmmlaq_s32`` call forms 2x2 outputs, with one accumulator per output instead
  of NEON's even and odd blocks (a prompt of 16 tokens and one of 17 take different kernels);
- REPACK: q4_0 and q8_0 as 4x8, the K-quants as 8x8, each with its own float steps. q4_K's gemv adds
  every 32 values' scaled integer dot with its own fma, its gemm (vmmlaq_s32 tiles) the whole
  super-block's at once after the mins, unfused; q6_K multiplies then adds once per super-block in
  both (8x4 fuses its gemv).

llmlab reproduces the paths SmolLM2 and Gemma 3 take: q4_1 both ways, q5_0 (one row at a time), q8_0
as 4x8, q4_K and q6_K as 8x8 (``repack_gemm``). The other i8mm kernels (among them q4_0 and q5_K in
the REPACK buffer, and the 2x2 mmla steps of q4_0, q8_0, q4_K and q6_K weights left out of it) are not
written yet and run a float stand-in on this profile."""
from ..simd import hadd_tree, pairwise
from . import CPUProfile

PROFILE = CPUProfile(
    name="arm_i8mm",
    title="AArch64 NEON with DOTPROD, FP16 and I8MM (armv8.6-a+dotprod+i8mm+fp16, no tinyBLAS)",
    requires=frozenset({"asimd", "asimddp", "asimdhp", "i8mm"}),
    system_info={"NEON": "1", "DOTPROD": "1", "FP16_VA": "1", "MATMUL_INT8": "1"},
    f32_lanes=4,
    f32_arr=4,
    vec_reduce_tree=pairwise(4),
    hsum_tree=pairwise(4),
    expf="bits",
    sgemm_lanes=8,
    sgemm_hsum_tree=hadd_tree(8),
    sgemm_min_batch=8,
    sgemm_row_multiple=4,
    sgemm_tiles=(4, 6),
    quant_hsum_tree=pairwise(4),
    tiled_min_batch=8,
    tiled_types=frozenset(),
    repack_types=frozenset({"q4_0", "q4_k", "q5_k", "q6_k", "iq4_nl", "mxfp4", "q8_0"}),
    repack_row_multiple=4,
    repack_layouts={"q4_0": "q4_0_4x8", "q4_k": "q4_K_8x8_i8mm", "q5_k": "q5_K_8x8_i8mm", "q6_k": "q6_K_8x8_i8mm",
                    "iq4_nl": "iq4_nl_4x4", "mxfp4": "mxfp4_4x4", "q8_0": "q8_0_4x8"},
    notes=("no tinyBLAS (MATMUL_INT8 undefines GGML_USE_LLAMAFILE): f16 products accumulate in float16 always",
           "q4_1 x q8_1 by 2x2 vmmlaq_s32 tiles when both row counts are even: one accumulator per output",
           "q8_0 weights repacked 4x8, multiplied with one fma per block",
           "q4_K and q6_K repacked 8x8: gemm (vmmlaq_s32) with one unfused float step per super-block"),
    f16_lanes=8,
    f16_arr=4,
    f16_acc="f16",
    f16_reduce_tree=hadd_tree(8),
    sgemm_acc="f16",
    rope_vec_pairs=4,
    rope_vec_min_pairs=7,
    arch="aarch64",
    build="armv8.6-a+dotprod+i8mm+fp16",
    llamafile=False,
    vec_dot_nrows=frozenset({"q4_0", "q4_1", "q8_0", "q4_k", "q6_k"}),
    quant_kernels="neon_i8mm",
)
