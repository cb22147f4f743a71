"""A prompt's f16 products (kq, kqv) through tinyBLAS's numba twin (fast.sgemm): the bits of the NumPy
tinyBLAS (llmlab.ggml.cpu.sgemm) on both x86 profiles, on SmolLM2's and Gemma 3's shapes and odd ones
(tiles cut by the row and activation counts), on the KV cache's strided views, with -0, infinities and
1 or 2 threads; and the plan binds it for a prompt's kq and kqv."""
from __future__ import annotations

import numpy as np
import pytest

from llmlab.ggml import GGMLContext, build_forward, graph_compute, ops as ggml
from llmlab.ggml.cpu import profiles
from llmlab.ggml.cpu.cplan import graph_plan
from llmlab.ggml.cpu.fast import sgemm as fsgemm
from llmlab.ggml.cpu.fast.twins import FLOAT
from llmlab.ggml.tensor import F16, Tensor
from kernel_data import same_bits

TWIN = FLOAT["sgemm_f16"]
rng = np.random.default_rng(23)


@pytest.fixture(params=["avx512", "avx2"])
def cpu(request):
    return profiles.get(request.param)


def reference(cache: np.ndarray, B: np.ndarray, g: int, cpu) -> np.ndarray:
    """The NumPy tinyBLAS (sgemm.mul_mat_f16) per head: cache (Hk, R, K) float16, B (H, T, K) float32."""
    Bh = B.astype(np.float16)
    return np.stack([TWIN.reference(cache[h // g], Bh[h], cpu) for h in range(B.shape[0])])


SHAPES = {                        # Hk, heads per kv head, R (weight rows), T (activation rows), K
    "smollm2_kq": (3, 3, 40, 6, 64),
    "gemma3_kq": (1, 4, 33, 5, 256),
    "kqv": (2, 2, 64, 7, 48),     # K = cells, R = head dim
    "one_tile": (1, 1, 4, 4, 16),
    "two_rows": (2, 3, 13, 2, 32),
}


@pytest.mark.parametrize("shape", list(SHAPES))
@pytest.mark.parametrize("n_threads", [1, 2])
def test_equals_tinyblas_reference(shape, n_threads, cpu):
    Hk, g, R, T, K = SHAPES[shape]
    if K % cpu.sgemm_lanes:
        pytest.skip("tinyBLAS declines K")
    rows = (rng.standard_normal((R, Hk, K + 16)) * 2).astype(np.float16)     # cache rows, padded as a view
    A = rows.view(np.uint16).transpose(1, 0, 2)[:, :, 8:K + 8]
    B = (rng.standard_normal((Hk * g, T, K)) * 3).astype(np.float32)
    out = np.full((Hk * g, T, R), np.nan, np.float32)
    TWIN.kernel(A, B, out, cpu.sgemm_lanes, n_threads)
    assert same_bits(out, reference(rows.transpose(1, 0, 2)[:, :, 8:K + 8], B, g, cpu))


def test_signed_zero_and_infinity(cpu):
    """Registers start at +0 (zero rows against a negative query give +0, not -0); an activation past
    f16's range rounds to infinity and gives +-inf outputs (NaN against the zero rows), as in tinyBLAS."""
    R, T, K = 12, 3, 64
    cache = rng.standard_normal((1, R, K)).astype(np.float16)
    cache[0, :4] = 0
    cache[0, 4:8] = -0.0
    B = -np.abs(rng.standard_normal((2, T, K))).astype(np.float32) - 0.5
    B[1, 2, 5] = 1e6                                          # f16(1e6) = inf
    cache[0, 8:, 5] = np.array([1, -1, 2, -3], np.float16)
    with np.errstate(over="ignore", invalid="ignore"):
        want = reference(cache, B, 2, cpu)
    assert not want[0, :, :8].view(np.uint32).any()           # +0
    assert np.isinf(want[1, 2, 8:]).all() and np.isnan(want[1, 2, :8]).all()
    out = np.empty_like(want)
    fsgemm.mul_mat_f16(cache.view(np.uint16), B, out, cpu.sgemm_lanes, 1)
    assert same_bits(out, want)


def test_profiles_it_fits():
    """Both x86 profiles have tinyBLAS's halving tree; ARM's tinyBLAS accumulates in float16 (vec_f16)."""
    assert fsgemm.fits(profiles.get("avx512")) and fsgemm.fits(profiles.get("avx2"))
    assert not fsgemm.fits(profiles.get("arm_dotprod_fp16"))
    assert fsgemm.halving(8) == (((0, 4), (2, 6)), ((1, 5), (3, 7)))


def _cache(rows, D, Hk, ctx):
    t = Tensor(F16, (D * Hk, rows.shape[0]), name="cache", data=rows.reshape(-1).view(np.uint8))
    return ggml.view_3d(ctx, t, D, Hk, rows.shape[0], t.type.row_size(D), t.type.row_size(D * Hk), 0)


@pytest.mark.parametrize("T", [2, 9])
def test_plan_runs_a_prompts_kq_and_kqv_through_it(T, cpu, monkeypatch):
    """A prompt's kq (K cache rows against the queries) and kqv (V^T against the probabilities) in a
    plan: tinyBLAS's twin, with the reference executor's bits."""
    H, Hk, R, D = 4, 2, 32, 32
    ctx = GGMLContext()
    k = _cache(rng.standard_normal((R, Hk * D)).astype(np.float16), D, Hk, ctx)
    vt = ggml.new_tensor(ctx, "f16", R, D, Hk)                 # the V cache, transposed (no flash attention)
    vt.set_data(rng.standard_normal(R * D * Hk).astype(np.float16).reshape(vt.array().shape))
    q = ggml.new_tensor(ctx, "f32", D, H, T)
    q.set_data(rng.standard_normal(D * H * T).astype(np.float32).reshape(q.array().shape))
    kq = ggml.mul_mat(ctx, ggml.permute(ctx, k, 0, 2, 1, 3), ggml.permute(ctx, q, 0, 2, 1, 3))
    p = ggml.soft_max_ext(ctx, kq, None, 0.125, 0.0)
    out = ggml.mul_mat(ctx, vt, p)
    g = build_forward(out)
    graph_compute(g, cpu=cpu)
    want_kq, want = kq.numpy().copy(), out.numpy().copy()
    calls = []
    plain = fsgemm.mul_mat_f16
    monkeypatch.setattr(fsgemm, "mul_mat_f16", lambda *a: calls.append(a[0].shape) or plain(*a))
    plan = graph_plan(g.nodes, cpu=cpu)
    out.array()[...] = 0
    got = plan.compute(capture=lambda n: n is kq)
    assert calls == [(Hk, R, D), (Hk, D, R)]
    assert same_bits(got[kq.name], want_kq) and same_bits(out.numpy(), want)
