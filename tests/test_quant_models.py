"""Every tensor of both real models: dequantize bit-exact with gguf-py (and llama.cpp's ggml),
and real weight rows quantized byte-exact with llama.cpp."""
from __future__ import annotations

import numpy as np
import pytest

import llmlab.ggml.quant as Q
from llmlab.ggml.gguf import GGUFFile
from llmlab.ggml.quant import checklist
from llmlab.ggml.types import TYPES

gguf = pytest.importorskip("gguf", reason="gguf-py is not installed (optional oracle)")


def row_sample(t, rows: int | None):
    """Raw bytes of the first and last ``rows`` rows of a tensor (all when rows is None)."""
    data = t.data
    row_bytes = t.type.row_size(t.shape[0])
    n_rows = t.nbytes // row_bytes
    if rows is None or n_rows <= 2 * rows:
        return data
    return np.concatenate([data[:rows * row_bytes], data[-rows * row_bytes:]])


def check_file(path, rows):
    checked = {}
    with GGUFFile(path) as f:
        for t in f.tensors:
            raw = row_sample(t, rows)
            ref = gguf.quants.dequantize(raw, gguf.GGMLQuantizationType(t.type.id))
            assert checklist.same_bits(Q.dequantize(raw, t.type), ref), t.name
            checked[t.type.name] = checked.get(t.type.name, 0) + 1
    return checked


def test_dequantize_real_tensors_sampled(real_model):
    name, path = real_model
    checked = check_file(path, rows=8)
    assert sum(checked.values()) > 100 and len(checked) >= 3


@pytest.mark.slow
def test_dequantize_real_tensors_full(real_model):
    name, path = real_model
    check_file(path, rows=None)


@pytest.mark.slow
def test_dequantize_real_tensors_match_llama_cpp(real_model):
    pytest.importorskip("llama_cpp", reason="llama-cpp-python is not installed (optional oracle)")
    from ggml_ref import to_float
    name, path = real_model
    with GGUFFile(path) as f:
        for t in f.tensors:
            if t.type.name != "f32":
                assert checklist.same_bits(Q.dequantize(t.data, t.type), to_float(t.data, t.type)), t.name


QUANTIZABLE = [t.name for t in TYPES.values() if t.from_float is not None and t.name not in ("q8_1", "q8_k", "f32")]


@pytest.mark.parametrize("qtype", QUANTIZABLE)
def test_quantize_real_rows_matches_llama_cpp(gemma3_path, qtype):
    """Rows of a real weight (gemma's ffn_down, 2048 wide) through every reference quantizer."""
    pytest.importorskip("llama_cpp", reason="llama-cpp-python is not installed (optional oracle)")
    from ggml_ref import quantize_chunk
    with GGUFFile(gemma3_path) as f:
        t = f.tensor("blk.3.ffn_down.weight")
        x = Q.dequantize(row_sample(t, 4), t.type).reshape(-1, t.shape[0])
    assert np.array_equal(Q.quantize(x, qtype), quantize_chunk(x, qtype))
