"""ggml-cpu, the CPU backend, laid out like ggml-cpu itself; every function takes the CPU profile
(``cpu=``: a ``profiles.CPUProfile``, its name, or None for this machine's llama.cpp):

- ``profiles/``  one file per instruction set (``avx512``, ``avx2``): lane counts, reduction trees,
                 tinyBLAS/tiled thresholds, REPACK types, which expf; detection and ``LLMLAB_CPU``
- ``simd``       simd-mappings.h: fused multiply-add, reduction trees as data
- ``vec``        vec.cpp / vec.h: ggml_vec_dot_f16, ggml_v_expf (two variants), SiLU, softmax, GELU
- ``quants``     quants.c + arch/x86/quants.c: activation quantizers (q8_0/q8_1/q8_K), vec_dot per
                 type, ``type_traits_cpu``, ``mul_mat`` through vec_dot
- ``sgemm``      llamafile/sgemm.cpp: tinyBLAS for f16 (the KV cache), when it takes a shape
- ``tiled``      tiled/: the K-quant matmul from 8 activation rows
- ``repack_gemm`` repack.cpp, arch/{x86,arm}/repack.cpp: the interleaved gemv/gemm (q4_K on x86; q8_0,
                 q4_K and q6_K on ARM, dotprod and i8mm)
- ``traits``     traits.h: the extra buffer type interface (plug-ins asked before the op switch)
- ``repack``     the K-quants' 8x8 layouts (make_block_q4_Kx8, ...) and a teaching REPACK plug-in
- ``ops``        ops.cpp: every op's reference, MUL_MAT's kernel choice (``mul_mat_quantized``),
                 norms, RoPE (``rope_cache``, ``rotate``), flash attention
- ``executor``   ggml_graph_compute on the references, node by node, with llama.cpp's ``cb_eval`` hooks
- ``cplan``      ggml_graph_plan: a graph bound once to the numba twins (``fast/``) and its arena
- ``libm``       the C library's expf/cosf/sinf/tanhf/powf, where ggml's scalar code calls them
- ``threads``, ``float_path``  the execution model across threads; other arithmetic for comparison
"""
