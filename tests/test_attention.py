"""llmlab.attention: the NumPy reference, flash attention's tiled twin, the engine hook, KV-size variants,
and the float32 (no activation quantization) path."""
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from llmlab import attention as A
from llmlab.ggml import GGMLContext
from llmlab.ggml import build_forward_expand, CGraph, graph_compute, ops as ggml
from llmlab.ggml.cpu.float_path import f32_activations, mul_mat_f32
from llmlab.llama.kv_cache import kv_cache_bytes
from llmlab.llama import Batch, Context, Model
from llmlab.llama.tiny import write_tiny

TOKENS = [5, 17, 99, 3, 42, 7, 11, 200, 64, 1]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    d = tmp_path_factory.mktemp("tinyattn")
    return {a: Model(write_tiny(d / f"{a}.gguf", a, n_layer=3, seed=4, sliding_window=4)) for a in ("llama", "gemma3")}


def _qkv(rng, n_head, n_head_kv, n_q, n_kv, d):
    return (rng.standard_normal((n_head, n_q, d)), rng.standard_normal((n_head_kv, n_kv, d)),
            rng.standard_normal((n_head_kv, n_kv, d)))


# ---- the reference ------------------------------------------------------------------------------

def test_steps_compose_to_attention():
    rng = np.random.default_rng(0)
    q, k, v = _qkv(rng, 6, 2, 7, 7, 8)
    mask = A.causal_mask(7)
    s = A.scores(q, k, 0.3)
    assert s.shape == (6, 7, 7)
    # GQA: query head 4 reads KV head 4 // 3 = 1
    np.testing.assert_allclose(s[4], 0.3 * q[4] @ k[1].T)
    p = A.softmax(s + mask)
    np.testing.assert_allclose(p.sum(-1), 1)
    assert (p[:, 0, 1:] == 0).all() and (np.triu(p[2], 1) == 0).all()
    o = A.weighted_sum(p, v)
    np.testing.assert_allclose(o, A.attention(q, k, v, mask, 0.3))
    x = A.merge_heads(o)
    assert x.shape == (7, 6 * 8)
    np.testing.assert_array_equal(A.split_heads(x, 6), o)
    np.testing.assert_array_equal(x[:, 8:16], o[1])            # head 1 is the second slice of every row


def test_mask_window_and_fully_masked_rows():
    m = A.causal_mask(5, window=2)
    assert np.isfinite(m).sum(1).tolist() == [1, 2, 2, 2, 2]
    p = A.softmax(np.full((1, 2, 3), -np.inf))
    assert (p == 0).all()
    with pytest.raises(ValueError, match="share"):
        A.repeat_kv(np.zeros((4, 1, 1)), 6)
    with pytest.raises(ValueError, match="multiple"):
        A.split_heads(np.zeros((2, 10)), 3)


@settings(max_examples=40, deadline=None)
@given(n_q=st.integers(1, 40), extra=st.integers(0, 20), bq=st.integers(1, 17), bk=st.integers(1, 17),
       g=st.sampled_from([(4, 4), (4, 2), (4, 1)]), window=st.integers(0, 6), seed=st.integers(0, 2**16))
def test_flash_equals_naive(n_q, extra, bq, bk, g, window, seed):
    rng = np.random.default_rng(seed)
    n_kv = n_q + extra                                 # the queries sit at the end, as after a prefix
    q, k, v = _qkv(rng, g[0], g[1], n_q, n_kv, 8)
    q *= 3                                             # large scores: the running max must grow and rescale
    mask = A.causal_mask(n_q, n_kv, q_pos=np.arange(extra, n_kv), window=window)
    o, stats = A.flash_attention(q, k, v, mask, 0.5, block_q=bq, block_k=bk, return_stats=True)
    np.testing.assert_allclose(o, A.attention(q, k, v, mask, 0.5), rtol=1e-12, atol=1e-12)
    assert stats.peak_scores <= bq * bk
    assert stats.tiles_computed + stats.tiles_skipped == -(-n_q // bq) * -(-n_kv // bk)


def test_flash_skips_the_causal_upper_tiles():
    rng = np.random.default_rng(1)
    q, k, v = _qkv(rng, 2, 2, 64, 64, 4)
    _, stats = A.flash_attention(q, k, v, A.causal_mask(64), 1.0, 16, 16, return_stats=True)
    assert (stats.tiles_computed, stats.tiles_skipped) == (10, 6)    # 4x4 tiles: 10 on or below the diagonal


# ---- the engine hook -------------------------------------------------------------------------------

@pytest.mark.parametrize("arch", ["llama", "gemma3"])
def test_trace_records_what_the_graph_computed(tiny, arch):
    m = tiny[arch]
    hp = m.hparams
    tr = A.trace(m, TOKENS)
    n = len(TOKENS)
    ref_ctx = Context(m, n_ctx=n, n_batch=n, n_ubatch=n)
    logits = ref_ctx.decode(Batch.from_tokens(TOKENS, logits="last"),
                            capture=lambda t: t.name.startswith(("kq_soft_max-", "kqv_out-")))
    np.testing.assert_array_equal(tr.logits, logits)              # the hook changes nothing
    assert sorted(tr.layers) == list(range(hp.n_layer))
    for il in range(hp.n_layer):
        L = tr[il]
        n_kv = L.k.shape[1]
        assert L.q.shape == (hp.n_head, n, hp.n_embd_head_k) and L.k.shape == (hp.n_head_kv, n_kv, hp.n_embd_head_k)
        assert L.v.shape == (hp.n_head_kv, n_kv, hp.n_embd_head_v) and L.mask.shape == (n, n_kv)
        p = tr.probs(il, trim=False)
        assert p.shape == (hp.n_head, n, n_kv)
        np.testing.assert_array_equal(p, ref_ctx.captured[f"kq_soft_max-{il}"])
        assert tr.probs(il).shape == (hp.n_head, n, n)
        np.testing.assert_array_equal(L.kqv_out, ref_ctx.captured[f"kqv_out-{il}"].reshape(n, -1))
        # the plain math on the recorded operands gives the engine's results. ggml multiplies f16 by f16
        # (the K and V cache): Q and the probabilities are rounded to f16 first. With those roundings the
        # steps agree to float32 noise; without them, to the f16 step (2^-11 relative) they cause.
        f16 = lambda x: x.astype(np.float16).astype(np.float64)            # noqa: E731
        s = A.scores(f16(L.q), L.k)
        np.testing.assert_allclose(s, L.kq, rtol=1e-5, atol=1e-5 * np.abs(L.kq).max())
        np.testing.assert_allclose(A.softmax(L.kq * L.scale + L.mask), p, atol=1e-6)
        np.testing.assert_allclose(A.merge_heads(A.weighted_sum(f16(p), L.v)), L.kqv_out,
                                   rtol=1e-5, atol=1e-5 * np.abs(L.kqv_out).max())
        o, pr = A.attention(L.q, L.k, L.v, L.mask, L.scale, return_probs=True)
        np.testing.assert_allclose(pr, p, atol=2e-3)
        np.testing.assert_allclose(A.merge_heads(o), L.kqv_out, atol=5e-3 * np.abs(L.kqv_out).max())
        # local (sliding-window) layers see only the last n_swa positions
        visible = np.isfinite(L.mask[:, :n]).sum(1)
        want = np.minimum(np.arange(1, n + 1), hp.n_swa) if hp.is_swa(il) else np.arange(1, n + 1)
        np.testing.assert_array_equal(visible, want)
    if arch == "gemma3":
        assert any(hp.is_swa(il) for il in range(hp.n_layer))


def test_trace_continues_a_context_and_attention_probs(tiny):
    m = tiny["llama"]
    ctx = Context(m, n_ctx=32)
    ctx.decode(Batch.from_tokens(TOKENS[:6], logits="last"))
    tr = A.trace(m, TOKENS[6:], layers=[1], context=ctx)
    assert list(tr.layers) == [1]
    p = tr.probs(1)
    assert p.shape == (m.hparams.n_head, 4, 10)                     # 4 new queries see all 10 cells
    whole = A.attention_probs(m, TOKENS, layers=[1])[1]
    np.testing.assert_allclose(p, whole[:, 6:], atol=1e-6)
    full = A.trace(m, TOKENS)
    ranked = full.rank_heads(5, [2, 3])
    assert len(ranked) == 3 * m.hparams.n_head and ranked[0][0] >= ranked[-1][0]
    w, il, h = ranked[0]
    assert w == pytest.approx(full.probs(il)[h, 5, [2, 3]].sum())
    with pytest.raises(ValueError, match="out of range"):
        A.trace(m, TOKENS, layers=[3])
    with pytest.raises(ValueError, match="flash"):
        A.trace(m, TOKENS, context=Context(m, n_ctx=32, flash_attn=True))
    with pytest.raises(ValueError, match="at least one"):
        A.trace(m, [])


def test_engine_flash_path_agrees_with_naive(tiny):
    m = tiny["gemma3"]
    outs = []
    for fa in (False, True):
        ctx = Context(m, n_ctx=16, flash_attn=fa)
        ctx.decode(Batch.from_tokens(TOKENS, logits="last"), capture=["kqv_out-0", "kqv_out-1"])
        outs.append(ctx.captured)
    for name in ("kqv_out-0", "kqv_out-1"):
        a, b = outs[0][name], outs[1][name]
        np.testing.assert_allclose(a, b, atol=3e-3 * np.abs(b).max())   # f16 roundings on both paths


# ---- KV-size variants ----------------------------------------------------------------------------------

def test_kv_sizes_follow_llama_cpp_formula(tiny):
    s = A.SEED_MODELS
    # the seed's table: n_ctx x n_layer x 2 x n_embd_gqa x 2 bytes
    assert s["LLaMA-7B"].kv_bytes(2048) == 2048 * 32 * 2 * 4096 * 2 == 2**30
    assert s["LLaMA-2-70B"].kv_bytes(2048) == 2048 * 80 * 2 * 1024 * 2
    assert s["LLaMA-7B"].kind == "MHA" and s["LLaMA-2-70B"].kind == "GQA" and s["DeepSeek-V2"].kind == "MLA"
    assert s["DeepSeek-V2"].per_token_layer == 576
    for arch, kind in (("llama", "GQA"), ("gemma3", "GQA")):
        hp = tiny[arch].hparams
        sh = A.shape_of(arch, hp)
        assert sh.kind == kind
        assert sh.kv_bytes(512) == kv_cache_bytes(512, hp.n_layer, hp.n_embd_k_gqa, hp.n_embd_v_gqa, "f16")
    mqa = s["LLaMA-7B"].with_kv_heads(1)
    assert mqa.kind == "MQA" and mqa.saving == 32
    with pytest.raises(ValueError, match="cannot be shared"):
        s["LLaMA-7B"].with_kv_heads(5)
    rows = A.kv_table(s.values(), n_ctx=2048)
    assert rows[0]["KV @ 2048 (MiB)"] == 1024.0


# ---- float32 path without activation quantization -------------------------------------------------------

def test_f32_activations_skips_the_8_bit_rounding():
    from llmlab.ggml.quant import dequantize, quantize
    from llmlab.ggml.types import ggml_type
    rng = np.random.default_rng(3)
    K, M, N = 64, 16, 3
    W = rng.standard_normal((M, K)).astype(np.float32)
    X = rng.standard_normal((N, K)).astype(np.float32)
    for tname in ("q4_0", "q4_k"):
        t = ggml_type(tname)
        KK = 256 if tname == "q4_k" else K
        W2 = np.resize(W, (M, KK)).astype(np.float32)
        X2 = np.resize(X, (N, KK)).astype(np.float32)
        raw = quantize(W2.reshape(-1), t).reshape(M, -1)
        Wd = np.asarray(dequantize(raw, t), np.float32).reshape(M, KK)
        np.testing.assert_allclose(mul_mat_f32(raw, t, X2), X2 @ Wd.T, rtol=1e-5, atol=1e-5)
        ctx = GGMLContext(no_alloc=True)
        a = ggml.new_tensor(ctx, t, KK, M, name="w")
        a.data = raw.reshape(-1).copy()
        b = ggml.new_tensor(ctx, "f32", KK, N, name="x")
        b.set_data(X2)
        out = ggml.mul_mat(ctx, a, b)
        g = CGraph()
        build_forward_expand(g, out)
        graph_compute(g)
        exact = out.numpy().copy()
        graph_compute(g, dispatch=f32_activations)
        flt = out.numpy().copy()
        np.testing.assert_allclose(flt, X2 @ Wd.T, rtol=1e-5, atol=1e-4)
        # the exact path quantized X to 8 bits first: close, but not the same numbers
        assert not np.array_equal(flt, exact)
        np.testing.assert_allclose(exact, flt, atol=0.05 * np.abs(flt).max())


def test_decode_dispatch_needs_the_plain_path(tiny):
    m = tiny["llama"]
    a = Context(m, n_ctx=16).decode(Batch.from_tokens(TOKENS, logits="last"))
    b = Context(m, n_ctx=16).decode(Batch.from_tokens(TOKENS, logits="last"), dispatch=f32_activations)
    np.testing.assert_array_equal(a, b)            # f32 weights: nothing to change
    ctx = Context(m, n_ctx=16, sched=object())
    with pytest.raises(ValueError, match="dispatch"):
        ctx.decode(Batch.from_tokens(TOKENS, logits="last"), dispatch=f32_activations)


def test_probs_are_llama_cpps(smollm2_path):
    """The hook's probabilities are llama.cpp's own kq_soft_max nodes, bit for bit (SmolLM2, non-flash)."""
    pytest.importorskip("llama_cpp", reason="llama-cpp-python is not installed (optional oracle)")
    from llmlab import llamacpp
    from llmlab.llama.vocab import Tokenizer
    ids = Tokenizer.from_model(smollm2_path).tokenize("Apple released a new phone, and its price rose.")
    layers = [0, 13, 29]
    cap = llamacpp.capture(smollm2_path, ids, flash_attn=False, output="last",
                           values=[f"kq_soft_max-{il}" for il in layers])
    tr = A.trace(Model(smollm2_path), ids, layers=layers)
    for il in layers:
        theirs = cap[f"kq_soft_max-{il}"].values.reshape(tr[il].probs.shape)
        np.testing.assert_array_equal(tr.probs(il, trim=False), theirs)
