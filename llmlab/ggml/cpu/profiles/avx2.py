"""AVX2 + FMA + F16C without AVX-512: Intel's consumer CPUs since Alder Lake, AMD before Zen 4.

Everything ggml-cpu vectorizes runs in 256-bit registers of 8 floats: f16 vec_dot takes 32 elements
a step and reduces with two ``_mm_hadd_ps`` (neighbouring lanes first), tinyBLAS takes 8 lanes and
``hsum``, softmax and SiLU use the AVX2 ``ggml_v_expf`` (2^n built from the exponent bits, the result
``k + k*j`` fused), and q2_K stays out of the REPACK buffer (its repacked kernel needs AVX-512)."""
from ..simd import hadd_tree, halves
from . import CPUProfile

PROFILE = CPUProfile(
    name="avx2",
    title="x86-64 with AVX2, FMA and F16C, no AVX-512 (8 float lanes)",
    requires=frozenset({"avx2", "fma", "f16c"}),
    system_info={"AVX2": "1", "AVX512": "0"},
    f32_lanes=8,
    f32_arr=4,
    f32_tail_vectors=(8, 4),               # GCC: ymm products while 8 are left, then one xmm of 4
    vec_reduce_tree=hadd_tree(8),             # GGML_F32x8_REDUCE: extract + add, then hadd, hadd
    hsum_tree=halves(8),                      # softmax: extract + add, movehl + add, movehdup + add_ss
    expf="bits",
    sgemm_lanes=8,
    sgemm_hsum_tree=halves(8),
    sgemm_min_batch=2,
    sgemm_row_multiple=4,
    sgemm_tiles=(4, 3),                      # VECTOR_REGISTERS 16
    quant_hsum_tree=halves(8),
    tiled_min_batch=8,
    tiled_types=frozenset({"q2_k", "q3_k", "q4_k", "q5_k", "q6_k"}),
    repack_types=frozenset({"q4_0", "q4_k", "iq4_nl", "mxfp4"}),
    repack_row_multiple=8,
    repack_layouts={'q4_0': 'q4_0_8x8', 'q4_k': 'q4_K_8x8', 'iq4_nl': 'iq4_nl_8x8', 'mxfp4': 'mxfp4_8x8'},
    notes=("8-lane f16 dot products (vec_dot_f16: 4 registers x 8 lanes, 32 elements a step, hadd reduction)",
           "tinyBLAS f16 in 8 lanes, summed by hsum (extract, movehl, movehdup)",
           "expf from the exponent bits: k = 2^n, result fma(k, j, k)",
           "q2_K weights stay in the plain buffer (tiled or vec_dot kernels)"),
)
