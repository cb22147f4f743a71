"""llmlab's graph against llama.cpp's, node by node (needs llama-cpp-python and llmlab's forward pass).

Tolerance: a node agrees when its normwise relative error (max |a-b| / max |b|) is at most
``llmlab.llamacpp.diff.DIVERGE_TOL`` = 1e-3: float32 summation-order noise (~1e-6) plus the f16 and
8-bit activation roundings that such noise occasionally flips (see llmlab/llamacpp/diff.py).
"""
from __future__ import annotations

import pytest

llama_cpp = pytest.importorskip("llama_cpp", reason="llama-cpp-python is not installed (optional dependency)")
pytest.importorskip("llmlab.model", reason="llmlab's forward pass (llmlab.model) is not in this checkout")

from conftest import ref_logits  # noqa: E402

from llmlab.llamacpp import capture, diff, llmlab_nodes  # noqa: E402


def check_twins(name, path, flash_attn):
    ids = ref_logits(name)[1]["p0_ids"].tolist()
    cap = capture(path, ids, flash_attn=flash_attn)
    report = diff(llmlab_nodes(path, ids, flash_attn=flash_attn), cap)
    missing = [(d.name, d.llama_cpp_op, d.llama_cpp_shape, d.op, d.shape) for d in report.unmatched]
    assert not missing, f"{len(missing)} of {report.total} llama.cpp nodes without an llmlab twin: {missing[:12]}"
    assert report.first_divergence is None, report.summary()


@pytest.mark.parametrize("flash_attn", [False, True], ids=["fa_off", "fa_on"])
def test_smollm2_nodes_have_llmlab_twins(smollm2_path, flash_attn):
    check_twins("smollm2", smollm2_path, flash_attn)


@pytest.mark.slow
@pytest.mark.parametrize("flash_attn", [False, True], ids=["fa_off", "fa_on"])
def test_gemma3_nodes_have_llmlab_twins(gemma3_path, flash_attn):
    check_twins("gemma3", gemma3_path, flash_attn)
