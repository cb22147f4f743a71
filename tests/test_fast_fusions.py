"""The plan's fusions (``cplan.FUSIONS``) give the bits of the steps they replace: each fused row kernel
against its NumPy twin (``fast.twins.FUSED``, the reference ops chained), each fusion through a plan
against the reference executor (1 and 2 threads, odd shapes), and the buffers a fusion must refuse
(overlapping ones, where the allocator gave one node another's bytes) refused."""
from __future__ import annotations

import numpy as np
import pytest

from llmlab.ggml import GGMLContext, build_forward, graph_compute, ops as ggml
from llmlab.ggml.alloc import alloc_graph
from llmlab.ggml.cgraph import build_forward_expand
from llmlab.ggml.cpu import cplan
from llmlab.ggml.cpu.cplan import graph_plan
from llmlab.ggml.cpu.fast import _common
from llmlab.ggml.cpu.fast.twins import FUSED
from llmlab.ggml.cpu.ops import rope_cache
from llmlab.ggml.cpu.profiles import resolve

rng = np.random.default_rng(11)
FUSION = {f.__name__: f for f in cplan.FUSIONS}     # (registered by ``@FUSIONS.append``: no module names)


def same_bits(a, b) -> bool:
    a, b = np.asarray(a), np.asarray(b)
    return a.shape == b.shape and a.dtype == b.dtype and a.tobytes() == b.tobytes()


def leaf(ctx, type_, *ne, values=None):
    t = ggml.new_tensor(ctx, type_, *ne)
    vals = rng.standard_normal(int(np.prod(ne))).astype(np.float32) * 3 if values is None else values
    t.set_data(np.asarray(vals).reshape(-1))
    return t


@pytest.fixture(params=["avx512", "avx2", "arm_dotprod_fp16", "arm_i8mm"])
def cpu(request):
    return resolve(request.param)


@pytest.fixture(params=[1, 2])
def threads(request, monkeypatch):
    """1 or 2 threads, and every product large enough to thread (the threaded kernels bound)."""
    monkeypatch.setenv("LLMLAB_PARALLEL_MIN_WORK", "1")
    n0 = _common.set_threads()
    _common.set_threads(request.param)
    yield request.param
    _common.set_threads(n0)


# ---- the fused row kernels and their NumPy twins --------------------------------------------------

def _cos_sin(T, n_dims):
    return rope_cache(np.array([7, 4000, 1, 123][:T], np.int32), n_dims, 10000.0)


@pytest.mark.parametrize("neox,n_dims,vec_pairs", [(False, 64, 0), (True, 64, 0), (False, 48, 24), (True, 40, 0)])
@pytest.mark.parametrize("scaled", [False, True])
@pytest.mark.parametrize("in_place", [False, True])
def test_rms_norm_mul_rope_twin(neox, n_dims, vec_pairs, scaled, in_place):
    """Odd shapes: 3 tokens of 5 heads of 72 (dimensions past n_dims copied, normed and scaled); the
    profile's vectorized NORM pairs; out the input itself (Gemma's q)."""
    T, H, D = 3, 5, 72
    x = (rng.standard_normal((T * H, D)) * 4).astype(np.float32)
    w = (rng.standard_normal(D) + 1).astype(np.float32)
    cos, sin = _cos_sin(T, n_dims)
    outs = []
    for side in ("kernel", "reference"):
        xi = x.copy()
        out = xi if in_place else np.full_like(x, np.nan)
        getattr(FUSED["rms_norm_mul_rope"], side)(xi, H, np.float32(1e-6), w, cos, sin, n_dims, neox,
                                                       np.float32(0.0625 * 1.1), scaled, out, vec_pairs)
        outs.append(out)
    assert same_bits(*outs)


@pytest.mark.parametrize("cell", [np.uint16, np.float32])
@pytest.mark.parametrize("neox,n_dims,vec_pairs", [(False, 64, 0), (True, 64, 0), (False, 48, 24)])
def test_rope_set_rows_pair_twin(cell, neox, n_dims, vec_pairs):
    """K rotated into its cells (f16 bits, or f32), V's rows after; a cell index twice (the later row
    wins), values past f16's range (inf), and an index out of range writing nothing."""
    T, H, D, n = 3, 3, 72, 11
    X = (rng.standard_normal((T, H, D)) * 3).astype(np.float32)
    X[1, 2, :8] *= 3e4                                              # past 65504 once rotated
    V = rng.standard_normal((T, H * D)).astype(np.float32)
    cos, sin = _cos_sin(T, n_dims)
    for I in (np.array([4, 10, 4], np.int32), np.array([0, 11, 2], np.int32)):
        caches = []
        for side in ("kernel", "reference"):
            Dk, Dv = np.zeros((n, H * D), cell), np.zeros((n, H * D), cell)
            ok = getattr(FUSED["rope_set_rows_pair"], side)(X, cos, sin, n_dims, neox, Dk, Dv, V, I, vec_pairs)
            caches.append((ok, Dk, Dv))
        (ok, Dk, Dv), (ok_ref, Dk_ref, Dv_ref) = caches
        assert ok == ok_ref == (I.max() < n)
        assert same_bits(Dk, Dk_ref) and same_bits(Dv, Dv_ref)
        assert ok or not (Dk.any() or Dv.any())


def test_the_older_fused_row_kernels_equal_their_twins():
    x = rng.standard_normal((3, 70)).astype(np.float32)
    a, b, w = x + 1, x * 2, rng.standard_normal(70).astype(np.float32)
    got = []
    for side in ("kernel", "reference"):
        xi, out = x.copy(), np.empty_like(x)
        getattr(FUSED["rms_norm_mul"], side)(xi, np.float32(1e-5), w, out, a, b)
        got.append((xi, out))
    assert same_bits(got[0][0], got[1][0]) and same_bits(got[0][1], got[1][1])
    X = rng.standard_normal((2, 3, 72)).astype(np.float32)
    cos, sin = _cos_sin(2, 64)
    outs = [np.empty_like(X), np.empty_like(X)]
    for side, out in zip(("kernel", "reference"), outs):
        getattr(FUSED["rope_scale"], side)(X, cos, sin, 64, True, np.float32(0.125), out)
    assert same_bits(*outs)
    I, K, V = np.array([1, 5], np.int32), X[:, 0].copy(), X[:, 1].copy()
    cells = [[np.zeros((6, 72), np.uint16) for _ in range(2)] for _ in range(2)]
    for side, (Dk, Dv) in zip(("kernel", "reference"), cells):
        assert getattr(FUSED["set_rows_pair"], side)(Dk, K, Dv, V, I)
    assert same_bits(cells[0][0], cells[1][0]) and same_bits(cells[0][1], cells[1][1])


# ---- through plans: the fused step equals the nodes run one by one ---------------------------------

def _run_both(g, outs, cpu, inputs=()):
    """The reference executor's results (of ``outs``) and the fast plan's, from the same inputs (the
    arrays in ``inputs``, as they are now); and the plan."""
    saved = [a.copy() for a in inputs]
    graph_compute(g, cpu=cpu)
    ref = [t.array().copy() for t in outs]
    for a, s in zip(inputs, saved):
        a[...] = s
    plan = graph_plan(g.nodes, cpu=cpu)
    for t in outs:
        if t.view_src is None:
            t.array()[...] = 0
    plan.compute()
    return ref, [t.array().copy() for t in outs], plan


def _graph(*outs):
    """The graph of ``outs``; in a no_alloc context its nodes get one arena, the allocator reusing the
    bytes of nodes done with (as in a model's graph), else each node keeps its own."""
    g = build_forward(outs[0])
    for o in outs[1:]:
        build_forward_expand(g, o)
    alloc_graph(g.nodes)
    return g


def _kv_graph(ctx, mode, n_dims, cell_type, T=2, H=3, D=72, n=9):
    k = leaf(ctx, "f32", D, H, T)
    pos = leaf(ctx, "i32", T, values=np.array([7, 4000, 3][:T], np.int32))
    ck = leaf(ctx, cell_type, D * H, n, values=np.zeros(D * H * n, np.float32))
    cv = leaf(ctx, cell_type, D * H, n, values=np.zeros(D * H * n, np.float32))
    v = leaf(ctx, "f32", D * H, T)
    idx = leaf(ctx, "i32", T, values=np.array([3, 8, 5][:T], np.int32))
    kr = ggml.reshape_2d(ctx, ggml.rope_ext(ctx, k, pos, None, n_dims, mode, 8192, 1e5, 1.0), D * H, T)
    return ggml.set_rows(ctx, ck, kr, idx), ggml.set_rows(ctx, cv, v, idx), (ck, cv, idx, k)


@pytest.mark.parametrize("mode,n_dims", [(0, 64), (2, 64), (2, 40)])
@pytest.mark.parametrize("cell_type", ["f16", "f32"])
def test_rope_into_the_set_rows_pair(mode, n_dims, cell_type, cpu):
    """ROPE of K, SET_ROWS of K and of V: one step with the three nodes' bytes; the ROPE's own output is
    not written (its one reader is absorbed); an index out of range writes nothing and raises; a
    capture hook sees every node."""
    ctx = GGMLContext()
    sk, sv, (ck, cv, idx, _) = _kv_graph(ctx, mode, n_dims, cell_type)
    g = _graph(sk, sv)
    ref, got, plan = _run_both(g, [ck, cv], cpu, [ck.array(), cv.array()])
    assert plan.n_fused == 2 and len(plan._run) == 1
    assert {plan.nodes[i].op for i in plan.absorbed} == {"ROPE", "SET_ROWS"}
    assert same_bits(got[0], ref[0]) and same_bits(got[1], ref[1])
    idx.set_data(np.array([3, 9], np.int32))
    ck.array()[...], cv.array()[...] = 0, 0
    with pytest.raises(IndexError, match="out of range"):
        plan.compute()
    assert not ck.array().any() and not cv.array().any()
    idx.set_data(np.array([3, 8], np.int32))
    plan.compute(capture=lambda n: True)
    assert same_bits(ck.array(), ref[0]) and same_bits(cv.array(), ref[1])


def test_rope_into_the_set_rows_pair_refuses_overlapping_bytes(cpu):
    """The ROPE's input in the bytes of a cache (where the rotated K lands), or the ROPE in place (its
    input overwritten, as the fused step would not): refused; the plain pair still binds."""
    ctx = GGMLContext()
    sk, sv, (ck, cv, idx, k) = _kv_graph(ctx, 0, 64, "f16")
    nodes = _graph(sk, sv).nodes
    readers, prev, _ = cplan._chain(nodes)
    rope, k_data = sk.src[0].src[0], k.data
    assert rope.op == "ROPE" and FUSION["_fuse_rope_set_rows_pair"](sv, cpu, readers, prev) is not None
    k.data = ck.data[:k.nbytes()]                   # K's rows in the K cache's bytes
    assert FUSION["_fuse_rope_set_rows_pair"](sv, cpu, readers, prev) is None
    assert FUSION["_fuse_set_rows_pair"](sv, cpu, readers, prev) is not None
    k.data = rope.data = k_data                     # the rotation in place
    assert FUSION["_fuse_rope_set_rows_pair"](sv, cpu, readers, prev) is None


def _qk_graph(ctx, scaled, T=2, H=3, D=72, n_dims=64, mode=2):
    x0 = leaf(ctx, "f32", D, H, T)
    x = ggml.scale(ctx, x0, 1.5)                    # computed: its bytes in the arena, as Qcur's are
    pos = leaf(ctx, "i32", T, values=np.array([7, 4000, 2][:T], np.int32))
    w = leaf(ctx, "f32", D)
    r = ggml.rope_ext(ctx, ggml.mul(ctx, ggml.rms_norm(ctx, x, 1e-6), w), pos, None, n_dims, mode, 8192, 1e6, 1.0)
    out = ggml.scale(ctx, r, 0.0625 * 1.1) if scaled else r
    return ggml.add(ctx, out, out), out, x            # read on (as kq reads q): out gets a freed block


@pytest.mark.parametrize("scaled", [False, True])
@pytest.mark.parametrize("mode,n_dims", [(2, 64), (0, 64), (2, 72)])
def test_q_and_k_norm_then_rope(scaled, mode, n_dims, cpu):
    """Gemma's k (RMS_NORM, MUL, ROPE) and q (the same, then SCALE): one step, taking over the norm's and
    the rope's fusions; q's output is the input's bytes (the allocator's reuse, as in Gemma)."""
    ctx = GGMLContext(no_alloc=True)
    last, out, x = _qk_graph(ctx, scaled, mode=mode, n_dims=n_dims)
    g = _graph(last)
    ref, got, plan = _run_both(g, [out, last], cpu)
    assert plan.n_fused == (3 if scaled else 2) and len(plan._run) == 3     # x's SCALE, the fused step, last
    assert same_bits(got[0], ref[0]) and same_bits(got[1], ref[1])
    if scaled:
        assert out.array().ctypes.data == x.array().ctypes.data        # in place: rows read before written
    plan.compute(capture=lambda n: True)
    assert same_bits(out.array(), ref[0])


def test_q_norm_then_rope_refuses_partly_overlapping_bytes(cpu):
    ctx = GGMLContext(no_alloc=True)
    last, out, x = _qk_graph(ctx, True)
    nodes = _graph(last).nodes
    readers, prev, _ = cplan._chain(nodes)
    buf = np.zeros(x.nbytes() + 64, np.uint8)
    x.data, out.data = buf[:x.nbytes()], buf[:x.nbytes()]
    assert FUSION["_fuse_norm_rope"](out, cpu, readers, prev) is not None        # the same bytes: in place
    out.data = buf[4:4 + x.nbytes()]                                         # shifted by one value
    assert FUSION["_fuse_norm_rope"](out, cpu, readers, prev) is None


def _kqv_graph(ctx, n_kv=260, D=64, Hk=3, Hq=9, T=1):
    """kqv = CONT(V^T) x probabilities, permuted and copied (llama's kqv_out), for T tokens; in a no_alloc
    context the probabilities computed (their freed bytes the CONT's, as in Gemma's plan)."""
    v = leaf(ctx, "f16", D * Hk, n_kv, values=rng.standard_normal(D * Hk * n_kv).astype(np.float16))
    vt = ggml.cont(ctx, ggml.permute(ctx, ggml.reshape(ctx, v, D, Hk, n_kv), 1, 2, 0, 3))
    p = leaf(ctx, "f32", n_kv, T, Hq, values=rng.random(n_kv * T * Hq).astype(np.float32))
    if ctx.no_alloc:
        p = ggml.scale(ctx, p, 0.5)
    kqv = ggml.mul_mat(ctx, vt, p)
    return ggml.cont_2d(ctx, ggml.permute(ctx, kqv, 0, 2, 1, 3), D * Hq, T), kqv, p


@pytest.mark.parametrize("n_kv", [256, 260])
def test_kqv_written_into_its_cont(n_kv, cpu, threads):
    """One token's kqv_out = CONT(kqv permuted) is a pure copy: kqv's fused step writes into the CONT's
    bytes (kqv's own are not written). Two tokens: not a pure copy, the CONT runs."""
    for T in (1, 2):
        ctx = GGMLContext()
        out, kqv, _ = _kqv_graph(ctx, n_kv, T=T)
        g = _graph(out)
        ref, got, plan = _run_both(g, [out], cpu)
        assert same_bits(got[0], ref[0])
        assert plan.n_fused == (2 if T == 1 else 0) and len(plan._run) == (1 if T == 1 else 3)
        plan.compute(capture=lambda n: True)
        assert same_bits(out.array(), ref[0])


def test_kqv_into_its_cont_refuses_the_probabilities_bytes(cpu):
    """Gemma's plan gives kqv_out the probabilities' freed bytes: kqv cannot be written there (nor over
    the other bytes of its step); the plan keeps the CONT, with the same bits."""
    ctx = GGMLContext()
    out, kqv, p = _kqv_graph(ctx)
    nodes = _graph(out).nodes
    readers, prev, _ = cplan._chain(nodes)
    assert FUSION["_fuse_kqv_cont"](out, cpu, readers, prev) is not None
    out.data = p.data[:out.nbytes()]
    assert FUSION["_fuse_kqv_cont"](out, cpu, readers, prev) is None
    ctx = GGMLContext(no_alloc=True)
    out, kqv, p = _kqv_graph(ctx)
    g = _graph(out)
    ref, got, plan = _run_both(g, [out], cpu)
    assert cplan._overlap(cplan._span(out.array()), cplan._span(p.array())) or \
        cplan._overlap(cplan._span(out.array()), cplan._span(kqv.src[0].array()))
    assert [plan.nodes[i] for i in plan.absorbed] == [kqv.src[0]] and same_bits(got[0], ref[0])


def _q8_0_weight(ctx, K, R):
    w = ggml.new_tensor(ctx, "q8_0", K, R)
    w.set_data(rng.integers(0, 256, w.array().size, dtype=np.uint8).view(w.array().dtype).reshape(w.array().shape))
    w.array().view(np.uint8).reshape(R, K // 32, 34)[..., 1] &= 0x3b          # finite f16 scales
    return w


@pytest.mark.parametrize("T", [1, 2])
def test_matvec_reads_the_cont_source_in_place(T, cpu, threads):
    """attn_out = W x CONT(kqv permuted): for one token the matvec reads kqv's bytes and the copy is
    skipped (Gemma); for two the CONT runs. The same bits either way, and with every node hooked."""
    ctx = GGMLContext()
    h = leaf(ctx, "f32", 64, T, 3)
    kqv = ggml.scale(ctx, h, 0.5)                                 # (64, T, 3), computed
    cont = ggml.cont_2d(ctx, ggml.permute(ctx, kqv, 0, 2, 1, 3), 64 * 3, T)
    out = ggml.mul_mat(ctx, _q8_0_weight(ctx, 64 * 3, 333), cont)
    g = _graph(out)
    ref, got, plan = _run_both(g, [out], cpu)
    assert same_bits(got[0], ref[0])
    assert plan.n_fused == (1 if T == 1 else 0)
    plan.compute(capture=lambda n: True)
    assert same_bits(out.array(), ref[0])


def test_matvec_of_the_cont_source_refuses_its_bytes_as_output(cpu):
    """SmolLM2's plan gives attn_out kqv's freed bytes: it cannot read kqv there while writing."""
    ctx = GGMLContext()
    kqv = ggml.scale(ctx, leaf(ctx, "f32", 64, 1, 3), 0.5)
    cont = ggml.cont_2d(ctx, ggml.permute(ctx, kqv, 0, 2, 1, 3), 64 * 3, 1)
    out = ggml.mul_mat(ctx, _q8_0_weight(ctx, 64 * 3, 48), cont)
    nodes = _graph(out).nodes
    readers, prev, _ = cplan._chain(nodes)
    assert FUSION["_fuse_cont_reader"](out, cpu, readers, prev) is not None
    out.data = kqv.data[:out.nbytes()]
    assert FUSION["_fuse_cont_reader"](out, cpu, readers, prev) is None


def test_a_fused_step_is_taken_over_only_whole(monkeypatch):
    """graph_plan's claim: a later fusion may take over a fused step with all it absorbed (Gemma's q: the
    norm's step, then the rope's, taken over by the SCALE's), never part of one (its work would be lost)."""
    ctx = GGMLContext(no_alloc=True)
    last, out, _ = _qk_graph(ctx, True)
    g = _graph(last)
    ops = [n.op for n in g.nodes]
    plan = graph_plan(g.nodes, cpu="avx2")
    assert sorted(ops[i] for i in plan.absorbed) == ["MUL", "RMS_NORM", "ROPE"]
    assert [g.nodes[i] for i in plan.fused] == [out]

    def at_rope_only(node, *args):              # the norm fused with the ROPE, not with the SCALE
        return FUSION["_fuse_norm_rope"](node, *args) if node.op == "ROPE" else None
    fusions = [at_rope_only if f is FUSION["_fuse_norm_rope"] else f for f in cplan.FUSIONS]
    assert fusions.index(at_rope_only) < fusions.index(FUSION["_fuse_rope_scale"])
    monkeypatch.setattr(cplan, "FUSIONS", fusions)
    ref, got, plan = _run_both(g, [out], "avx2")
    assert sorted(ops[i] for i in plan.absorbed) == ["MUL", "RMS_NORM"]      # _fuse_rope_scale's [ROPE]: refused
    assert sorted(ops[i] for i in plan.fused) == ["ROPE"] and len(plan._run) == 4
    assert same_bits(got[0], ref[0])
