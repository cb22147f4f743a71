"""One spec per architecture: the registry, the tensor table a file is checked against, a third
architecture (qwen2) built end to end from its spec alone."""
from __future__ import annotations

import numpy as np
import pytest

from llmlab import LLMLabError
from llmlab.ggml.gguf import GGUFFile, GGUFWriter
from llmlab.llama import Batch, Context, Model
from llmlab.llama.arch import ARCHS, get_arch, get_builder, register_arch
from llmlab.llama.arch.spec import LLAMA_ROPE_TYPE_NEOX, ArchSpec
from llmlab.llama.tiny import write_tiny

TOKENS = [5, 17, 200, 3, 3, 99, 41, 7]


def test_registering_an_architecture_keeps_the_built_ins():
    extra = ArchSpec(name="test-arch", builder=get_builder("llama"), layer_tensors=get_arch("llama").layer_tensors)
    try:
        register_arch(extra)
        assert {"llama", "gemma3", "qwen2", "test-arch"} <= set(ARCHS)
        assert get_builder("gemma3") is get_arch("gemma3").builder
    finally:
        ARCHS.pop("test-arch")
    with pytest.raises(LLMLabError, match="architecture 'nope' is not supported"):
        get_arch("nope")


@pytest.mark.parametrize("arch", ["llama", "gemma3", "qwen2"])
def test_a_tiny_file_holds_exactly_the_required_rows_of_its_table(tmp_path, arch):
    m = Model(write_tiny(tmp_path / "t.gguf", arch, n_layer=2))
    rows = m.spec.expected_tensors(m.hparams)
    info = {t.name: tuple(int(x) for x in t.shape) for t in m.gguf.tensors}
    assert {n for n, _, opt in rows if not opt} == set(info)
    assert all(info[n] == ne for n, ne, _ in rows if n in info)
    assert m.unused_tensors() == []
    for L in m.layers:                             # attribute access; absent optional tensors are None
        assert set(vars(L)) == set(m.spec.layer_attrs)


def test_optional_biases_are_none_when_absent_and_used_when_present(tmp_path):
    src = write_tiny(tmp_path / "llama.gguf", "llama", n_layer=2, seed=3)
    m = Model(src)
    assert m.layers[0].bq is None and m.layers[0].bo is None
    base = Context(m, n_ctx=32).decode(Batch.from_tokens(TOKENS, logits="all"))
    w = GGUFWriter.from_file(GGUFFile(src))                         # the same file with a zero and a real q bias
    w.add_tensor("blk.0.attn_q.bias", np.zeros(64, np.float32))
    w.add_tensor("blk.1.attn_q.bias", np.full(64, 0.5, np.float32))
    w.write(tmp_path / "bias.gguf")
    mb = Model(tmp_path / "bias.gguf")
    assert mb.layers[0].bq is not None and mb.layers[0].bk is None
    ctx = Context(mb, n_ctx=32)
    got = ctx.decode(Batch.from_tokens(TOKENS, logits="all"))
    assert not np.array_equal(got, base)
    assert "Qcur-1" in {t.name for t in ctx.last_graph.gf.nodes if t.op == "ADD"}


def test_qwen2_from_its_spec_alone(tmp_path):
    m = Model(write_tiny(tmp_path / "q.gguf", "qwen2", n_layer=3, seed=5, wtype="q8_0"))
    hp = m.hparams
    assert hp.rope_type == LLAMA_ROPE_TYPE_NEOX and m.layers[2].bv is not None
    whole = Context(m, n_ctx=64).decode(Batch.from_tokens(TOKENS, logits="all"))
    ctx = Context(m, n_ctx=64, n_ubatch=3)
    assert np.array_equal(ctx.decode(Batch.from_tokens(TOKENS, logits="all")), whole)   # q8_0: as ggml-cpu, exact
    ctx = Context(m, n_ctx=64)
    steps = [ctx.decode(Batch.from_tokens([t], pos0=i, logits="all")) for i, t in enumerate(TOKENS)]
    assert np.array_equal(np.concatenate(steps), whole)
    w = GGUFWriter.from_file(m.gguf)                                 # a required bias missing: named
    del w.tensors["blk.1.attn_k.bias"]
    w.write(tmp_path / "missing.gguf")
    with pytest.raises(LLMLabError, match=r"missing tensor 'blk.1.attn_k.bias' \(expected shape \[32\]\)"):
        Model(tmp_path / "missing.gguf")
