"""Against llama.cpp's own ggml (the libraries inside llama-cpp-python): quantizers byte for byte,
dequantizers bit for bit, ggml-cpu's activation quantizers and dot products."""
from __future__ import annotations

import os

import numpy as np
import pytest

pytest.importorskip("llama_cpp", reason="llama-cpp-python is not installed (optional oracle)")
from hypothesis import given, settings, strategies as st  # noqa: E402
from hypothesis.extra.numpy import arrays  # noqa: E402

import llmlab.ggml.quant as Q  # noqa: E402
from llmlab.ggml.cpu import quants as C  # noqa: E402
from llmlab.ggml.quant import checklist  # noqa: E402
from llmlab.ggml.cpu.quants import TYPE_TRAITS_CPU  # noqa: E402
from llmlab.ggml.types import TYPES, ggml_type  # noqa: E402

from ggml_ref import activation_quantize, quantize_chunk, quantize_row_ref, to_float, vec_dot  # noqa: E402
from test_quant import random_blocks, sample_data  # noqa: E402

CHUNK_TYPES = [t.name for t in TYPES.values() if t.from_float is not None and t.name not in ("q8_1", "q8_k", "f32")]
# q8_1 is an activation type: ggml-base has no to_float for it (test_ggml_has_no_to_float_for_q8_1)
DEQUANT_TYPES = [t.name for t in TYPES.values() if not t.removed and t.to_float is not None
                 and t.name not in ("f32", "f16", "bf16", "q8_k", "q8_1")]


@pytest.mark.parametrize("name", CHUNK_TYPES)
def test_quantize_matches_llama_cpp(name):
    t = ggml_type(name)
    x = sample_data(t.block_size, rows=64, seed=5)
    assert np.array_equal(Q.quantize(x, name), quantize_chunk(x, name))


@pytest.mark.parametrize("name", ["q8_1", "q8_k"])
def test_partner_reference_quantizers_match_llama_cpp(name):
    t = ggml_type(name)
    x = sample_data(t.block_size, rows=16, seed=6)
    assert np.array_equal(Q.quantize(x, name), quantize_row_ref(x, name))


@pytest.mark.parametrize("name", DEQUANT_TYPES)
def test_dequantize_matches_llama_cpp(name):
    t = ggml_type(name)
    raw = random_blocks(t, 200, 7)
    assert checklist.same_bits(Q.dequantize(raw, name), to_float(raw, name))


def test_ggml_has_no_to_float_for_q8_1():
    """Why DEQUANT_TYPES leaves q8_1 out (llmlab dequantizes it all the same: test_quant)."""
    with pytest.raises(NotImplementedError, match="no to_float for q8_1"):
        to_float(random_blocks(ggml_type("q8_1"), 4, 7), "q8_1")


@pytest.mark.parametrize("name", CHUNK_TYPES)
@settings(max_examples=int(os.environ.get("LLMLAB_HYPOTHESIS_EXAMPLES", 60)), deadline=None)
@given(data=st.data())
def test_quantize_property_matches_llama_cpp(name, data):
    """Any float32 rows (finite, moderate range, subnormals included) quantize to llama.cpp's bytes."""
    t = ggml_type(name)
    nb = data.draw(st.integers(1, 3))
    scale = data.draw(st.sampled_from([1e-6, 1e-2, 1.0, 300.0]))
    x = data.draw(arrays(np.float32, nb * t.block_size,
                         elements=st.floats(-1, 1, width=32, allow_subnormal=True))) * np.float32(scale)
    assert np.array_equal(Q.quantize(x, name), quantize_chunk(x[None], name))


@pytest.mark.parametrize("partner", ["q8_0", "q8_1", "q8_k"])
def test_activation_quantization_matches_ggml_cpu(partner):
    t = ggml_type(partner)
    x = sample_data(t.block_size, rows=24, seed=8)
    for row in x:
        mine = C.quantize_activations(row[None], partner).view(np.uint8).reshape(-1)
        assert np.array_equal(mine, activation_quantize(row, partner))


def test_activation_rounding_differs_from_model_file_reference():
    """ggml-cpu's q8_0 (x86) rounds halves to even with id = 127/amax; the file quantizer rounds them away."""
    x = np.zeros(32, np.float32)
    x[0], x[1] = 127.0, 2.5                   # d = 1: 2.5 is an exact half
    act = C.quantize_activations(x[None], "q8_0")["qs"][0, 0]
    ref = Q.quantize(x, "q8_0").view(ggml_type("q8_0").layout)["qs"][0]
    assert act[1] == 2 and ref[1] == 3
    assert np.array_equal(C.quantize_activations(x[None], "q8_0").view(np.uint8).reshape(-1), activation_quantize(x, "q8_0"))


@pytest.mark.parametrize("name", sorted(TYPE_TRAITS_CPU))
def test_mul_mat_matches_ggml_cpu_vec_dot(name):
    t = ggml_type(name)
    rng = np.random.default_rng(9)
    n = 512 if t.block_size == 256 else 384
    w = (rng.standard_normal((24, n)) * 0.05 + rng.uniform(-0.03, 0.03, (24, 1))).astype(np.float32)
    x = (rng.standard_normal((3, n)) * rng.uniform(0.1, 10, (3, 1))).astype(np.float32)
    raw = Q.quantize(w, name).reshape(24, -1)
    mine = C.mul_mat(raw, name, x)
    ref = np.array([[vec_dot(raw[r], name, x[i]) for r in range(24)] for i in range(3)], np.float32)
    assert C.vec_dot_type(name).lower() == ggml_type(TYPE_TRAITS_CPU[name].vec_dot_type).name
    # integer lane sums, block scales and the AVX2 accumulation order: the same float32 bits
    assert checklist.same_bits(mine, ref)
    assert checklist.same_bits(C.mul_mat(raw, name, x[0]), mine[0])


def test_mul_mat_errors():
    raw = Q.quantize(np.zeros((4, 64), np.float32), "q4_0")
    with pytest.raises(Q.QuantError, match="multiple of the block size"):
        C.mul_mat(raw, "q4_0", np.zeros(48, np.float32))
    with pytest.raises(Q.QuantError, match="no CPU dot product"):
        C.mul_mat(raw, "iq2_xxs", np.zeros(256, np.float32))
    with pytest.raises(Q.QuantError, match="activation quantizer"):
        C.quantize_activations(np.zeros((1, 32), np.float32), "q4_0")


@pytest.mark.parametrize("name", sorted(TYPE_TRAITS_CPU))
def test_mul_mat_random_blocks_extreme_activations(name):
    """Any block contents (largest scales and codes) and saturating activations: still ggml-cpu's bits."""
    t = ggml_type(name)
    rng = np.random.default_rng(11)
    n = 1024
    raw = random_blocks(t, 16 * n // t.block_size, 12).reshape(16, -1)
    x = np.sign(rng.standard_normal((3, n))).astype(np.float32) * 100
    x[:, ::7] *= 0.01
    mine = C.mul_mat(raw, name, x)
    ref = np.array([[vec_dot(raw[r], name, x[i]) for r in range(16)] for i in range(3)], np.float32)
    assert checklist.same_bits(mine, ref)
