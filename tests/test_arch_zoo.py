"""qwen3, qwen3moe and deepseek2 from their spec files: tiny random models (llmlab.llama.tiny_zoo) of
shapes and seeds drawn at test time, run by llmlab and by llama.cpp 0.3.36 itself: the logits of every
position bit for bit, greedy continuations token for token, every named node of llama.cpp's graph
(diff-llama-cpp) matched. Without llama.cpp only the llmlab-side checks run (the others skip, or fail
under LLMLAB_REQUIRE_ORACLES=1)."""
from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest

from llmlab import LLMLabError, models
from llmlab.llama import Batch, Context, Model
from llmlab.llama import tiny_zoo
from llmlab.llama.arch import ARCHS
from llmlab.llama.tiny import write_tiny

NEW = ("qwen3", "qwen3moe", "deepseek2")
# chosen at test time (LLMLAB_TINY_SEED repeats a run): each run checks models nobody looked at before
SEED = int(os.environ.get("LLMLAB_TINY_SEED") or int.from_bytes(os.urandom(3), "little"))
PROMPT = [1, 5, 100, 200, 7, 8, 9, 10, 11, 12]
# the default suite compares q8_0 and one more weight type drawn with the seed; --slow compares all five
QUICK_WTYPES = {"q8_0", tiny_zoo.WTYPES[SEED % len(tiny_zoo.WTYPES)]}
WTYPE_PARAMS = [pytest.param(w, marks=() if w in QUICK_WTYPES else pytest.mark.slow) for w in tiny_zoo.WTYPES]


def _model(tmp_path, arch: str, wtype: str, salt: int = 0, vocab=None) -> tuple[Model, dict]:
    kw = tiny_zoo.draw(arch, SEED + salt, wtype)
    # a real tokenizer cut to its first 512 tokens: llama.cpp loads it, and the LM head stays small
    p = write_tiny(tmp_path / f"{arch}-{wtype}.gguf", arch, vocab_from=vocab, vocab_size=512 if vocab else None, **kw)
    return Model(p), kw


# ---------------------------------------------------------------------------- llmlab alone
@pytest.mark.parametrize("arch", NEW)
@pytest.mark.parametrize("i", range(3))
def test_each_shape_loads_from_its_table_and_batches_agree(tmp_path, arch, i):
    """Every shape: the file holds exactly the required rows of the spec's table; one batch, micro-batches
    of 3 and token-by-token decoding give the same bits, and so do the NumPy reference kernels."""
    kw = dict(tiny_zoo.scaled(tiny_zoo.SHAPES[arch][i], "q8_0"), seed=SEED + i, wtype="q8_0")
    m = Model(write_tiny(tmp_path / "t.gguf", arch, **kw))
    rows = m.spec.expected_tensors(m.hparams)
    names = {t.name for t in m.gguf.tensors}
    assert {n for n, _, opt in rows if not opt} <= names <= {n for n, _, _ in rows}
    assert m.unused_tensors() == []
    toks = PROMPT[:7]
    whole = Context(m, n_ctx=64).decode(Batch.from_tokens(toks, logits="all"))
    assert np.isfinite(whole).all()
    assert np.array_equal(Context(m, n_ctx=64, n_ubatch=3).decode(Batch.from_tokens(toks, logits="all")), whole)
    ctx = Context(m, n_ctx=64)
    steps = [ctx.decode(Batch.from_tokens([t], pos0=j, logits="all")) for j, t in enumerate(toks)]
    assert np.array_equal(np.concatenate(steps), whole), f"seed {SEED}"
    ref = Context(m, n_ctx=64, kernels="reference").decode(Batch.from_tokens(toks, logits="all"))
    assert np.array_equal(ref, whole)


def test_the_mla_cache_holds_one_latent_row_per_token_and_layer(tmp_path):
    m, _ = _model(tmp_path, "deepseek2", "q8_0")
    hp = m.hparams
    ctx = Context(m, n_ctx=256)
    assert ctx.v_l == [None] * hp.n_layer                         # no V tensor at all
    assert ctx.k_l[0].ne[0] == hp.n_lora_kv + hp.n_rot            # kv_lora_rank + n_rot values per row
    assert ctx.kv.total_bytes() == 256 * hp.n_layer * 2 * (hp.n_lora_kv + hp.n_rot)   # f16, K only
    assert "v=none" in repr(ctx.kv)
    ctx.decode(Batch.from_tokens(PROMPT[:4], logits="last"))
    assert ctx.kv.v(0, 4).shape == (4, hp.n_lora_kv) and np.shares_memory(ctx.kv.v(0, 4), ctx.kv.k(0, 4))
    g = ctx.last_graph
    assert not any(t.name.startswith("cache_v") for t in g.gf.nodes)
    assert {"q_nope_absorbed-0", "kqv_mla-0", "ffn_moe_topk-1", "ffn_shexp-1"} <= {t.name for t in g.gf.nodes}


def test_moe_routes_each_token_through_its_top_k_experts(tmp_path):
    m, kw = _model(tmp_path, "qwen3moe", "q8_0")
    hp = m.hparams
    ctx = Context(m, n_ctx=64)
    ctx.decode(Batch.from_tokens(PROMPT[:6], logits="all"),
               capture=["ffn_moe_probs-0", "ffn_moe_argsort-0", "ffn_moe_weights_norm-0"])
    probs, order = ctx.captured["ffn_moe_probs-0"], ctx.captured["ffn_moe_argsort-0"]
    assert np.array_equal(order, np.argsort(-probs, axis=-1, kind="stable"))
    top = np.take_along_axis(probs, order[:, :hp.n_expert_used], -1)
    w = ctx.captured["ffn_moe_weights_norm-0"].reshape(top.shape)
    assert np.allclose(w, top / top.sum(-1, keepdims=True), rtol=1e-6)
    mmid = [t for t in ctx.last_graph.gf.nodes if t.op == "MUL_MAT_ID"]
    assert len(mmid) == 3 * hp.n_layer and mmid[0].ne[1] == hp.n_expert_used


@pytest.mark.parametrize("wtype", ["q4_k", "q4_0"])
def test_moe_decode_steps_on_fast_kernels_equal_the_reference(tmp_path, wtype):
    """MUL_MAT_ID's fast binding (each chosen expert through its quantized path's twin; REPACKed experts one
    gemv per routed row) gives the reference's bits, prefill and decode steps alike."""
    kw = dict(tiny_zoo.scaled(tiny_zoo.SHAPES["qwen3moe"][SEED % 3], wtype), seed=SEED, wtype=wtype)
    m = Model(write_tiny(tmp_path / "m.gguf", "qwen3moe", **kw))
    out = []
    for kernels in ("fast", "reference"):
        ctx = Context(m, n_ctx=64, kernels=kernels)
        rows = [ctx.decode(Batch.from_tokens(PROMPT[:5], logits="all"))]
        rows += [ctx.decode(Batch.from_tokens([t], pos0=5 + i, logits="all")) for i, t in enumerate(PROMPT[5:8])]
        out.append(np.concatenate(rows))
    assert np.array_equal(*out), f"seed {SEED}"


def test_the_generator_tool_writes_every_shape(tmp_path):
    import importlib.util
    spec = importlib.util.spec_from_file_location("gen", __file__.replace("tests/test_arch_zoo.py", "tools/gen_tiny_models.py"))
    gen = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gen)
    assert gen.main([str(tmp_path), "--arch", "deepseek2", "--wtype", "q4_0", "--seed", str(SEED)]) == 0
    files = sorted(tmp_path.glob("*.gguf"))
    assert [f.name for f in files] == [f"deepseek2-s{i}-q4_0.gguf" for i in range(len(tiny_zoo.SHAPES["deepseek2"]))]
    assert all(Model(f).hparams.is_mla for f in files)


def test_an_unknown_architecture_is_one_clear_error(tmp_path):
    from llmlab.ggml.gguf import GGUFFile, GGUFWriter
    p = write_tiny(tmp_path / "q.gguf", "qwen3", n_layer=1)
    w = GGUFWriter.from_file(GGUFFile(p))
    w.kv = {("mamba9" + k[len("qwen3"):] if k.startswith("qwen3.") else k): v for k, v in w.kv.items()}
    w.add("general.architecture", "mamba9")
    w.write(tmp_path / "m.gguf")
    with pytest.raises(LLMLabError, match="architecture 'mamba9' is not supported") as e:
        Model(tmp_path / "m.gguf")
    assert all(a in str(e.value) for a in ARCHS)
    out = subprocess.run([sys.executable, "-m", "llmlab", "logits", "-m", str(tmp_path / "m.gguf"), "-p", "x"],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 2 and out.stderr.startswith("error:") and "deepseek2" in out.stderr
    assert "Traceback" not in out.stderr


# ---------------------------------------------------------------------------- against llama.cpp
@pytest.fixture(scope="module")
def vocab():
    pytest.importorskip("llama_cpp", reason="llama-cpp-python is not installed (optional oracle)")
    return models.resolve("smollm2")


@pytest.mark.llamacpp_exact
@pytest.mark.parametrize("wtype", WTYPE_PARAMS)
@pytest.mark.parametrize("arch", NEW)
def test_logits_and_every_named_node_are_llama_cpps(tmp_path, vocab, arch, wtype):
    from llmlab.llamacpp import capture, diff, llmlab_nodes
    from llmlab.llamacpp.eval_callback import run_logits
    m, kw = _model(tmp_path, arch, wtype, vocab=vocab)
    want = run_logits(m.path, PROMPT).reshape(len(PROMPT), -1)
    got = Context(m, n_ctx=256).decode(Batch.from_tokens(PROMPT, logits="all"))
    bad = np.flatnonzero((got != want).any(1))
    assert bad.size == 0, f"seed {SEED} {kw}: positions {bad.tolist()} differ (max {np.abs(got - want).max()})"
    # token by token too (llama.cpp with n_ubatch = 1): f32/f16 and K-quant weights take other kernels than
    # for a batch there (vec_dot instead of tinyBLAS or the tiled matmul), and so must llmlab
    want1 = run_logits(m.path, PROMPT[:6], n_ubatch=1).reshape(6, -1)
    ctx = Context(m, n_ctx=256)
    got1 = np.concatenate([ctx.decode(Batch.from_tokens([t], pos0=i, logits="all")) for i, t in enumerate(PROMPT[:6])])
    assert np.array_equal(got1, want1), f"seed {SEED} {kw}: token by token, max {np.abs(got1 - want1).max()}"
    ids = PROMPT[:6]
    rep = diff(llmlab_nodes(m.path, ids), capture(m.path, ids))
    assert rep.matched == rep.total and not rep.unmatched and rep.first_inexact is None, f"seed {SEED}: {rep.summary()}"


@pytest.mark.llamacpp_exact
@pytest.mark.parametrize("arch", NEW)
def test_greedy_continuations_are_llama_cpps(tmp_path, vocab, arch):
    """Prefill, then 48 tokens one at a time, each the argmax: llama.cpp (through the one bridge, in its worker
    process) against llmlab's one greedy loop."""
    from llmlab.generate import greedy
    from llmlab.llamacpp.session import Session
    from llmlab.llamacpp.worker import open_remote
    m, kw = _model(tmp_path, arch, "q8_0", salt=7, vocab=vocab)
    n = 48
    with open_remote(Session, str(m.path), n_ctx=128, n_threads=2, flash_attn=False) as sess:
        want, batch, pos = [], list(PROMPT), 0
        for _ in range(n):
            assert sess.decode(batch, pos0=pos, logits="last") == 0
            want.append(int(np.argmax(sess.logits([len(batch) - 1])[0])))
            pos, batch = pos + len(batch), [want[-1]]
    steps = greedy(Context(m, n_ctx=128), PROMPT)
    got = [next(steps).token for _ in range(n)]
    agree = next((i for i, (a, b) in enumerate(zip(got, want)) if a != b), n)
    assert agree == n, f"seed {SEED} {kw}: {agree}/{n} tokens agree"
