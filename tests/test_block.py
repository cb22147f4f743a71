"""llmlab.block: the references of RMSNorm, RoPE and the gated FFN equal the engine's own nodes bit for bit,
the residual stream adds up, RoPE's properties hold, and notebook 03's block checkers tell right from wrong."""
import numpy as np
import pytest

from llmlab import block as B
from llmlab.llama import Model
from llmlab.llama.tiny import write_tiny
from llmlab.nb import exercises as ex

TOKENS = [5, 17, 99, 3, 42, 7, 11, 200, 64, 1]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    d = tmp_path_factory.mktemp("tinyblock")
    return {a: Model(write_tiny(d / f"{a}.gguf", a, n_layer=3, seed=5, sliding_window=4))
            for a in ("llama", "qwen2", "gemma3")}


def _check_trace(model, tr, n_tokens):
    hp = model.hparams
    assert sorted(tr.layers) == list(range(hp.n_layer)) and tr.embd.shape == (n_tokens, hp.n_embd)
    for il in range(hp.n_layer):
        L = tr[il]
        assert np.array_equal(B.rms_norm(L.x, tr.eps), L.normed)
        assert np.array_equal(B.rms_norm(L.x, tr.eps, L.norm_w), L.attn_norm)
        base = hp.rope_base(il)
        for pre, post in ((L.q_pre, L.q), (L.k_pre, L.k)):
            assert np.array_equal(B.rope(pre, L.pos, tr.rope_mode, base, hp.n_rot), post)
            np.testing.assert_allclose(B.rope_f64(pre, L.pos, tr.rope_mode, base), post, atol=1e-5 * np.abs(post).max())
        assert np.array_equal(B.glu(L.gate, L.up, tr.act), L.glu)
        assert np.array_equal((L.x + L.attn).astype(np.float32), L.mid)       # the two additions of the stream
        assert np.array_equal((L.mid + L.ffn).astype(np.float32), L.out)
        if il:
            assert np.array_equal(L.x, tr[il - 1].out)
    assert tr.stream_rms().shape == (hp.n_layer + 1, n_tokens)
    assert tr.contributions().shape == (hp.n_layer, 2, n_tokens)


@pytest.mark.parametrize("arch,mode,act", [("llama", "norm", "silu"), ("qwen2", "neox", "silu"),
                                           ("gemma3", "neox", "gelu")])
def test_block_nodes_bit_exact_tiny(tiny, arch, mode, act):
    tr = B.trace(tiny[arch], TOKENS)
    assert (tr.rope_mode, tr.act) == (mode, act)
    from llmlab.viz.block import block_steps          # the diagram names nodes the graph really has
    assert all(f"{name}-0" in tr.names for name, _, _ in block_steps(arch))
    _check_trace(tiny[arch], tr, len(TOKENS))


def test_block_nodes_bit_exact_smollm2(smollm2_path):
    m = Model(smollm2_path)
    tr = B.trace(m, TOKENS)
    _check_trace(m, tr, len(TOKENS))
    # the stream equals the embedding plus every branch's addition (to float32 rounding of the sums)
    total = tr.embd.astype(np.float64) + sum(tr[il].attn.astype(np.float64) + tr[il].ffn for il in range(4))
    np.testing.assert_allclose(total, tr[3].out, atol=1e-5 * np.abs(tr[3].out).max())
    assert ex.check_stream(tr, 3, 2, total[2]).ok
    assert not ex.check_stream(tr, 3, 2, total[2] - tr.embd[2]).ok


def test_rope_pairs_freqs_and_relative_property():
    assert B.rope_pairs(8, "norm").tolist() == [[0, 1], [2, 3], [4, 5], [6, 7]]
    assert B.rope_pairs(8, "neox").tolist() == [[0, 4], [1, 5], [2, 6], [3, 7]]
    with pytest.raises(ValueError):
        B.rope_pairs(8, "glm")
    np.testing.assert_allclose(B.rope_freqs(4, 10000.0), [1.0, 0.01])
    rng = np.random.default_rng(1)
    q, k = rng.standard_normal(16), rng.standard_normal(16)
    for mode in B.ROPE_PAIRING:
        s = B.rope_scores(q, k, range(12), range(12), mode, 100.0)
        for d in range(-11, 12):      # constant along every diagonal: a function of m - n alone
            np.testing.assert_allclose(np.diagonal(s, d), np.diagonal(s, d)[0], rtol=1e-12, atol=1e-12)
        assert np.allclose(np.linalg.norm(B.rope_f64(q, 7, mode, 100.0)), np.linalg.norm(q))
        assert not np.allclose(s[0], s[0, 0])


def test_block_checkers():
    x, w = np.array([1.0, -2.0, 3.0, 0.0]), np.array([1.0, 0.5, 2.0, 1.0])
    rms = np.sqrt((x * x).mean() + 1e-6)
    assert ex.check_rms_norm(x, w, 1e-6, x / rms * w).ok
    c = x - x.mean()
    v = ex.check_rms_norm(x, w, 1e-6, c / np.sqrt((c * c).mean() + 1e-6) * w)
    assert not v.ok and "LayerNorm" in v.message
    assert "weight" in ex.check_rms_norm(x, w, 1e-6, x / rms).message
    assert ex.check_rms_norm(x, w, 1e-6, None).message.startswith("no answer yet")

    v4 = np.array([1.0, 2.0, 3.0, 4.0])
    t0, t1 = 1.0, 0.01
    norm = [np.cos(t0) - 2 * np.sin(t0), np.sin(t0) + 2 * np.cos(t0), 3 * np.cos(t1) - 4 * np.sin(t1), 3 * np.sin(t1) + 4 * np.cos(t1)]
    assert ex.check_rope(v4, 1, 10000.0, "norm", norm).ok
    assert "NEOX" in ex.check_rope(v4, 1, 10000.0, "norm", B.rope_f64(v4, 1, "neox", 10000.0)).message
    assert "other way" in ex.check_rope(v4, 1, 10000.0, "norm", B.rope_f64(v4, -1, "norm", 10000.0)).message

    g, u = np.array([-2.0, 0.0, 1.0, 3.0]), np.array([1.0, 2.0, -1.0, 0.5])
    silu = g / (1 + np.exp(-g))
    assert ex.check_swiglu(g, u, silu * u).ok
    assert "wrong projection" in ex.check_swiglu(g, u, u / (1 + np.exp(-u)) * g).message
    assert "sigmoid" in ex.check_swiglu(g, u, u / (1 + np.exp(-g))).message
    assert "no activation" in ex.check_swiglu(g, u, g * u).message


def test_block_trace_rejects_bad_input(tiny):
    with pytest.raises(ValueError):
        B.trace(tiny["llama"], [])
    with pytest.raises(ValueError):
        B.glu(np.zeros(2), np.zeros(2), "relu")
