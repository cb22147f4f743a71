"""A decode step's attention fused into one step (cplan._fuse_attention, fast.vec.attention_f16_tiles):
the bits of the three steps it stands for (kq's tiles, the softmax, kqv's tiles) and of their NumPy
reference (fast.twins.FUSED), on SmolLM2's and Gemma 3's shapes and odd ones, with masked cells (the
trailing ones skipped only where that changes no bit), the journal's re-tiling, and 1 or 2 threads."""
from __future__ import annotations

import numpy as np
import pytest

from llmlab.ggml import GGMLContext, build_forward, graph_compute, ops as ggml
from llmlab.ggml.cpu import profiles
from llmlab.ggml.cpu.cplan import graph_plan
from llmlab.ggml.cpu.fast import vec as fvec
from llmlab.ggml.cpu.fast.twins import FUSED
from llmlab.ggml.tensor import F16, Tensor
from kernel_data import same_bits

TWIN = FUSED["attention_one_token"]
rng = np.random.default_rng(11)


@pytest.fixture(params=["avx512", "avx2"])
def cpu(request):
    return profiles.get(request.param)


class Attention:
    """One layer's cache (R cells of Hk kv heads), its query and mask, run fused and as the three steps."""

    def __init__(self, cpu, H, Hk, R, Dk, Dv, scale):
        self.v = fvec.params(cpu)
        self.cpu, self.H, self.Hk, self.R, self.Dk, self.Dv, self.scale = cpu, H, Hk, R, Dk, Dv, np.float32(scale)
        self.kc = (rng.standard_normal((R, Hk, Dk)) * 2).astype(np.float16)        # the cache rows
        self.vc = rng.standard_normal((R, Hk, Dv)).astype(np.float16)
        self.q = rng.standard_normal((H, 1, Dk)).astype(np.float32) * 2
        self.mask = np.zeros((1, R), np.float32)
        self.K = self.kc.view(np.uint16).transpose(1, 0, 2)                          # (Hk, R, Dk) as kq reads it
        self.V = self.vc.view(np.uint16)                                            # (R, Hk, Dv) as kqv reads it
        TW = fvec.TW
        self.fused_state = (np.ones(R, np.uint8), np.ones(R, np.uint8), np.zeros((Hk, -(-R // TW), Dk, TW), np.uint16),
                            np.zeros((Hk, Dv // TW, R, TW), np.uint16), np.zeros((2, R), np.uint8),
                            np.empty((H, 1, R), np.float32), np.empty((H, 1, R), np.float32))
        self.steps_state = (np.ones(R, np.uint8), np.zeros((Hk, -(-R // TW), Dk, TW), np.uint16),
                            np.ones(R, np.uint8), np.zeros((Hk, Dv // TW, R, TW), np.uint16))

    def write(self, cell, k=None, v=None):
        """A writer changes a cell's K and V rows and notes it, as the journal would for every reader."""
        self.kc[cell] = k if k is not None else rng.standard_normal((self.Hk, self.Dk)).astype(np.float16)
        self.vc[cell] = v if v is not None else rng.standard_normal((self.Hk, self.Dv)).astype(np.float16)
        kf, vf = self.fused_state[0], self.fused_state[1]
        kf[cell] = vf[cell] = self.steps_state[0][cell] = self.steps_state[2][cell] = 1

    def fused(self, n_threads, skip=True):
        v = self.v
        out = np.full((self.H, 1, self.Dv), np.nan, np.float32)
        kf, vf, KT, VT, bad, S, P = self.fused_state
        fvec.attention_f16_tiles(self.K, self.q, self.mask, self.scale, self.V, out, v.arr, v.lanes, v.vec_prog,
                                 v.hsum_prog, v.expf, skip, kf, vf, KT, VT, bad, S, P, n_threads)
        return out

    def steps(self):
        """kq (mul_mat_f16_tiles), SOFT_MAX (soft_max), kqv (mul_mat_f16_vt_tiles), as the plan binds them."""
        v, (kf, AT, vf, VT) = self.v, self.steps_state
        kq = np.empty((self.H, 1, self.R), np.float32)
        fvec.mul_mat_f16_tiles(self.K, self.q, kq, v.arr, v.lanes, v.vec_prog, kf, AT, 0)
        p = np.empty_like(kq)
        fvec.soft_max(kq, self.mask, self.scale, p, v.lanes, v.hsum_prog, v.expf)
        out = np.empty((self.H, 1, self.Dv), np.float32)
        fvec.mul_mat_f16_vt_tiles(self.V, p, out, v.arr, v.lanes, v.vec_prog, vf, VT, 0)
        return out

    def reference(self):
        return TWIN.reference(self.q[:, 0], self.kc.transpose(1, 0, 2), self.vc.transpose(1, 0, 2), self.mask[0],
                              self.scale, self.cpu)[:, None, :]

    def check(self, ref=True):
        want = self.steps()
        for n in (1, 2):
            got = self.fused(n)
            assert same_bits(got, want), (n, np.flatnonzero(got.view(np.uint32) != want.view(np.uint32))[:8])
        if ref:
            assert same_bits(self.reference(), want)
        return want


SHAPES = {   # H, Hk, R, Dk, Dv, scale
    "smollm2": (9, 3, 512, 64, 64, 0.125),
    "gemma3": (4, 1, 512, 256, 256, 1.0),
    "mha": (3, 3, 256, 64, 64, 0.125),              # one head a kv head
    "odd": (6, 2, 272, 72, 48, 0.3),                # cells past whole steps, Dk with leftovers, Dv three tiles
}


@pytest.mark.parametrize("shape", SHAPES)
def test_fused_attention_equals_the_three_steps_and_the_reference(shape, cpu):
    """A decode step's fused attention against kq -> softmax -> kqv and the NumPy twin, the last cells
    masked (as after a prompt: they are skipped), then step after step with one more cell let through,
    each written row re-tiled as the journal flags it (a stale tile would show)."""
    a = Attention(cpu, *SHAPES[shape])
    live = a.R // 2 + 3
    a.mask[0, live:] = -np.inf
    a.kc[live + 5:] = 0                                  # unused cells (+0)
    a.vc[live + 5:] = 0
    a.check()
    for _ in range(3):
        a.write(live)
        a.mask[0, live] = 0
        live += 1
        a.check(ref=shape != "gemma3")                  # (the reference is slow on Gemma's heads)
    a.mask[0, :] = 0                                     # every cell let through
    a.check(ref=False)


def test_sliding_window_mask(cpu):
    """Gemma 3's local layers: the first cells masked (out of the window) as well as the last."""
    a = Attention(cpu, *SHAPES["gemma3"])
    a.mask[0, :100] = -np.inf
    a.mask[0, 100 + 512 // 2:] = -np.inf
    a.check()
    a.mask[0, 40:41] = -np.inf                         # and one inside: nothing to skip there
    a.check(ref=False)


@pytest.mark.parametrize("case", ["inf_v", "nan_k", "inf_q", "all_masked", "big_mask", "nan_mask", "neg_zero_v",
                                  "neg_q_zero_k", "tiny_probs"])
def test_masked_cells_are_skipped_only_where_no_bit_changes(case, cpu):
    """Where a skipped cell could change a bit (an inf or NaN in its K or V: inf * 0 is NaN; a query that
    rounds to inf in f16; no cell let through: no finite max; a mask that is not 0 / -inf), every cell is
    computed and the bits are the three steps', NaN payloads included; -0 values (the registers start at
    +0, as ggml's zeroed ones, so a -0 product changes nothing) and probabilities that round to 0 in f16
    are skipped with the same bits."""
    a = Attention(cpu, *SHAPES["smollm2"])
    live = 200
    a.mask[0, live:] = -np.inf
    if case == "inf_v":
        a.vc[400, 1, 7] = np.inf
    elif case == "nan_k":
        a.kc[300, 0, 3] = np.nan
    elif case == "inf_q":
        a.q[4, 0, 9] = 1e5                               # rounds to inf in f16
    elif case == "all_masked":
        a.mask[0, :] = -np.inf
    elif case == "big_mask":
        a.mask[0, live:] = -1e30
    elif case == "nan_mask":
        a.mask[0, 17] = np.nan
    elif case == "neg_zero_v":
        a.vc[:, :, 5] = -0.0                             # a column of -0: the output +0, as the reference's
    elif case == "neg_q_zero_k":
        a.q[:] = -np.abs(a.q) - 0.5                      # every product of a zero row -0: the score +0
        a.kc[:live] = 0
    elif case == "tiny_probs":
        a.q *= 40                                        # most probabilities below f16's smallest subnormal
    want = a.check(ref=case in ("big_mask", "neg_zero_v", "neg_q_zero_k", "tiny_probs"))   # (NaN payloads: the steps')
    if case == "neg_zero_v":
        assert (want[:, :, 5].view(np.uint32) == 0).all()
    if case == "all_masked":
        assert np.isnan(want).all()


def test_fused_attention_skips_nothing_when_told_not_to(cpu):
    a = Attention(cpu, *SHAPES["odd"])
    a.mask[0, 100:] = -np.inf
    want = a.steps()
    assert same_bits(a.fused(2, skip=False), want) and same_bits(a.fused(1, skip=True), want)


def _cache(rows: np.ndarray, D: int, Hk: int, ctx):
    """A cache array (one row per cell, as the KV cache owns it: the journal's rows) and the view
    get_k / get_v take of it, (D, Hk, cells)."""
    t = Tensor(F16, (D * Hk, rows.shape[0]), name="cache", data=rows.reshape(-1).view(np.uint8))
    return ggml.view_3d(ctx, t, D, Hk, rows.shape[0], t.type.row_size(D), t.type.row_size(D * Hk), 0)


def _attention_graph(ctx, H, Hk, R, Dk, Dv, scale, mask):
    """The nodes build_attn_mha makes for one token: kq, soft_max_ext, CONT of V^T, kqv."""
    k = _cache(rng.standard_normal((R, Hk * Dk)).astype(np.float16), Dk, Hk, ctx)
    v = _cache(rng.standard_normal((R, Hk * Dv)).astype(np.float16), Dv, Hk, ctx)
    q = ggml.new_tensor(ctx, "f32", Dk, H, 1)
    q.set_data(rng.standard_normal(Dk * H).astype(np.float32).reshape(q.array().shape))
    m = ggml.new_tensor(ctx, "f32", R, 1)
    m.set_data(mask.reshape(m.array().shape))
    vt = ggml.cont(ctx, ggml.transpose(ctx, ggml.permute(ctx, v, 0, 2, 1, 3)))
    kq = ggml.mul_mat(ctx, ggml.permute(ctx, k, 0, 2, 1, 3), ggml.permute(ctx, q, 0, 2, 1, 3))
    p = ggml.soft_max_ext(ctx, kq, m, scale, 0.0)
    return ggml.mul_mat(ctx, vt, p), kq, p


@pytest.mark.parametrize("shape", ["smollm2", "gemma3", "odd"])
def test_plan_fuses_the_attention_nodes(shape, cpu):
    """In a plan the four nodes (the CONT of V^T, kq, SOFT_MAX, kqv) run as one step with the reference
    executor's bits; with a capture hook every node runs on its own step, with the same bits; a second
    reader of the probabilities keeps them unfused."""
    H, Hk, R, Dk, Dv, scale = SHAPES[shape]
    mask = np.zeros(R, np.float32)
    mask[R - 100:] = -np.inf
    ctx = GGMLContext()
    out, kq, p = _attention_graph(ctx, H, Hk, R, Dk, Dv, scale, mask)
    g = build_forward(out)
    graph_compute(g, cpu=cpu)
    ref = out.numpy()
    plan = graph_plan(g.nodes, cpu=cpu)
    assert plan.n_fused == 3 and len(plan._run) == 1
    out.array()[...] = 0
    plan.compute()
    assert same_bits(out.numpy(), ref)
    out.array()[...] = 0
    got = plan.compute(capture=lambda n: True)
    assert same_bits(got.get(out.name, out.numpy()), ref)
    both = ggml.add(ctx, ggml.sum_rows(ctx, p), ggml.sum_rows(ctx, out))     # the probabilities read twice
    plan2 = graph_plan(build_forward(both).nodes, cpu=cpu)
    assert not any(plan2.nodes[i] is kq for i in plan2.absorbed)


@pytest.fixture(scope="module")
def tiny64(tmp_path_factory):
    """Tiny models whose heads are 64 wide (the fused kernel's tiles take them): SmolLM2's three query
    heads a kv head, Gemma 3's one kv head and its sliding window."""
    from llmlab.llama import Model
    from llmlab.llama.tiny import write_tiny
    d = tmp_path_factory.mktemp("tiny64")
    return {"llama": Model(write_tiny(d / "llama.gguf", "llama", n_layer=2, n_embd=384, n_head=6, n_head_kv=2, seed=3)),
            "gemma3": Model(write_tiny(d / "gemma3.gguf", "gemma3", n_layer=3, n_embd=256, n_head=4, n_head_kv=1, seed=4,
                                       sliding_window=6))}


@pytest.mark.parametrize("arch", ["llama", "gemma3"])
def test_whole_model_decode_steps_with_the_fused_attention(tiny64, arch, cpu):
    """Decode steps of whole (tiny) models on the fast plan, their attention fused, give the reference
    kernels' logits bit for bit, step after step as the cache fills and the window slides."""
    from llmlab.llama import Batch, Context
    outs = {}
    for kernels in ("fast", "reference"):
        ctx = Context(tiny64[arch], n_ctx=64, kernels=kernels, cpu=cpu)
        seq = [ctx.decode(Batch.from_tokens([3, 1, 4, 1, 5, 9, 2, 6, 5, 3], logits="last"))]
        for i, t in enumerate([7, 11, 13, 17, 19, 23, 29]):
            seq.append(ctx.decode(Batch.from_tokens([t], pos0=10 + i, logits="last")))
        if kernels == "fast":
            plan = ctx.backend.plan(ctx.last_graph.gf)
            fused = sum(plan.nodes[i].op == "SOFT_MAX" for i in plan.absorbed)
            assert fused == len(tiny64[arch].layers), fused
        outs[kernels] = seq
    assert all(same_bits(a, b) for a, b in zip(outs["fast"], outs["reference"]))
