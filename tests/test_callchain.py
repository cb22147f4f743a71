"""The llama_decode call chain drawn in notebook 08: every llama.cpp name is in the file it cites (in the
vendored source, where unpacked), every llmlab counterpart exists, and the drawing renders."""
from __future__ import annotations

import importlib

from llmlab.viz import callchain as cc


def test_every_step_is_in_the_file_it_cites(llama_cpp_src):
    src = llama_cpp_src
    texts = {}
    for s in cc.DECODE_CHAIN:
        text = texts.setdefault(s.file, (src / s.file).read_text(errors="replace"))
        name = s.function.split("::")[-1] if "::" in s.function else s.function
        assert name in text, f"{s.function} not in {s.file}"
        if "::" in s.function:
            assert s.function in text, f"{s.function} not defined in {s.file}"


def test_llmlab_counterparts_exist_and_the_tree_is_connected():
    keys = {s.key for s in cc.DECODE_CHAIN}
    assert len(keys) == len(cc.DECODE_CHAIN)
    for s in cc.DECODE_CHAIN:
        assert s.parent is None or s.parent in keys
        if s.llmlab:
            mod, attr = s.llmlab.split(":")
            obj = importlib.import_module(mod)
            for part in attr.split("."):
                obj = getattr(obj, part)
    dot = cc.chain_dot()
    assert dot.count(" -> ") == len(cc.DECODE_CHAIN) - 1
    top, bottom = cc.subtree("api", cut=("gcompute",)), cc.subtree("gcompute")
    assert {s.key for s in top} | {s.key for s in bottom} == keys and {s.key for s in top} & {s.key for s in bottom} == {"gcompute"}
    assert "llama_decode" in str(cc.chain_graph("api", cut=("gcompute",))) and "ggml_cuda_mul_mat" in str(cc.chain_graph("gcompute"))
