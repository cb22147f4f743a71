"""Quantization block formats, bit-exact with ggml.

Importing this package fills :data:`llmlab.ggml.types.TYPES` the way ggml.c fills
``type_traits[]``: every type gets its block layout (``GGMLType.layout``), its
dequantizer (``to_float``) and, where ggml has one, its reference quantizer
(``from_float``). One module per family, like ggml-quants.c's sections:

========== ===================================================
floats     f32, f16, bf16
legacy     q4_0 q4_1 q5_0 q5_1 q8_0 q8_1 (one scale per 32), q1_0
k_quants   q2_k q3_k q4_k q5_k q6_k q8_k (super-blocks of 256)
iq         iq1_s iq1_m iq2_xxs iq2_xs iq2_s iq3_xxs iq3_s iq4_nl iq4_xs
ternary    tq1_0 tq2_0
fp4        mxfp4 nvfp4
========== ===================================================

>>> import numpy as np, llmlab.ggml.quant as Q
>>> raw = Q.quantize(np.linspace(-1, 1, 32, dtype=np.float32), "q8_0")
>>> raw.size, float(abs(Q.dequantize(raw, "q8_0") - np.linspace(-1, 1, 32)).max()) < 0.01
(34, True)
"""
from __future__ import annotations

from . import floats, legacy, k_quants, iq, ternary, fp4  # noqa: F401  (registration)
from .core import QuantError, dequantize, quantize, register

__all__ = ["dequantize", "quantize", "register", "QuantError"]
