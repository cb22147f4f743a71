"""Everything cuda_sim borrows from the rest of llmlab, in one place.

The block layouts (ggml-common.h's structs as numpy dtypes), the type table and the reference
dequantizer are llmlab.ggml.quant's: the simulator reads the same bytes, so a simulated launch can
be checked against them.
"""
from llmlab.ggml.quant.core import dequantize, fp16, roundf  # noqa: F401
from llmlab.ggml.quant.k_quants import BLOCK_Q4_K, BLOCK_Q6_K, q4k_codes, q6k_codes, scale_min_k4  # noqa: F401
from llmlab.ggml.quant.legacy import BLOCK_Q4_0, BLOCK_Q4_1, BLOCK_Q5_0, BLOCK_Q8_0, BLOCK_Q8_1  # noqa: F401
from llmlab.ggml.types import QK_K, ggml_type  # noqa: F401
