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
- ``repack``     repack.cpp: q4_K's interleaved gemv/gemm, and a teaching REPACK plug-in
- ``ops``        ops.cpp: every op's reference, MUL_MAT's kernel choice (``mul_mat_quantized``),
                 norms, RoPE (``rope_cache``, ``rotate``), flash attention
- ``libm``       the C library's expf/cosf/sinf/tanhf/powf, where ggml's scalar code calls them
- ``threads``, ``float_path``  the execution model across threads; other arithmetic for comparison
"""
