"""The forward pass through the graph: both real models against llama.cpp's logits, batch
consistency on tiny models, and clear errors for bad model files."""
from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

from conftest import REF_PROFILES, ref_logits
from llmlab import LLMLabError
from llmlab.ggml.gguf import GGUFFile, GGUFWriter
from llmlab.llama import Batch, Context, Model
from llmlab.llama.tiny import write_tiny

TOKENS = [5, 17, 200, 3, 3, 99, 41, 7, 128, 64, 250, 1]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    d = tmp_path_factory.mktemp("tinyfw")
    return {a: Model(write_tiny(d / f"{a}.gguf", a, n_layer=3, seed=2, sliding_window=4)) for a in ("llama", "gemma3")}


@pytest.fixture(scope="module")
def smollm2(smollm2_path):
    return Model(smollm2_path)


@pytest.fixture(scope="module")
def gemma3(gemma3_path):
    return Model(gemma3_path)


def agreement(model, name, i, cpu):
    """llmlab emulating ``cpu`` against the stored logits of llama.cpp built for that CPU."""
    meta, npz = ref_logits(name, cpu)
    ids = npz[f"p{i}_ids"]
    lg = Context(model, n_ctx=max(64, len(ids)), cpu=cpu).decode(Batch.from_tokens(ids, logits="all"))
    tid, tl = npz[f"p{i}_top_ids"].astype(np.int64), npz[f"p{i}_top_logits"]
    last = npz[f"p{i}_last_logits"]
    a = lg[-1]
    return dict(top1=(lg.argmax(1) == tid[:, 0]).mean(),
                top32=float(np.abs(np.take_along_axis(lg, tid, 1) - tl).max()),
                cos=float(a @ last / np.linalg.norm(a) / np.linalg.norm(last)),
                bitexact=bool((a == last).all()),
                top32_bitexact=bool((np.take_along_axis(lg, tid, 1) == tl).all()))


def assert_bit_identical(r: dict) -> None:
    """llmlab's logits are llama.cpp's: the same argmax and top 32 at every position, every bit."""
    assert r["top1"] == 1.0 and r["top32"] == 0.0 and r["cos"] > 0.9999
    assert r["bitexact"] and r["top32_bitexact"]


# SmolLM2 (q4_1 weights, q8_0 tied head): every path reproduces ggml-cpu's order of float
# operations, so the logits are bit-identical to llama.cpp's on each CPU profile (all 5 ref prompts,
# every position's top 32 and the whole last row), whatever CPU runs the test.
# Gemma 3 (q5_0/q8_0 plain, q4_K repacked, q6_K plain): bit-identical too (measured on all 5 ref
# prompts, 9-30 tokens). From 8 activation rows on, ggml-cpu sends the plain q6_K products through its
# tiled K-quant kernels (one float step per super-block), which llmlab reproduces; prompt 0 (9 tokens)
# takes that path.
@pytest.mark.parametrize("cpu", REF_PROFILES)
@pytest.mark.parametrize("name", ["smollm2", "gemma3"])
def test_matches_llama_cpp_prompt0(request, name, cpu):
    assert_bit_identical(agreement(request.getfixturevalue(name), name, 0, cpu))


@pytest.mark.slow
@pytest.mark.parametrize("cpu", REF_PROFILES)
@pytest.mark.parametrize("i", [1, 2, 3, 4])
@pytest.mark.parametrize("name", ["smollm2", "gemma3"])
def test_matches_llama_cpp_all_prompts(request, name, i, cpu):
    assert_bit_identical(agreement(request.getfixturevalue(name), name, i, cpu))


def test_the_two_cpus_disagree_and_each_profile_reproduces_its_own(smollm2):
    """The same prompt on llama.cpp for AVX2 and for AVX-512 gives different logits; llmlab with each
    profile gives each one's, bit for bit, on whatever CPU runs this test."""
    assert {"avx2", "avx512"} <= set(REF_PROFILES), "llmlab/data/refs holds both reference sets"
    refs = {cpu: ref_logits("smollm2", cpu)[1]["p0_last_logits"] for cpu in ("avx2", "avx512")}
    assert (refs["avx2"] != refs["avx512"]).any()
    ids = ref_logits("smollm2", "avx2")[1]["p0_ids"]
    for cpu, want in refs.items():
        got = Context(smollm2, n_ctx=64, cpu=cpu).decode(Batch.from_tokens(ids, logits="last"))[-1]
        np.testing.assert_array_equal(got, want)


@pytest.mark.slow
@pytest.mark.llamacpp_exact
def test_short_prompt_bit_exact_with_llama_cpp(real_model):
    """Fewer than 8 tokens (ggml-cpu's vec_dot and REPACK gemv/gemm paths): every logit is identical."""
    pytest.importorskip("llama_cpp", reason="llama-cpp-python is not installed (optional oracle)")
    from llmlab.llamacpp.eval_callback import run_logits
    name, path = real_model      # each real model once (the fixture's parameters)
    ids = ref_logits(name)[1]["p0_ids"].tolist()[:6]
    want = run_logits(path, ids)
    got = Context(Model(path), n_ctx=256).decode(Batch.from_tokens(ids, logits="all"))
    np.testing.assert_array_equal(got, want.reshape(got.shape))


@pytest.mark.slow
@pytest.mark.llamacpp_exact
def test_token_by_token_bit_exact_with_llama_cpp(real_model):
    """Micro-batches of one token (decode steps: KQ and KQV through ggml_vec_dot_f16, every weight
    product through vec_dot / gemv) after a cache filled the same way: every logit is identical."""
    pytest.importorskip("llama_cpp", reason="llama-cpp-python is not installed (optional oracle)")
    from llmlab.llamacpp.eval_callback import run_logits
    name, path = real_model      # each real model once (the fixture's parameters)
    npz = ref_logits(name)[1]
    ids = npz["p0_ids"].tolist() + npz["p0_greedy"].tolist()[:3]
    want = run_logits(path, ids, n_ubatch=1)
    got = Context(Model(path), n_ctx=256, n_ubatch=1).decode(Batch.from_tokens(ids, logits="all"))
    np.testing.assert_array_equal(got, want.reshape(got.shape))


@pytest.mark.slow
@pytest.mark.parametrize("cpu", REF_PROFILES)
def test_greedy_continuation_matches_llama_cpp(real_model, cpu):
    """Prefill in one batch, then one token per decode step, as llama.cpp generated the refs' greedy text."""
    name, path = real_model      # each real model once (the fixture's parameters)
    npz = ref_logits(name, cpu)[1]
    ids, want = npz["p0_ids"].tolist(), npz["p0_greedy"].tolist()[:8]
    ctx = Context(Model(path), n_ctx=256, cpu=cpu)
    nxt = int(ctx.decode(Batch.from_tokens(ids, logits="last"))[-1].argmax())
    got = [nxt]
    while len(got) < len(want):
        nxt = int(ctx.decode(Batch.from_tokens([nxt], pos0=len(ids) + len(got) - 1, logits="last"))[-1].argmax())
        got.append(nxt)
    assert got == want


@pytest.mark.parametrize("arch", ["llama", "gemma3"])
def test_one_batch_token_by_token_and_ubatches_agree(tmp_path, arch):
    """With q8_0 weights every path multiplies in ggml's vec_dot order whatever the batch: the same bits.
    (f32 weights take llamafile's tinyBLAS for a batch and ggml_vec_dot_f32 for one token, so llama.cpp's
    own batch and token-by-token logits differ; llmlab's equal llama.cpp's in both: tests/test_arch_zoo.py.)"""
    m = Model(write_tiny(tmp_path / f"{arch}.gguf", arch, n_layer=3, seed=2, sliding_window=4, wtype="q8_0"))
    full = Context(m, n_ctx=64).decode(Batch.from_tokens(TOKENS, logits="all"))
    ctx = Context(m, n_ctx=64)
    step = np.concatenate([ctx.decode(Batch.from_tokens([t], pos0=i, logits="all")) for i, t in enumerate(TOKENS)])
    ub = Context(m, n_ctx=64, n_batch=64, n_ubatch=5).decode(Batch.from_tokens(TOKENS, logits="all"))
    np.testing.assert_array_equal(step, full)
    np.testing.assert_array_equal(ub, full)


@pytest.mark.parametrize("arch", ["llama", "gemma3"])
def test_flash_attention_path_equals_naive_path(tiny, arch):
    m = tiny[arch]
    naive = Context(m, n_ctx=64).decode(Batch.from_tokens(TOKENS, logits="all"))
    fa = Context(m, n_ctx=64, flash_attn=True).decode(Batch.from_tokens(TOKENS, logits="all"))
    # the naive path rounds probabilities to f16 before the V product, flash attention does not
    assert np.abs(fa - naive).max() < 1e-3 * np.abs(naive).max()


def test_two_sequences_in_one_batch_equal_separate_runs(tiny):
    m = tiny["llama"]
    a, b = TOKENS[:7], TOKENS[5:]
    sep_a = Context(m, n_ctx=64).decode(Batch.from_tokens(a, logits="all"))
    sep_b = Context(m, n_ctx=64).decode(Batch.from_tokens(b, logits="all"))
    batch = Batch(a + b, list(range(len(a))) + list(range(len(b))), [(0,)] * len(a) + [(1,)] * len(b),
                  [True] * (len(a) + len(b)))
    both = Context(m, n_ctx=64, n_seq_max=2).decode(batch)
    np.testing.assert_allclose(both[:len(a)], sep_a, rtol=1e-3, atol=2e-3)
    np.testing.assert_allclose(both[len(a):], sep_b, rtol=1e-3, atol=2e-3)


def test_seq_rm_then_redecode_equals_fresh_run(tiny):
    m = tiny["llama"]
    ctx = Context(m, n_ctx=64)
    ctx.decode(Batch.from_tokens(TOKENS, logits="all"))
    ctx.kv.seq_rm(0, 6)
    again = ctx.decode(Batch.from_tokens([9, 8, 7], pos0=6, logits="all"))
    fresh = Context(m, n_ctx=64).decode(Batch.from_tokens(TOKENS[:6] + [9, 8, 7], logits="all"))[6:]
    np.testing.assert_allclose(again, fresh, rtol=1e-3, atol=2e-3)


def test_only_requested_logits_and_context_overflow(tiny):
    m = tiny["llama"]
    ctx = Context(m, n_ctx=16)
    out = ctx.decode(Batch.from_tokens(TOKENS, logits="last"))
    full = Context(m, n_ctx=16).decode(Batch.from_tokens(TOKENS, logits="all"))
    assert out.shape == (1, m.hparams.n_vocab)
    np.testing.assert_allclose(out[0], full[-1], rtol=1e-5, atol=1e-5)
    assert ctx.n_ctx == 256                                  # padded like llama.cpp's
    before = ctx.kv.used
    with pytest.raises(LLMLabError, match="KV cache is full"):  # does not fit: nothing is placed
        ctx.decode(Batch.from_tokens(list(range(250)), pos0=len(TOKENS), logits="last"))
    assert ctx.kv.used == before
    ctx.decode(Batch.from_tokens(list(range(240)), pos0=len(TOKENS), logits="last"))
    with pytest.raises(LLMLabError, match="KV cache is full"):
        ctx.decode(Batch.from_tokens(TOKENS, pos0=len(TOKENS) + 240, logits="all"))
    with pytest.raises(ValueError, match="invalid token"):
        Context(m, n_ctx=16).decode(Batch.from_tokens([10**6], logits="all"))


def test_named_nodes_can_be_captured_and_replaced(tiny):
    m = tiny["llama"]
    ctx = Context(m, n_ctx=32)
    base = ctx.decode(Batch.from_tokens(TOKENS[:4], logits="all"), capture=["Qcur-1", "kq_soft_max-0", "ffn_out-2"])
    assert ctx.captured["Qcur-1"].shape == (4, m.hparams.n_head, m.hparams.n_embd_head_k)
    p = ctx.captured["kq_soft_max-0"]          # (n_head, n_q, n_kv): causal probabilities
    assert np.allclose(p.sum(-1), 1, atol=1e-5) and (p[:, 0, 1:] == 0).all()
    zeroed = Context(m, n_ctx=32).decode(Batch.from_tokens(TOKENS[:4], logits="all"), replace={"ffn_out-2": lambda t, a: a * 0})
    assert not np.allclose(zeroed, base)


def test_graph_names_follow_llama_cpp(tiny):
    m = tiny["gemma3"]
    ctx = Context(m, n_ctx=32)
    ctx.decode(Batch.from_tokens(TOKENS[:3], logits="all"))
    names = {t.name for t in ctx.last_graph.gf.nodes}
    for n in ["embd", "inp_scaled", "attn_norm-0", "Qcur_normed-0", "Kcur-1", "kq_soft_max-2", "kqv_out-0",
              "attn_post_norm-1", "sa_out-0", "ffn_geglu-2", "ffn_post_norm-0", "l_out-2", "result_norm",
              "result_output"]:
        assert n in names, n


def test_missing_and_mismatched_tensors_are_named(tmp_path):
    src = write_tiny(tmp_path / "ok.gguf", "llama", n_layer=2)
    f = GGUFFile(src)
    w = GGUFWriter.from_file(f)
    del w.tensors["blk.1.ffn_up.weight"]
    w.write(tmp_path / "missing.gguf")
    with pytest.raises(LLMLabError, match=r"missing tensor 'blk.1.ffn_up.weight' \(expected shape \[64, 128\]\)"):
        Model(tmp_path / "missing.gguf")
    w = GGUFWriter.from_file(GGUFFile(src))
    t, shape, raw = w.tensors["blk.0.attn_q.weight"]
    w.tensors["blk.0.attn_q.weight"] = (t, (32, 128), raw)
    w.write(tmp_path / "bad.gguf")
    with pytest.raises(LLMLabError, match=r"'blk.0.attn_q.weight' has shape \[32, 128\], expected \[64, 64\]"):
        Model(tmp_path / "bad.gguf")


def test_cli_logits_json(smollm2_path):
    meta, npz = ref_logits("smollm2")
    prompt = meta["prompts"][0]["prompt"]
    out = subprocess.run([sys.executable, "-m", "llmlab", "logits", "-m", str(smollm2_path), "-p", prompt,
                          "--top", "4", "--json"], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    d = json.loads(out.stdout)
    assert d["ids"] == npz["p0_ids"].tolist()
    assert np.array_equal(np.array(d["top_ids"]), npz["p0_top_ids"][:, :4])
    np.testing.assert_allclose(np.array(d["top_logits"]), npz["p0_top_logits"][:, :4], atol=1e-4)
    bad = subprocess.run([sys.executable, "-m", "llmlab", "logits", "-m", "nope.gguf", "-p", "x"],
                         capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and bad.stderr.startswith("error:") and "Traceback" not in bad.stderr


@pytest.mark.parametrize("arch,vocab_of", [("llama", "smollm2"), ("gemma3", "gemma3"), ("qwen2", "smollm2")])
def test_tiny_q8_0_models_are_bit_exact_with_llama_cpp(tmp_path, arch, vocab_of):
    """Every architecture's tiny model, with q8_0 matrices (the kernels llmlab reproduces), written by llmlab
    and loaded by llama.cpp: the logits of every position, and every named node of the graph, are llama.cpp's,
    bit for bit. (f32 and f16 matrices too on x86: tests/test_arch_zoo.py.)"""
    pytest.importorskip("llama_cpp", reason="llama-cpp-python is not installed (optional oracle)")
    from llmlab import models
    from llmlab.llamacpp.eval_callback import run_logits
    p = write_tiny(tmp_path / f"{arch}.gguf", arch, n_layer=2, n_embd=64, n_head=4, n_head_kv=2, n_ff=128,
                   vocab_from=models.resolve(vocab_of), head_dim=16 if arch == "gemma3" else None, wtype="q8_0")
    ids = [1, 5, 100, 2000, 7, 8, 9, 10, 11, 12]
    want = run_logits(p, ids).reshape(len(ids), -1)
    m = Model(p)
    assert m.unused_tensors() == []
    got = Context(m, n_ctx=256).decode(Batch.from_tokens(ids, logits="all"))
    assert np.array_equal(got, want)
    from llmlab.llamacpp import capture, diff, llmlab_nodes      # and node by node: same names, same bits
    rep = diff(llmlab_nodes(p, ids[:6]), capture(p, ids[:6]))
    assert rep.matched == rep.total and not rep.unmatched and rep.first_divergence is None, rep.summary()


@pytest.mark.slow
@pytest.mark.parametrize("arch,vocab_of", [("llama", "smollm2"), ("gemma3", "gemma3"), ("qwen2", "smollm2")])
def test_tiny_models_load_in_llama_cpp_and_agree(tmp_path, arch, vocab_of):
    """Tiny random f32 models with a real vocabulary, written by llmlab: llama.cpp loads them and its
    logits agree (f32 weights: only summation order differs; measured max |diff| / max |logit|:
    4e-7 for llama, 5e-5 for gemma3)."""
    pytest.importorskip("llama_cpp", reason="llama-cpp-python is not installed (optional oracle)")
    from llmlab import models
    from llmlab.llamacpp.eval_callback import run_logits
    p = write_tiny(tmp_path / f"{arch}.gguf", arch, n_layer=2, n_embd=64, n_head=4, n_head_kv=2, n_ff=128,
                   vocab_from=models.resolve(vocab_of), head_dim=16 if arch == "gemma3" else None)
    ids = [1, 5, 100, 2000, 7, 8, 9, 10, 11, 12]
    want = run_logits(p, ids).reshape(len(ids), -1)
    got = Context(Model(p), n_ctx=256).decode(Batch.from_tokens(ids, logits="all"))
    assert (got.argmax(1) == want.argmax(1)).all()
    assert np.abs(got - want).max() <= 2e-4 * np.abs(want).max()
