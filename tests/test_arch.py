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


# ---- a new architecture is its spec and one registry line ------------------------------------------------------

@pytest.mark.parametrize("base", ["llama", "gemma3", "qwen2"])
def test_a_new_architecture_needs_only_its_spec_and_registry_line(tmp_path, smollm2_path, base):
    """A copy of a built-in spec under a name nothing in llmlab knows, registered at run time: the block
    references (``block.trace``), the pictures (``viz.block``), the KV-cache views (``viz.kv``) and the chat
    template's default work on a tiny model of it, and give what they give for the original."""
    import dataclasses

    import matplotlib
    matplotlib.use("Agg")
    from llmlab import block as B
    from llmlab.ggml.gguf import GGUFFile, GGUFWriter
    from llmlab.llama.chat import ChatTemplate
    from llmlab.viz import block as vb, kv as vk

    def tiny(arch):       # a real tokenizer, without the file's own chat template: the spec's default applies
        w = GGUFWriter.from_file(GGUFFile(write_tiny(tmp_path / f"src-{arch}.gguf", arch, n_layer=6, seed=7,
                                                     sliding_window=4, vocab_from=smollm2_path)))
        del w.kv["tokenizer.chat_template"]
        return w.write(tmp_path / f"{arch}.gguf") or tmp_path / f"{arch}.gguf"

    register_arch(dataclasses.replace(get_arch(base), name="newarch"))
    try:
        paths = {a: tiny(a) for a in (base, "newarch")}
        models = {a: Model(p) for a, p in paths.items()}
        traces = {a: B.trace(m, TOKENS) for a, m in models.items()}
        old, new = traces[base], traces["newarch"]
        assert (new.act, new.rope_mode, sorted(new.layers)) == (old.act, old.rope_mode, sorted(old.layers))
        for il in old.layers:
            for f in ("x", "attn_norm", "q", "k", "glu", "attn", "mid", "ffn", "out"):
                assert np.array_equal(getattr(new[il], f), getattr(old[il], f)), (il, f)
            assert np.array_equal(B.glu(new[il].gate, new[il].up, new.act), new[il].glu)
        assert vb.block_dot("newarch") == vb.block_dot(base)
        assert all(f"{node}-0" in new.names for node, _, _ in vb.block_steps("newarch"))
        vb.plot_glu(new, 1, 2)
        shapes = {a: vk.model_kv_shape(p) for a, p in paths.items()}
        assert {k: v for k, v in shapes["newarch"].items() if k != "name"} == \
            {k: v for k, v in shapes[base].items() if k != "name"}
        assert shapes["newarch"].get("n_layer_swa", 0) == sum(models["newarch"].hparams.is_swa(il) for il in range(6))
        assert vk.kv_size_rows([shapes["newarch"]], [64])[0]["bytes"] == vk.kv_size_rows([shapes[base]], [64])[0]["bytes"]
        ctx = Context(models["newarch"], n_ctx=64)
        ctx.decode(Batch.from_tokens(TOKENS, logits="last"))
        for il in range(6):
            vk.plot_cells(ctx.kv.layer_cache(il))
        assert ChatTemplate.from_model(paths["newarch"]).source == ChatTemplate.from_model(paths[base]).source
    finally:
        ARCHS.pop("newarch", None)
        import matplotlib.pyplot as plt
        plt.close("all")


# the modules whose strings may equal an architecture's name without meaning one
NOT_AN_ARCHITECTURE = {
    "llmlab/llama/vocab/vocab.py": "'llama' is a vocabulary type (tokenizer.ggml.model: SentencePiece)",
    "llmlab/llama/vocab/tokenizer.py": "'llama' is a vocabulary type (tokenizer.ggml.model: SentencePiece)",
    "llmlab/data/__init__.py": "'gemma3' is a model of llmlab.models' registry, whose reference files are named",
}


def names_in_logic(source: str, names) -> list[tuple[int, str]]:
    """``(line, name)`` for each of ``names`` (or a prefix of one, 4 letters or more, in ``startswith``) that ``source`` tests in
    its logic: compared with (``==``, ``in``), used as a key of a dict or an index, or as the prefix of a
    ``startswith`` / ``endswith``. Docstrings, messages and keyword arguments are not logic."""
    import ast

    def consts(node):
        items = node.elts if isinstance(node, (ast.Tuple, ast.List, ast.Set)) else [node]
        return [n.value for n in items if isinstance(n, ast.Constant) and isinstance(n.value, str)]

    found = []
    for node in ast.walk(ast.parse(source)):
        hits = []
        if isinstance(node, ast.Compare):
            hits = [c for side in [node.left, *node.comparators] for c in consts(side) if c in names]
        elif isinstance(node, ast.Dict):
            hits = [c for k in node.keys if k is not None for c in consts(k) if c in names]
        elif isinstance(node, ast.Subscript):
            hits = [c for c in consts(node.slice) if c in names]
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and \
                node.func.attr in ("startswith", "endswith") and node.args:
            hits = [c for c in consts(node.args[0]) if len(c) >= 4 and any(n.startswith(c) for n in names)]
        found += [(node.lineno, c) for c in hits]
    return sorted(found)


def test_no_module_outside_the_specs_names_an_architecture():
    """Architecture knowledge lives in ``llmlab/llama/arch/``: no other module of the package tests an
    architecture's name (``NOT_AN_ARCHITECTURE``: the strings that only look like one)."""
    from pathlib import Path

    import llmlab
    root = Path(llmlab.__file__).resolve().parent
    found = []
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root.parent).as_posix()
        if not rel.startswith("llmlab/llama/arch/") and rel not in NOT_AN_ARCHITECTURE:
            found += [f"{rel}:{line}: {name!r}" for line, name in names_in_logic(path.read_text(encoding="utf-8"), ARCHS)]
    assert found == []


def test_the_architecture_check_finds_what_it_should():
    """The check itself: each test the specs replaced is found; other strings and names are not."""
    src = ('act = "gelu" if model.arch == "gemma3" else "silu"\n'
           'MID = {"llama": "ffn_inp", "gemma3": "sa_out"}\n'
           'x = STEPS["qwen2"]\n'
           'if a in ("llama", "qwen2"): pass\n'
           'y = str(arch).startswith("gemma")\n'
           'ok = vocab.model == "bert" and {"gpt2": 1}["gpt2"] and f(arch="llama")\n'
           '"""llama, gemma3 and qwen2 in a docstring"""\n')
    assert names_in_logic(src, ARCHS) == [(1, "gemma3"), (2, "gemma3"), (2, "llama"), (3, "qwen2"), (4, "llama"),
                                          (4, "qwen2"), (5, "gemma")]
