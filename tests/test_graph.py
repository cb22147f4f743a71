"""The compute graph: ggml's DFS order, zero-copy views, each op against a plain NumPy formula."""
from __future__ import annotations

import numpy as np
import pytest

from llmlab.ggml import GGMLContext, build_forward, build_forward_expand, graph_compute, plan_memory
from llmlab.ggml import ops as ggml
from llmlab.ggml import quant
from llmlab.ggml.alloc import FreeList, reserve
from llmlab.ggml.graphviz import has_dot, render, to_dot

RNG = np.random.default_rng(0)


def leaf(ctx, name, *ne, values=None, type="f32"):
    t = ggml.new_tensor(ctx, type, *ne, name=name)
    if values is None:
        values = RNG.standard_normal(tuple(reversed(ne))).astype(np.float32)
    t.set_data(values)
    return t


def run(t):
    g = build_forward(t)
    graph_compute(g)
    return t.numpy()


def test_dfs_order_matches_ggml_visit_parents():
    # e = mul_mat(w, add(mul(x, a), x)) ; hand-derived from ggml_visit_parents:
    # visit e -> src0 w (leaf 0) -> src1 add -> src0 mul -> x (leaf 1), a (leaf 2), mul is node 0
    #          -> add's src1 x already visited, add is node 1 -> e is node 2
    ctx = GGMLContext()
    w, x, a = leaf(ctx, "w", 4, 3), leaf(ctx, "x", 4, 2), leaf(ctx, "a", 4, 1)
    m = ggml.mul(ctx, x, a)
    s = ggml.add(ctx, m, x)
    e = ggml.mul_mat(ctx, w, s)
    g = build_forward(e)
    assert [t.name for t in g.leafs] == ["w", "x", "a"]
    assert g.nodes == [m, s, e]
    assert [t.name for t in g.nodes] == ["node_0", "node_1", "node_2"]   # unnamed nodes get ggml's names
    # expanding with a second output appends only what is new, in DFS order
    f = ggml.scale(ctx, m, 2.0)
    build_forward_expand(g, f)
    assert g.nodes == [m, s, e, f]
    assert g.nodes[-1] is f


def test_src_order_decides_order():
    ctx = GGMLContext()
    a, b = leaf(ctx, "a", 3), leaf(ctx, "b", 3)
    ua, ub = ggml.silu(ctx, a), ggml.silu(ctx, b)
    g1 = build_forward(ggml.add(ctx, ua, ub))
    g2 = build_forward(ggml.add(ctx, ub, ua))
    assert g1.nodes[:2] == [ua, ub] and g2.nodes[:2] == [ub, ua]


def test_nothing_computes_before_the_executor():
    ctx = GGMLContext(no_alloc=True)
    a = ggml.new_tensor(ctx, "f32", 4, 2, name="a")
    b = ggml.scale(ctx, a, 3.0)
    assert a.data is None and b.data is None
    with pytest.raises(RuntimeError, match="no data"):
        graph_compute(build_forward(b))
    a.set_data(np.arange(8, dtype=np.float32).reshape(2, 4))
    assert b.data is None
    graph_compute(build_forward(b))
    np.testing.assert_array_equal(b.numpy(), 3 * np.arange(8).reshape(2, 4))


def test_views_share_memory():
    ctx = GGMLContext()
    a = leaf(ctx, "a", 6, 4, values=np.arange(24, dtype=np.float32).reshape(4, 6))
    v = ggml.view_2d(ctx, a, 3, 2, a.nb[1], 2 * a.nb[0])
    r = ggml.reshape_3d(ctx, a, 3, 2, 4)
    p = ggml.permute(ctx, r, 1, 0, 2, 3)
    tr = ggml.transpose(ctx, a)
    for t in (v, r, p, tr):
        assert t.data is None and t.view_src is a
        assert np.shares_memory(t.array(), a.array())
    A = np.arange(24, dtype=np.float32).reshape(4, 6)
    np.testing.assert_array_equal(v.numpy(), A[:2, 2:5])
    np.testing.assert_array_equal(tr.numpy(), A.T)
    np.testing.assert_array_equal(p.numpy(), A.reshape(4, 2, 3).transpose(0, 2, 1))
    a.array()[0, 0, 0, 2] = 100.0            # write through the base: every view sees it
    assert v.numpy()[0, 0] == 100.0 and tr.numpy()[2, 0] == 100.0
    vv = ggml.view_1d(ctx, v, 2, v.nb[0])    # a view of a view points at the root, offsets add up
    assert vv.view_src is a and vv.view_offs == 3 * 4
    with pytest.raises(ValueError, match="out of bounds"):
        ggml.view_1d(ctx, a, 10, 20 * 4)
    c = ggml.cont(ctx, tr)                   # cont copies
    out = run(c)
    assert not np.shares_memory(c.array(), a.array())
    np.testing.assert_array_equal(out, tr.numpy())


def test_context_bump_allocator_and_no_alloc():
    ctx = GGMLContext(mem_size=4096)
    t = ggml.new_tensor(ctx, "f32", 100, name="t")       # 400 bytes + overhead
    assert t.data is not None and ctx.used >= 400
    with pytest.raises(MemoryError, match="not enough space"):
        ggml.new_tensor(ctx, "f32", 1000)
    na = GGMLContext(no_alloc=True)
    u = ggml.new_tensor(na, "f32", 1000)
    assert u.data is None and na.used < 1000


def test_memory_plan_reuses_dead_results():
    ctx = GGMLContext()
    x = leaf(ctx, "x", 1024)
    cur = x
    for _ in range(6):
        cur = ggml.silu(ctx, cur)
    plan = plan_memory(build_forward(cur))
    assert plan.node_bytes_no_reuse == 6 * 4096
    assert plan.peak_bytes == 2 * 4096            # a result lives until its reader has run
    assert plan.leaf_bytes == 4096


def test_free_list_takes_the_best_hole_and_merges_neighbours():
    fl = FreeList()
    a, b, c, d = (fl.alloc(n) for n in (128, 64, 256, 64))
    assert (a, b, c, d) == (0, 128, 192, 448) and fl.max_size == 512
    fl.free(a, 128)
    fl.free(c, 256)
    assert fl.alloc(64) == 0                      # the smaller of the two holes that fit
    assert fl.alloc(512) == 512                   # no hole fits: the open end
    fl.free(b, 64)
    fl.free(d, 64)                                # merges 192..448 and 448..512 with the block before
    assert fl.blocks == [[64, 448], [1024, -1]]
    fl.free(0, 64)
    fl.free(512, 512)                             # everything merged back into the open end
    assert fl.blocks == [[0, -1]] and fl.max_size == 1024


def test_views_keep_their_root_and_outputs_keep_their_bytes():
    ctx = GGMLContext(no_alloc=True)
    x = ggml.new_tensor(ctx, "f32", 64, 4, name="x")
    a = ggml.silu(ctx, x)
    v = ggml.view_2d(ctx, a, 32, 4, a.nb[1], 0)        # an unread view: a stays alive
    b = ggml.silu(ctx, ggml.silu(ctx, x))
    g = build_forward_expand(build_forward(v), b)
    plan = reserve(g.nodes)
    assert id(v) not in plan.offsets                   # views own nothing
    offs = sorted(plan.offsets[id(n)] for n in g.nodes if n.view_src is None)
    assert len(set(offs)) == len(offs) == 3            # a, silu(x), b: a is never given back
    assert plan.size == 3 * 1024


@pytest.mark.parametrize("arch", ["llama", "gemma3"])
def test_engine_allocates_the_arena_the_notebook_draws(tmp_path, arch):
    """plan_memory (notebook 06) and the CPU backend's plan run the same allocator: the peak it reports
    is the arena the engine allocates, live results never share bytes, and the bits are the executor's."""
    from llmlab.ggml.cpu.cplan import graph_plan
    from llmlab.llama import Batch, Context, Model
    from llmlab.llama.tiny import write_tiny
    model = Model(write_tiny(tmp_path / "m.gguf", arch, n_layer=2, seed=3, sliding_window=4))
    ctx = Context(model, n_ctx=64, kernels="reference")
    g = ctx.graph_for(Batch.from_tokens([3, 1, 4, 1, 5, 9, 2], logits="all"))
    drawn = plan_memory(g.gf)
    assert 0 < drawn.peak_bytes < drawn.node_bytes_no_reuse
    assert max(live for *_, live in drawn.per_node) <= drawn.peak_bytes
    plan = graph_plan(g.gf.nodes, fast=False)
    assert plan.arena_bytes == drawn.peak_bytes
    nodes = g.gf.nodes
    last = {}
    for i, n in enumerate(nodes):
        for s in n.src:
            last[id(s.root())] = i
    spans = []                                         # (first, last index alive, start, end in the arena)
    base = next(n for n in nodes if n.view_src is None).data.base
    for i, n in enumerate(nodes):
        if n.view_src is None:
            assert n.data.base is base                 # one arena
            start = n.data.__array_interface__["data"][0] - base.__array_interface__["data"][0]
            spans.append((i, last.get(id(n), len(nodes)), start, start + n.nbytes()))
    for i, (_f0, l0, s0, e0) in enumerate(spans):
        for f1, _l1, s1, e1 in spans[i + 1:]:
            if f1 <= l0:                               # alive together
                assert e0 <= s1 or e1 <= s0
    plan.compute()
    got = g.t_logits.numpy()
    for n in nodes:
        if n.view_src is None:
            n.data = None
    graph_compute(g.gf)
    assert np.array_equal(got, g.t_logits.numpy())


# ---- every op against a plain formula ----------------------------------------------------

def test_elementwise_ops():
    ctx = GGMLContext()
    a, b, row = leaf(ctx, "a", 8, 3), leaf(ctx, "b", 8, 3), leaf(ctx, "row", 8)
    A, B, Row = a.numpy(), b.numpy(), row.numpy()
    np.testing.assert_array_equal(run(ggml.add(ctx, a, b)), A + B)
    np.testing.assert_array_equal(run(ggml.mul(ctx, a, row)), A * Row)     # broadcast like ggml_can_repeat
    np.testing.assert_array_equal(run(ggml.scale(ctx, a, 0.5)), A * np.float32(0.5))
    np.testing.assert_allclose(run(ggml.silu(ctx, a)), A / (1 + np.exp(-A)), rtol=1e-6)
    np.testing.assert_allclose(run(ggml.swiglu_split(ctx, a, b)), A / (1 + np.exp(-A)) * B, rtol=1e-6, atol=1e-7)
    tanh_gelu = 0.5 * A * (1 + np.tanh(np.sqrt(2 / np.pi) * (A + 0.044715 * A ** 3)))
    np.testing.assert_allclose(run(ggml.gelu(ctx, a)), tanh_gelu, rtol=2e-3, atol=2e-3)   # through an f16 table
    np.testing.assert_allclose(run(ggml.geglu_split(ctx, a, b)), tanh_gelu * B, rtol=2e-3, atol=5e-3)
    with pytest.raises(ValueError, match="broadcast"):
        ggml.add(ctx, a, leaf(ctx, "bad", 5))


def test_gelu_goes_through_the_f16_table():
    x = np.linspace(-12, 12, 2001, dtype=np.float32)
    ctx = GGMLContext()
    t = leaf(ctx, "x", len(x), values=x)
    got = run(ggml.gelu(ctx, t))
    # the table's value at x's f16 neighbour: the tanh formula evaluated in double, rounded to f16
    xh = x.astype(np.float16).astype(np.float64)
    f = 0.5 * xh * (1 + np.tanh(np.sqrt(2 / np.pi) * xh * (1 + 0.044715 * xh * xh)))
    want = np.where(x <= -10, 0, np.where(x >= 10, x, f.astype(np.float32).astype(np.float16).astype(np.float32)))
    ulp16 = np.abs(np.spacing(want.astype(np.float16))).astype(np.float32)
    assert (np.abs(got - want) <= np.maximum(ulp16, 2e-6)).all()   # one f16 rounding step apart (f16 subnormals: a few)
    assert (got[x <= -10] == 0).all() and (got[x >= 10] == x[x >= 10]).all()


def test_norms():
    ctx = GGMLContext()
    a = leaf(ctx, "a", 64, 5)
    A = a.numpy().astype(np.float64)
    rms = A / np.sqrt((A ** 2).mean(-1, keepdims=True) + 1e-5)
    np.testing.assert_allclose(run(ggml.rms_norm(ctx, a, 1e-5)), rms, rtol=1e-6, atol=1e-6)
    ln = (A - A.mean(-1, keepdims=True)) / np.sqrt(A.var(-1, keepdims=True) + 1e-5)
    np.testing.assert_allclose(run(ggml.norm(ctx, a, 1e-5)), ln, rtol=1e-5, atol=1e-5)


def test_soft_max_ext_with_mask_and_scale():
    ctx = GGMLContext()
    a = leaf(ctx, "a", 6, 4, 2)                       # [n_kv, n_q, heads]
    M = np.where(np.arange(6)[None, :] <= np.arange(4)[:, None] + 2, 0, -np.inf).astype(np.float32)
    m = leaf(ctx, "m", 6, 4, values=M)
    got = run(ggml.soft_max_ext(ctx, a, m, 0.25))
    w = a.numpy().astype(np.float64) * 0.25 + M
    want = np.exp(w - w.max(-1, keepdims=True))
    want /= want.sum(-1, keepdims=True)
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-7)
    assert (got[:, 0, 3:] == 0).all()


@pytest.mark.parametrize("mode", [0, 2])
def test_rope_norm_and_neox(mode):
    ctx = GGMLContext()
    hd, nh, nt, n_dims, base = 16, 3, 5, 12, 10000.0
    x = leaf(ctx, "x", hd, nh, nt)
    pos = ggml.new_tensor(ctx, "i32", nt, name="pos")
    P = np.array([0, 1, 2, 7, 100], np.int32)
    pos.set_data(P)
    got = run(ggml.rope_ext(ctx, x, pos, None, n_dims, mode, 0, base))
    X = x.numpy().astype(np.float64)                 # (nt, nh, hd)
    theta = P[:, None] * base ** (-2.0 * np.arange(n_dims // 2) / n_dims)
    c, s = np.cos(theta)[:, None, :], np.sin(theta)[:, None, :]
    want = X.copy()
    if mode == 0:
        i0, i1 = np.arange(0, n_dims, 2), np.arange(1, n_dims, 2)
    else:
        i0, i1 = np.arange(n_dims // 2), np.arange(n_dims // 2, n_dims)
    want[..., i0] = X[..., i0] * c - X[..., i1] * s
    want[..., i1] = X[..., i0] * s + X[..., i1] * c
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
    np.testing.assert_array_equal(got[..., n_dims:], X[..., n_dims:])   # dims past n_dims pass through


def test_mul_mat_ggml_convention_and_broadcast():
    ctx = GGMLContext()
    w = leaf(ctx, "w", 8, 5, 2)          # [K, M, 2 kv heads]
    x = leaf(ctx, "x", 8, 3, 6)          # [K, N, 6 heads] -> heads 0-2 use kv head 0
    got = run(ggml.mul_mat(ctx, w, x))
    assert got.shape == (6, 3, 5)        # ne = [M, N, 6]
    W, X = w.numpy(), x.numpy()
    want = np.stack([X[h] @ W[h // 3].T for h in range(6)])
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    with pytest.raises(ValueError, match="inner dimensions"):
        ggml.mul_mat(ctx, w, leaf(ctx, "bad", 7, 3))


def test_mul_mat_f16_rounds_activations_like_ggml_cpu():
    ctx = GGMLContext()
    W = RNG.standard_normal((4, 32)).astype(np.float16)
    w = leaf(ctx, "w", 32, 4, type="f16", values=W)
    x = leaf(ctx, "x", 32, 2)
    got = run(ggml.mul_mat(ctx, w, x))
    want = x.numpy().astype(np.float16).astype(np.float64) @ W.astype(np.float64).T
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)


def test_get_rows_and_quantized_weights():
    ctx = GGMLContext()
    E = RNG.standard_normal((10, 64)).astype(np.float32)
    raw = quant.quantize(E.reshape(-1), "q8_0")
    emb = ggml.new_tensor(ctx, "q8_0", 64, 10, name="emb")
    emb.data[:] = raw
    ids = ggml.new_tensor(ctx, "i32", 3, name="ids")
    ids.set_data([7, 0, 7])
    got = run(ggml.get_rows(ctx, emb, ids))
    deq = quant.dequantize(raw, "q8_0").reshape(10, 64)
    np.testing.assert_array_equal(got, deq[[7, 0, 7]])
    x = leaf(ctx, "x", 64, 2)
    mm = run(ggml.mul_mat(ctx, emb, x))
    np.testing.assert_allclose(mm, x.numpy() @ deq.T, rtol=0.02, atol=0.05)   # activations go through q8_0
    ids.set_data([0, 10, 1])
    with pytest.raises(IndexError):
        run(ggml.get_rows(ctx, emb, ids))


def test_cpy_converts_and_writes_into_a_view():
    ctx = GGMLContext()
    dst = ggml.new_tensor(ctx, "f16", 8, 4, name="cache")
    dst.set_data(np.zeros((4, 8)))
    src = leaf(ctx, "src", 8, 2)
    view = ggml.view_1d(ctx, dst, 16, dst.type.row_size(8) * 1)     # rows 1..2
    c = ggml.cpy(ctx, src, view)
    run(c)
    np.testing.assert_array_equal(dst.numpy()[1:3], src.numpy().astype(np.float16))
    assert (dst.numpy()[0] == 0).all() and (dst.numpy()[3] == 0).all()


def _attention_graph(flash: bool, n_q=5, n_kv=37, hd=16, nh=4, nkv=2, scale=0.25):
    ctx = GGMLContext()
    q = leaf(ctx, "q", hd, n_q, nh)             # already permuted layouts: [D, n, heads]
    k = leaf(ctx, "k", hd, n_kv, nkv, type="f16", values=RNG.standard_normal((nkv, n_kv, hd)).astype(np.float16))
    v = leaf(ctx, "v", hd, n_kv, nkv, type="f16", values=RNG.standard_normal((nkv, n_kv, hd)).astype(np.float16))
    qpos = np.arange(n_kv - n_q, n_kv)
    M = np.where(np.arange(n_kv)[None, :] <= qpos[:, None], 0, -np.inf).astype(np.float32)
    mask = leaf(ctx, "mask", n_kv, n_q, values=M)
    if flash:
        out = ggml.flash_attn_ext(ctx, q, k, v, mask, scale)                       # [hd, nh, n_q]
        out = ggml.reshape_2d(ctx, out, hd * nh, n_q)
    else:
        kq = ggml.soft_max_ext(ctx, ggml.mul_mat(ctx, k, q), mask, scale)          # [n_kv, n_q, nh]
        vt = ggml.cont(ctx, ggml.transpose(ctx, v))                                 # [n_kv, hd, nkv]
        kqv = ggml.mul_mat(ctx, vt, kq)                                             # [hd, n_q, nh]
        out = ggml.cont_2d(ctx, ggml.permute(ctx, kqv, 0, 2, 1, 3), hd * nh, n_q)
    return run(out), (q.numpy(), k.numpy().astype(np.float32), v.numpy().astype(np.float32), M)


def test_flash_attention_equals_naive_attention():
    RNG2 = np.random.default_rng(5)
    global RNG
    RNG = RNG2
    fa, (Q, K, V, M) = _attention_graph(True)
    RNG = np.random.default_rng(5)
    naive, _ = _attention_graph(False)
    # both round to f16 on the way (naive: the probabilities; ggml's flash attention: the running output)
    np.testing.assert_allclose(fa, naive, rtol=3e-3, atol=3e-3)
    # and both equal the textbook formula to f16 precision
    Qh = Q.astype(np.float16).astype(np.float64)
    want = []
    for h in range(4):
        s = Qh[h] @ K[h // 2].T * 0.25 + M
        p = np.exp(s - s.max(-1, keepdims=True))
        want.append((p / p.sum(-1, keepdims=True)) @ V[h // 2])
    want = np.stack(want, 1).reshape(Q.shape[1], -1)
    np.testing.assert_allclose(fa, want, rtol=3e-3, atol=3e-3)
    np.testing.assert_allclose(naive, want, rtol=3e-3, atol=3e-3)


def test_executor_capture_and_replace_hooks():
    ctx = GGMLContext()
    a = leaf(ctx, "a", 4)
    b = ggml.set_name(ggml.scale(ctx, a, 2.0), "doubled")
    c = ggml.set_name(ggml.add(ctx, b, a), "out")
    g = build_forward(c)
    got = graph_compute(g, capture=["doubled"], replace={"doubled": np.zeros(4)})
    np.testing.assert_array_equal(got["doubled"], np.zeros(4))       # captured after the replacement
    np.testing.assert_array_equal(c.numpy(), a.numpy())               # readers saw the replacement
    seen = []
    graph_compute(g, callback=lambda t: seen.append(t.name))
    assert seen == ["doubled", "out"]


def test_to_dot_and_render():
    ctx = GGMLContext()
    a = leaf(ctx, "a", 4)
    b = ggml.set_name(ggml.silu(ctx, a), "act-0")
    g = build_forward(b)
    dot = to_dot(g)
    assert dot.startswith("digraph") and "SILU" in dot and "->" in dot
    assert "act-0" in to_dot(g, layers=0) and "act-0" not in to_dot(g, layers=1)
    out = render(dot)
    if has_dot():                                  # drawn: the same DOT text, rendered to an SVG with the node
        assert out.source.strip() == dot.strip()
        svg = out.pipe(format="svg").decode()
        assert "<svg" in svg and "act&#45;0" in svg and "SILU f32 [4]" in svg
    else:                                          # no Graphviz: a message that says so and counts the edges
        assert "not installed" in out and f"{dot.count('->')} edges" in out


def test_backend_colours_have_one_home():
    """Both scheduler drawings read ggml.graphviz.backend_colors: CPU and ACCEL their own, RPC devices in
    turn, the same for a schedule's backends whatever drew before (nothing is patched at run time)."""
    from types import SimpleNamespace

    from llmlab.ggml.graphviz import BACKEND_COLORS, RPC_COLORS, backend_colors
    names = ["RPC0[127.0.0.1:50052]", "RPC1[127.0.0.1:50053]", "CPU"]
    assert backend_colors(names) == {names[0]: RPC_COLORS[0], names[1]: RPC_COLORS[1], "CPU": BACKEND_COLORS["CPU"]}
    assert backend_colors(["ACCEL", "CPU", "mystery"]) == {"ACCEL": BACKEND_COLORS["ACCEL"], "CPU": BACKEND_COLORS["CPU"]}
    ctx = GGMLContext()
    a = leaf(ctx, "a", 4)
    b = ggml.set_name(ggml.silu(ctx, a), "act-0")
    g = build_forward(ggml.set_name(ggml.silu(ctx, b), "act2-0"))
    sched = SimpleNamespace(backends=[SimpleNamespace(name=n) for n in names],
                            backend_of=lambda t: names[1] if t.name == "act-0" else "?")
    dot = to_dot(g, color_by="backend", schedule=sched)
    assert f'fillcolor="{RPC_COLORS[1]}"' in dot and 'fillcolor="#dddddd"' in dot
