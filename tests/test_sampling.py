"""The sampler chain: each sampler on a distribution worked out by hand, seeds, the chain's order,
and llama.cpp's own samplers (llama-cpp-python, no model needed) as the oracle."""
from __future__ import annotations

import zlib

import numpy as np
import pytest

from llmlab import LLMLabError
from llmlab.llama.sampling import (MT19937, Dist, Greedy, MinP, Penalties, SamplerChain, SamplingParams, Temp,
                                   TokenDataArray, TopK, TopP, Typical, common_sampler_init, top_k_order)

P5 = np.array([0.5, 0.2, 0.15, 0.1, 0.05])
PERM = np.array([3, 0, 4, 1, 2])               # token i has probability P5[PERM[i]]: ids 1, 3, 4, 0, 2 by rank


def cands(p=P5, perm=PERM) -> TokenDataArray:
    return TokenDataArray.from_logits(np.log(p[perm]))


def test_top_k_keeps_the_k_best_sorted():
    out = TopK(2)(cands())
    assert out.id.tolist() == [1, 3] and out.sorted
    assert len(TopK(0)(cands())) == 5 and len(TopK(99)(cands())) == 5


def test_top_k_partial_selection_equals_the_stable_sort():
    """top_k_order (a partition, not a sort of the vocabulary) keeps the first k of a stable sort, ties
    at the k-th value included: integer-valued logits with many ties, signed zeros, -inf, NaN."""
    rng = np.random.default_rng(3)
    for trial in range(400):
        n = int(rng.integers(1, 2000))
        x = (rng.integers(-4, 4, n) if trial % 2 else rng.standard_normal(n)).astype(np.float32)
        if trial % 5 == 0:
            x[rng.integers(0, n, 3)] = -np.inf
        if trial % 7 == 0:
            x[: n // 2], x[n // 2:] = 0.0, -0.0
        if trial % 11 == 0:
            x[rng.integers(0, n)] = np.nan
        k = int(rng.integers(1, n + 3))
        assert np.array_equal(top_k_order(x, k), np.argsort(-x, kind="stable")[:k]), (trial, n, k)


def test_top_p_keeps_the_smallest_nucleus():
    assert TopP(0.75)(cands()).id.tolist() == [1, 3, 4]          # 0.5 + 0.2 + 0.15 = 0.85 >= 0.75
    assert TopP(0.4)(cands()).id.tolist() == [1]
    assert TopP(0.4, min_keep=3)(cands()).id.tolist() == [1, 3, 4]
    np.testing.assert_allclose(TopP(0.75)(cands()).p, [0.5, 0.2, 0.15], rtol=1e-6)   # p of the full softmax
    assert len(TopP(1.0)(cands())) == 5


def test_min_p_is_relative_to_the_best_token():
    out = MinP(0.25)(cands())                                   # p >= 0.25 * 0.5 = 0.125
    assert sorted(out.id.tolist()) == [1, 3, 4] and out.id.tolist() == [1, 3, 4] and not out.sorted
    assert MinP(0.25)(TopK(5)(cands())).id.tolist() == [1, 3, 4]   # the sorted path agrees
    assert MinP(0.9, min_keep=2)(cands()).id.tolist() == [1, 3]


def test_typical_can_drop_the_most_likely_token():
    # entropy of (0.4, 0.15 x 4) is 1.505 nats; -ln 0.15 = 1.897 is closer to it than -ln 0.4 = 0.916
    p = np.array([0.4, 0.15, 0.15, 0.15, 0.15])
    out = Typical(0.35)(TokenDataArray.from_logits(np.log(p)))
    assert out.id.tolist() == [1, 2, 3]
    assert Typical(0.97)(TokenDataArray.from_logits(np.log(p))).id.tolist() == [1, 2, 3, 4, 0]


def test_temperature_scales_and_zero_is_greedy():
    c = cands()
    np.testing.assert_array_equal(Temp(2.0)(c).logit, c.logit / np.float32(2))
    z = Temp(0.0)(c)
    assert np.isfinite(z.logit).sum() == 1 and z.id[np.isfinite(z.logit)][0] == 1
    rng = np.random.default_rng(1)
    for seed in range(20):
        logits = rng.standard_normal(1000).astype(np.float32)
        assert common_sampler_init(SamplingParams(temp=0.0, seed=seed)).sample(logits) == int(np.argmax(logits))
        assert SamplerChain([Greedy()]).sample(logits) == int(np.argmax(logits))


def test_penalties_repeat_frequency_presence_over_the_last_n():
    pen = Penalties(last_n=2, repeat=2.0, freq=0.5, present=0.25)
    for t in (2, 2, 3):                                          # the window keeps (2, 3): one each
        pen.accept(t)
    out = pen(TokenDataArray.from_logits([1.0, 1.0, 4.0, -1.0]))
    np.testing.assert_array_equal(out.logit, [1.0, 1.0, 4.0 / 2 - 0.75, -1.0 * 2 - 0.75])
    pen.accept(2)                                                # window (3, 2): still one each
    pen.accept(2)                                                # window (2, 2): 3 leaves, 2 counts twice
    out = pen(TokenDataArray.from_logits([1.0, 1.0, 4.0, -1.0]))
    np.testing.assert_array_equal(out.logit, [1.0, 1.0, 4.0 / 2 - 1.25, -1.0])
    pen.reset()
    assert pen(TokenDataArray.from_logits([4.0])).logit.tolist() == [4.0]


def test_mt19937_is_the_standard_generator():
    # the C++ standard fixes the 10000th output of a default-constructed std::mt19937 (seed 5489)
    g = MT19937(5489)
    assert g.next_u32() == 3499211612
    for _ in range(9998):
        g.next_u32()
    assert g.next_u32() == 4123659995
    u = [MT19937(42).uniform() for _ in range(3)]
    assert len(set(u)) == 1 and 0.0 <= u[0] < 1.0


def draws(dist: Dist, logits, n: int) -> list[int]:
    out = []
    for _ in range(n):
        cur = TokenDataArray.from_logits(logits)
        dist.apply(cur)
        out.append(cur.token)
    return out


def test_dist_same_seed_same_tokens_and_frequencies_follow_p():
    logits = np.log(P5[PERM])
    assert draws(Dist(7), logits, 50) == draws(Dist(7), logits, 50)
    assert draws(Dist(7), logits, 50) != draws(Dist(8), logits, 50)
    d = Dist(7)
    first = draws(d, logits, 20)
    d.reset()
    assert draws(d, logits, 20) == first
    freq = np.bincount(draws(Dist(3), logits, 4000), minlength=5) / 4000
    np.testing.assert_allclose(freq, P5[PERM], atol=0.03)
    assert Dist().seed_cur != Dist().seed_cur                    # no seed: a fresh one each time


def test_seeded_generation_is_reproducible():
    rng = np.random.default_rng(5)
    rows = [rng.standard_normal(500).astype(np.float32) * 2 for _ in range(30)]

    def run(seed):
        chain = common_sampler_init(SamplingParams(seed=seed, temp=1.2, top_k=0, penalty_repeat=1.2))
        return [chain.sample(r) for r in rows]
    assert run(11) == run(11) and run(11) != run(12)


def test_default_chain_order_is_llama_cpp_s():
    ch = common_sampler_init(SamplingParams(seed=1))
    assert [s.name for s in ch.samplers] == ["penalties", "top-k", "typical", "top-p", "min-p", "temp", "dist"]
    p = SamplingParams()
    assert (p.top_k, p.top_p, p.min_p, p.typ_p, p.temp, p.penalty_last_n, p.penalty_repeat) == (40, 0.95, 0.05, 1.0, 0.8, 64, 1.0)
    steps = ch.trace(np.log(P5[PERM]))
    assert [n for n, _ in steps] == ["logits"] + [s.name for s in ch.samplers]
    assert 0 <= steps[-1][1].selected < len(steps[-1][1])


def test_order_matters_temperature_before_or_after_min_p():
    logits = np.log([0.5, 0.3, 0.2])
    temp_first = SamplingParams(samplers=("temperature", "min_p"), temp=0.5, min_p=0.5, seed=0)
    temp_last = SamplingParams(samplers=("min_p", "temperature"), temp=0.5, min_p=0.5, seed=0)
    assert len(common_sampler_init(temp_first).trace(logits)[2][1]) == 1     # (0.6)², (0.4)² < 0.5
    assert len(common_sampler_init(temp_last).trace(logits)[1][1]) == 2      # 0.6 >= 0.5 > 0.4


def test_bad_parameters_are_refused():
    for bad in (dict(penalty_repeat=0.0), dict(temp=float("nan")), dict(samplers=("top_k", "xtc")), dict(seed=-1)):
        with pytest.raises(LLMLabError):
            SamplingParams(**bad)
    with pytest.raises(LLMLabError, match="selector"):
        SamplerChain([TopK(3)]).sample([1.0, 2.0, 3.0, 4.0])


# ---- llama.cpp's own samplers as the oracle ---------------------------------------------------------------
CONFIGS = [dict(), dict(top_k=0), dict(top_k=0, top_p=1.0), dict(temp=0.0), dict(top_k=0, typ_p=0.5, min_p=0.0),
           dict(temp=1.5, top_p=0.5, min_p=0.2, min_keep=3),
           dict(penalty_repeat=1.5, penalty_freq=0.5, penalty_present=0.5, penalty_last_n=8),
           dict(samplers=("temperature", "top_k", "min_p"), temp=2.0)]


@pytest.mark.parametrize("cfg", CONFIGS, ids=[",".join(f"{k}={v}" for k, v in c.items()) or "defaults" for c in CONFIGS])
def test_chain_equals_llama_cpp_draw_for_draw(cfg):
    """Same seed, same history, same logits: llama.cpp's candidates (ids, logits, order, sorted flag)
    and its token, step after step; probabilities to 2 ulps (glibc's expf vs numpy's exp)."""
    pytest.importorskip("llama_cpp", reason="llama-cpp-python is the oracle for the samplers")
    from llmlab.llamacpp.sampling import LlamaCppChain
    rng = np.random.default_rng(zlib.crc32(str(cfg).encode()))   # hash() of a str changes per process
    for n_vocab in (50, 3000, 49152):
        p = SamplingParams(seed=int(rng.integers(0, 2**32 - 1)), **cfg)
        ours = common_sampler_init(p)
        with LlamaCppChain(p, n_vocab) as ref:
            for t in rng.integers(0, n_vocab, 70):        # a prompt the penalties remember
                ref.accept(t)
                ours.accept(int(t))
            for _ in range(4):
                logits = (rng.standard_normal(n_vocab) * 3).astype(np.float32)
                want, got = ref.apply(logits), TokenDataArray.from_logits(logits)
                ours.apply(got)
                assert got.token == want.token
                np.testing.assert_array_equal(got.id, want.id)
                np.testing.assert_array_equal(got.logit, want.logit)
                assert got.sorted == want.sorted
                np.testing.assert_array_max_ulp(got.p, want.p, 2)
                ref.accept(want.token)
                ours.accept(got.token)
