"""ggml-cpu's numerics reproduced bit for bit, checked against the real ggml in llama-cpp-python
(the detected CPU profile: run ``make test-avx2`` for the AVX2 build on an AVX-512 machine)."""
from __future__ import annotations

import numpy as np
import pytest

llama_cpp = pytest.importorskip("llama_cpp", reason="llama-cpp-python is not installed (optional oracle)")
import ggml_ref  # noqa: E402  (tests/ggml_ref.py: ctypes bridge to ggml)

from conftest import LIVE  # noqa: E402
from llmlab.ggml.cpu.ops import mul_mat_quantized  # noqa: E402
from llmlab.ggml.cpu.sgemm import mul_mat_f16, mul_mat_f16_op  # noqa: E402
from llmlab.ggml.cpu.vec import gelu_table, soft_max_rows, v_expf, vec_dot_f16, vec_dot_f32  # noqa: E402
from llmlab.ggml.types import ggml_type  # noqa: E402

pytestmark = pytest.mark.llamacpp_exact
CPU = LIVE.profile


@pytest.mark.parametrize("qtype,n", [("q4_0", 96), ("q4_1", 96), ("q5_0", 96), ("q8_0", 96), ("q4_k", 512), ("q6_k", 512)])
def test_quantized_dot_products_equal_ggml_vec_dot(qtype, n):
    rng = np.random.default_rng(3)
    W = rng.standard_normal((24, n)).astype(np.float32)
    raw = ggml_ref.quantize_chunk(W, qtype).reshape(24, -1)
    x = (rng.standard_normal((3, n)) * 2).astype(np.float32)
    got = mul_mat_quantized(raw, ggml_type(qtype), x, cpu=CPU)
    want = np.array([[ggml_ref.vec_dot(raw[r], qtype, x[t]) for r in range(24)] for t in range(3)], np.float32)
    np.testing.assert_array_equal(got, want)


def test_gelu_table_equals_ggml_table():
    import ctypes as C
    _, cpu = ggml_ref.libs()
    tab = np.ctypeslib.as_array((C.c_uint16 * 65536).in_dll(cpu, "ggml_table_gelu_f16")).copy()   # exported by 0.3.36
    mine = gelu_table().view(np.uint16)
    finite = np.isfinite(np.arange(65536, dtype=np.uint16).view(np.float16))
    np.testing.assert_array_equal(mine[finite], tab[finite])


@pytest.mark.parametrize("cpu", ["avx512", "avx2"])
def test_exp_and_softmax_are_accurate(cpu):
    x = np.linspace(-80, 0, 100001, dtype=np.float32)
    e = v_expf(x, cpu)
    np.testing.assert_allclose(e, np.exp(x.astype(np.float64)), rtol=4e-7)
    w = np.random.default_rng(0).standard_normal((5, 67)).astype(np.float32)
    p = soft_max_rows(w, cpu)
    want = np.exp(w - w.max(-1, keepdims=True))
    np.testing.assert_allclose(p, want / want.sum(-1, keepdims=True), rtol=1e-6)


@pytest.mark.parametrize("cpu", ["avx512", "avx2"])
def test_f16_products_in_the_profiles_lanes(cpu):
    rng = np.random.default_rng(1)
    A = rng.standard_normal((7, 64)).astype(np.float16)
    B = rng.standard_normal((3, 64)).astype(np.float16)
    got = mul_mat_f16(A, B, cpu)
    np.testing.assert_allclose(got, B.astype(np.float64) @ A.astype(np.float64).T, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("n", [64, 256, 96, 40, 100])
def test_vec_dot_f16_equals_ggml(n):
    rng = np.random.default_rng(n)
    W = rng.standard_normal((16, n)).astype(np.float16)
    x = rng.standard_normal(n).astype(np.float32)
    want = np.array([ggml_ref.vec_dot(W[r].view(np.uint8), "f16", x) for r in range(16)], np.float32)
    got = vec_dot_f16(W.astype(np.float32), x.astype(np.float16).astype(np.float32)[None], CPU)
    np.testing.assert_array_equal(got, want)



def test_vec_dot_f32_equals_ggml_for_every_leftover_length():
    """ggml_vec_dot_f32 at every n up to two register steps and a few more: its leftover loop (n % GGML_F32_STEP
    elements) is what the compiler made of ``sumf += x[i]*y[i]`` (vector products added in order, fmas for
    the rest: the profile's ``f32_tail_vectors``), so every leftover length must equal this build's."""
    rng = np.random.default_rng(7)
    step = CPU.f32_lanes * CPU.f32_arr
    for n in [*range(1, 2 * step + 1), 3 * step + 13, 3 * step + 29]:
        W = rng.standard_normal((8, n)).astype(np.float32)
        x = rng.standard_normal(n).astype(np.float32)
        want = np.array([ggml_ref.vec_dot(W[r].view(np.uint8), "f32", x) for r in range(8)], np.float32)
        got = vec_dot_f32(x[None], W, CPU)
        assert np.array_equal(got.view(np.uint32), want.view(np.uint32)), f"n = {n}"


@pytest.mark.parametrize("T,R,K", [(1, 16, 256), (1, 12, 64), (2, 16, 64), (5, 8, 256), (3, 7, 64), (3, 8, 40),
                                   (4, 8, 24)])
def test_f16_mul_mat_takes_ggml_cpus_kernel(T, R, K):
    """ggml's whole MUL_MAT op on an f16 weight: tinyBLAS from 2 activation rows on (K a multiple of its
    lanes, 16 or 8, R % 4 == 0), otherwise ggml_vec_dot_f16 per output (a one-token decode's KQ and KQV)."""
    rng = np.random.default_rng(T * 1000 + R * 10 + K)
    A = rng.standard_normal((R, K)).astype(np.float16)
    x = rng.standard_normal((T, K)).astype(np.float32)
    want = ggml_ref.mul_mat(A.view(np.uint8), "f16", x)
    np.testing.assert_array_equal(mul_mat_f16_op(A, x.astype(np.float16), CPU), want)


@pytest.mark.parametrize("n", [64, 67, 8, 13, 200])
def test_soft_max_equals_ggml(n):
    """ggml_vec_soft_max_f32: v_expf in register-wide blocks, the tail through libm's expf."""
    rng = np.random.default_rng(n)
    w = (rng.standard_normal((6, n)) * 4).astype(np.float32)
    w[0, : n // 3] = -np.inf                               # masked cells
    np.testing.assert_array_equal(soft_max_rows(w, CPU), ggml_ref.unary("soft_max", w))


@pytest.mark.parametrize("n", [64, 67, 13, 1536])
def test_silu_equals_ggml(n):
    """ggml_vec_silu_f32: v_silu in register-wide blocks, the tail in scalar code; wide inputs reach
    the expf variants' slow paths (|n| > 126) and saturation."""
    from llmlab.ggml.cpu.vec import silu
    rng = np.random.default_rng(n)
    x = (rng.standard_normal((4, n)) * np.array([[1], [10], [60], [150]])).astype(np.float32)
    np.testing.assert_array_equal(silu(x, CPU), ggml_ref.unary("silu", x))
