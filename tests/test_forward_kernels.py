"""The matrix-product kernels a forward pass meets, against the real ggml-cpu op (ggml_mul_mat run by
ggml_graph_compute_with_ctx, so ggml itself picks the kernel for each shape)."""
from __future__ import annotations

import zlib

import numpy as np
import pytest

from conftest import LIVE
from llmlab.ggml.cpu.ops import mul_mat_quantized
from llmlab.ggml.cpu.quants import mul_mat as mul_mat_vec_dot
from llmlab.ggml.cpu.sgemm import mul_mat_f16, mul_mat_f16_op
from llmlab.ggml.types import ggml_type

pytest.importorskip("llama_cpp", reason="llama-cpp-python is not installed (optional oracle)")
import ggml_ref  # noqa: E402  (tests/ggml_ref.py: ctypes bridge to the real ggml)
pytestmark = pytest.mark.llamacpp_exact
CPU = LIVE.profile

K_QUANTS = ["q2_k", "q3_k", "q4_k", "q5_k", "q6_k"]


def _weights(rng, R, n, name):
    w = (rng.standard_normal((R, n)) * rng.uniform(0.1, 3, (R, 1))).astype(np.float32)
    return ggml_ref.quantize_chunk(w, name).reshape(R, -1)


@pytest.mark.parametrize("name", K_QUANTS)
@pytest.mark.parametrize("R,n,T", [(24, 512, 3), (40, 512, 8), (20, 1024, 9), (36, 768, 17)])
def test_k_quant_mul_mat_is_ggml_cpu_bit_for_bit(name, R, n, T):
    """Below 8 activation rows ggml-cpu runs vec_dot per output; from 8 on, a K-quant weight that is
    not repacked goes through the tiled kernels (one float step per super-block)."""
    rng = np.random.default_rng(zlib.crc32(repr((name, R, n, T)).encode()))   # hash() of a str changes per process
    raw = _weights(rng, R, n, name)
    x = (rng.standard_normal((T, n)) * 2).astype(np.float32)
    want = ggml_ref.mul_mat(raw, name, x)
    got = mul_mat_quantized(raw, ggml_type(name), x, repacked=False, cpu=CPU)
    np.testing.assert_array_equal(got, want)


def test_tiled_kernel_is_needed_from_8_rows():
    """The vec_dot order does not reproduce the tiled kernel (the test above could not pass without it)."""
    rng = np.random.default_rng(7)
    raw = _weights(rng, 64, 2048, "q6_k")
    x = (rng.standard_normal((CPU.tiled_min_batch, 2048)) * 2).astype(np.float32)
    want = ggml_ref.mul_mat(raw, "q6_k", x)
    assert (mul_mat_vec_dot(raw, ggml_type("q6_k"), x, CPU) != want).any()


@pytest.mark.parametrize("T", [1, 2, 5])
def test_f16_mul_mat_is_ggml_cpu_bit_for_bit(T):
    """f16 weights (the KV cache in KQ and KQV): tinyBLAS from 2 rows on, ggml_vec_dot_f16 for one row."""
    rng = np.random.default_rng(T)
    A = (rng.standard_normal((48, 256)) * 0.5).astype(np.float16)
    x = rng.standard_normal((T, 256)).astype(np.float32)
    want = ggml_ref.mul_mat(A.view(np.uint8), "f16", x)
    got = mul_mat_f16_op(A, x.astype(np.float16), CPU)
    np.testing.assert_array_equal(got, want)
    if T == 1:                                   # tinyBLAS's order would not do for one row
        assert (mul_mat_f16(A, x.astype(np.float16), CPU) != want).any()
