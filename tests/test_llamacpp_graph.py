"""llmlab's graph against llama.cpp's, node by node (needs llama-cpp-python and llmlab's forward pass).

Both real models are bit-identical to llama.cpp node by node, both attention paths, on the first
reference prompt: every named compute node matches in op and shape, and no value differs at all (the
divergence tolerance of llmlab/llamacpp/diff.py, normwise relative 1e-3, is what the CLI reports against;
these tests ask for more: equality). Gemma 3 got there once the tiled K-quant matmul ggml-cpu uses from
8 activation rows and vec_dot_f16 for one-row f16 products were reproduced; before, a 1e-8 difference at
ffn_out-0 flipped an 8-bit activation rounding a few layers later and grew to 4e-3.
"""
from __future__ import annotations

import pytest

llama_cpp = pytest.importorskip("llama_cpp", reason="llama-cpp-python is not installed (optional oracle)")

from conftest import ref_logits  # noqa: E402

from llmlab.llamacpp import capture, diff, llmlab_nodes  # noqa: E402
from llmlab.viz.llamacpp import layer_errors  # noqa: E402


def report_for(name, path, flash_attn):
    ids = ref_logits(name)[1]["p0_ids"].tolist()
    cap = capture(path, ids, flash_attn=flash_attn)
    report = diff(llmlab_nodes(path, ids, flash_attn=flash_attn), cap)
    missing = [(d.name, d.llama_cpp_op, d.llama_cpp_shape, d.op, d.shape) for d in report.unmatched]
    assert not missing, f"{len(missing)} of {report.total} llama.cpp nodes without an llmlab twin: {missing[:12]}"
    return cap, report


@pytest.mark.parametrize("flash_attn", [False, True], ids=["fa_off", "fa_on"])
def test_smollm2_graph_is_llama_cpps_node_by_node(smollm2_path, flash_attn):
    cap, report = report_for("smollm2", smollm2_path, flash_attn)
    assert report.total == len(cap.compute_nodes()) > 500
    assert report.first_inexact is None, report.summary()


@pytest.mark.parametrize("flash_attn", [False, pytest.param(True, marks=pytest.mark.slow)], ids=["fa_off", "fa_on"])
def test_gemma3_graph_is_llama_cpps_node_by_node(gemma3_path, flash_attn):
    cap, report = report_for("gemma3", gemma3_path, flash_attn)
    assert report.total == len(cap.compute_nodes()) > 450
    assert report.first_inexact is None, report.summary()
    per_layer = layer_errors(report)
    assert len(per_layer) == 18 and max(e for _, e in per_layer) == 0, per_layer
