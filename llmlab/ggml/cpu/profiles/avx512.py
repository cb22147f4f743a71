"""AVX-512 (AVX512F/BW/DQ/VL, VNNI): a native llama.cpp build on a CPU with AVX-512.

ggml-cpu takes its 512-bit paths where it has them (f16 vec_dot, llamafile tinyBLAS, softmax and
SiLU with the ``_mm512_scalef_ps`` expf, q2_K in the REPACK buffer) and the AVX2 kernels elsewhere
(every quantized vec_dot, the K-quant REPACK q4_K kernels' float steps, the tiled K-quant matmul)."""
from ..simd import halves
from . import CPUProfile

PROFILE = CPUProfile(
    name="avx512",
    title="x86-64 with AVX-512 (16 float lanes)",
    requires=frozenset({"avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512dq", "avx512vl"}),
    system_info={"AVX2": "1", "AVX512": "1"},
    f32_lanes=16,
    f32_arr=4,
    # GCC 12 -march=native on Zen 4 (znver3 tuning): zmm, then one ymm; Intel's AVX-512 tunings prefer 256 bits,
    # (8, 4), which differs only where n % 8 >= 4
    f32_tail_vectors=(16, 8),
    vec_reduce_tree=halves(16),               # _mm512_reduce_add_ps as GCC expands it
    hsum_tree=halves(16),
    expf="scalef",
    sgemm_lanes=16,
    sgemm_hsum_tree=halves(16),
    sgemm_min_batch=2,
    sgemm_row_multiple=4,
    sgemm_tiles=(4, 6),                      # VECTOR_REGISTERS 32
    quant_hsum_tree=halves(8),
    tiled_min_batch=8,
    tiled_types=frozenset({"q2_k", "q3_k", "q4_k", "q5_k", "q6_k"}),
    repack_types=frozenset({"q4_0", "q4_k", "q2_k", "iq4_nl", "mxfp4"}),
    repack_row_multiple=8,
    repack_layouts={'q4_0': 'q4_0_8x8', 'q4_k': 'q4_K_8x8', 'q2_k': 'q2_K_8x8', 'iq4_nl': 'iq4_nl_8x8', 'mxfp4': 'mxfp4_8x8'},
    notes=("16-lane f16 dot products (vec_dot_f16: 4 registers x 16 lanes, 64 elements a step)",
           "tinyBLAS f16 in 16 lanes, summed by _mm512_reduce_add_ps",
           "expf through _mm512_scalef_ps: j = poly(b) with 1 folded in, result j * 2^n",
           "q2_K weights go to the REPACK buffer"),
)
