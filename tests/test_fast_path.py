"""The fast path (a compiled plan over numba kernels) gives the NumPy reference's bits: op by op on
random data, and through whole models, prompt and decode steps alike."""
from __future__ import annotations

import numpy as np
import pytest

from llmlab.ggml import GGMLContext, build_forward, graph_compute, ops as ggml
from llmlab.ggml.cgraph import build_forward_expand
from llmlab.ggml.cpu.cplan import graph_plan
from llmlab.llama import Batch, Context, Model
from llmlab.llama.tiny import write_tiny
from kernel_data import same_bits

rng = np.random.default_rng(7)


def leaf(ctx, type_, *ne, values=None, name=""):
    t = ggml.new_tensor(ctx, type_, *ne, name=name)
    vals = rng.standard_normal(int(np.prod(ne))).astype(np.float32) * 3 if values is None else values
    t.set_data(np.asarray(vals).reshape(t.array().shape))
    return t


@pytest.fixture(params=["avx512", "avx2"])
def cpu(request) -> str:
    return request.param


def both_ways(out, cpu):
    """Run the graph of ``out`` with the reference executor and with a fast plan; return both results."""
    g = build_forward(out)
    graph_compute(g, cpu=cpu)
    ref = out.numpy()
    plan = graph_plan(g.nodes, cpu=cpu)
    assert plan.n_fast >= 1, "the op under test should have a fast binding"
    plan.compute()
    return ref, out.numpy()


def test_rms_norm_mul_add(cpu):
    ctx = GGMLContext()
    x, w, r = leaf(ctx, "f32", 576, 5), leaf(ctx, "f32", 576), leaf(ctx, "f32", 576, 5)
    out = ggml.add(ctx, ggml.mul(ctx, ggml.rms_norm(ctx, x, 1e-5), w), r)
    assert same_bits(*both_ways(out, cpu))


@pytest.mark.parametrize("rows", [1, 8])
def test_residual_add_norm_and_scale_fused(rows, cpu):
    """ADD -> RMS_NORM -> MUL by a weight row (a layer's residual and norm) runs as one step; the sum is
    still stored (read later) and both outputs equal the reference, also when the allocator gives the
    product the norm's bytes; with a capture hook every node runs on its own, with the same bits."""
    ctx = GGMLContext()
    a, b, w = leaf(ctx, "f32", 64, rows), leaf(ctx, "f32", 64, rows), leaf(ctx, "f32", 64)
    s = ggml.add(ctx, a, b)
    out = ggml.add(ctx, ggml.mul(ctx, ggml.rms_norm(ctx, s, 1e-6), w), s)     # s read twice, as a residual
    g = build_forward(out)
    graph_compute(g, cpu=cpu)
    ref_s, ref = s.numpy(), out.numpy()
    plan = graph_plan(g.nodes, cpu=cpu)
    assert plan.n_fused == 2
    s.array()[...], out.array()[...] = 0, 0
    plan.compute()
    assert same_bits(s.numpy(), ref_s) and same_bits(out.numpy(), ref)
    got = plan.compute(capture=lambda n: True)
    assert same_bits(got.get(out.name, out.numpy()), ref)


@pytest.mark.parametrize("n_q", [1, 4])
def test_soft_max_with_mask_and_scale(n_q, cpu):
    ctx = GGMLContext()
    x = leaf(ctx, "f32", 256, n_q, 3)
    m = np.zeros((n_q, 256), np.float32)
    m[:, 200:] = -np.inf
    m[0, 10] = -np.inf
    mask = leaf(ctx, "f32", 256, n_q, values=m)
    assert same_bits(*both_ways(ggml.soft_max_ext(ctx, x, mask, 0.125), cpu))


def test_swiglu(cpu):
    ctx = GGMLContext()
    g, u = leaf(ctx, "f32", 1536, 3), leaf(ctx, "f32", 1536, 3)
    assert same_bits(*both_ways(ggml.swiglu_split(ctx, g, u), cpu))


def test_geglu_through_the_f16_table(cpu):
    ctx = GGMLContext()
    v = (rng.standard_normal(2048 * 3) * 6).astype(np.float32)
    v[:8] = [-10.0, 10.0, -10.001, 9.999, -np.inf, np.inf, 65504.0, 70000.0]     # the cut-offs, and past f16
    g, u = leaf(ctx, "f32", 2048, 3, values=v), leaf(ctx, "f32", 2048, 3)
    assert same_bits(*both_ways(ggml.geglu_split(ctx, g, u), cpu))


@pytest.mark.parametrize("mode", [0, 2])
def test_rope_norm_and_neox(mode, cpu):
    ctx = GGMLContext()
    x = leaf(ctx, "f32", 64, 3, 5)
    pos = leaf(ctx, "i32", 5, values=np.array([0, 1, 7, 100, 4000], np.int32))
    out = ggml.rope_ext(ctx, x, pos, None, 64, mode, 8192, 100000.0, 1.0)
    assert same_bits(*both_ways(out, cpu))


@pytest.mark.parametrize("mode,n_dims", [(0, 64), (2, 64), (2, 32)])
def test_rope_then_scale_fused(mode, n_dims, cpu):
    """SCALE(ROPE(q)) (Gemma's query) is one step with the two ops' bits; a hook sees both nodes."""
    ctx = GGMLContext()
    x = leaf(ctx, "f32", 64, 3, 2)
    pos = leaf(ctx, "i32", 2, values=np.array([7, 4000], np.int32))
    out = ggml.scale(ctx, ggml.rope_ext(ctx, x, pos, None, n_dims, mode, 8192, 1e6, 1.0), 0.0625 * 1.1)
    g = build_forward(out)
    graph_compute(g, cpu=cpu)
    ref = out.numpy()
    plan = graph_plan(g.nodes, cpu=cpu)
    assert plan.n_fused == 1 and len(plan._run) == 1
    out.array()[...] = 0
    plan.compute()
    assert same_bits(out.numpy(), ref)
    got = plan.compute(capture=lambda n: True)
    assert same_bits(got.get(out.name, out.numpy()), ref)


def test_k_and_v_set_rows_fused(cpu):
    """A layer's SET_ROWS of K and of V at the same cells: one step, the bytes of two; an index out of
    range writes neither and raises as SET_ROWS does."""
    ctx = GGMLContext()
    ck, cv = (leaf(ctx, "f16", 32, 9, values=np.zeros(32 * 9, np.float32)) for _ in range(2))
    k, v = leaf(ctx, "f32", 32, 2), leaf(ctx, "f32", 32, 2)
    idx = leaf(ctx, "i32", 2, values=np.array([3, 8], np.int32))
    sk, sv = ggml.set_rows(ctx, ck, k, idx), ggml.set_rows(ctx, cv, v, idx)
    g = build_forward(sk)
    build_forward_expand(g, sv)
    graph_compute(g, cpu=cpu)
    ref = ck.array().copy(), cv.array().copy()
    ck.array()[...], cv.array()[...] = 0, 0
    plan = graph_plan(g.nodes, cpu=cpu)
    assert plan.n_fused == 1 and len(plan._run) == 1
    plan.compute()
    assert np.array_equal(ck.array(), ref[0]) and np.array_equal(cv.array(), ref[1])
    idx.set_data(np.array([3, 9], np.int32))
    ck.array()[...] = 0
    with pytest.raises(IndexError):
        plan.compute()
    assert not ck.array().any()


@pytest.mark.parametrize("n_dims,base,scale,attn", [(64, 10000.0, 1.0, 1.0), (256, 1e6, 0.125, 1.0),
                                                     (128, 500000.0, 1.0, 0.75), (2, 10000.0, 1.0, 1.0)])
def test_rope_cache_twin_calls_the_same_cosf(n_dims, base, scale, attn):
    """The numba RoPE cache (one call per step) equals the reference's ctypes cosf/sinf per pair, far
    out along the positions where theta is large and the C library's argument reduction works hardest."""
    from llmlab.ggml.cpu.fast.ops import rope_cache as fast_rope_cache
    from llmlab.ggml.cpu.ops import rope_cache
    pos = np.concatenate([np.arange(0, 70), rng.integers(0, 1 << 20, 300)]).astype(np.int32)
    fast = fast_rope_cache(pos, n_dims, base, scale, attn)
    if fast is None:
        pytest.skip("no C math library on this system: the reference rounds NumPy's cos, and no twin runs")
    ref = rope_cache(pos, n_dims, base, scale, attn)
    assert same_bits(fast[0], ref[0]) and same_bits(fast[1], ref[1])


@pytest.mark.parametrize("type_", ["f32", "q8_0"])
def test_get_rows(type_, cpu):
    ctx = GGMLContext()
    a = ggml.new_tensor(ctx, type_, 64, 10)
    if type_ == "f32":
        a.set_data(rng.standard_normal(640).astype(np.float32).reshape(a.array().shape))
    else:
        a.set_data(rng.integers(0, 256, a.array().size, dtype=np.uint8).view(a.array().dtype).reshape(a.array().shape))
        a.array().view(np.uint8).reshape(10, 2, 34)[..., 1] &= 0x3b          # finite f16 scales
    ids = leaf(ctx, "i32", 3, values=np.array([9, 0, 9], np.int32))
    assert same_bits(*both_ways(ggml.get_rows(ctx, a, ids), cpu))
    ids.set_data(np.array([1, 10, 2], np.int32))
    with pytest.raises(IndexError, match="out of range"):
        graph_plan(build_forward(ggml.get_rows(ctx, a, ids)).nodes, cpu=cpu).compute()
    one = leaf(ctx, "i32", 1, values=np.array([7], np.int32))          # one row (a decode step's output row)
    assert same_bits(*both_ways(ggml.get_rows(ctx, a, one), cpu))
    for bad in (10, -1):
        one.set_data(np.array([bad], np.int32))
        with pytest.raises(IndexError, match="out of range"):
            graph_plan(build_forward(ggml.get_rows(ctx, a, one)).nodes, cpu=cpu).compute()


@pytest.mark.parametrize("n_kv", [256, 260])
@pytest.mark.parametrize("n_q", [1, 2, 9])
@pytest.mark.parametrize("heads", [(3, 9), (1, 4)])
def test_f16_mul_mat_vec_dot_and_tinyblas(n_q, n_kv, heads, cpu):
    """One activation row takes ggml_vec_dot_f16, two or more llamafile's tinyBLAS (16-row register
    tiles; 260 rows end in a partial one); K over a permuted cache view as attention reads it, with
    grouped heads (GQA; one kv head: the cache rows are contiguous, as Gemma 3's are)."""
    hk, h = heads
    ctx = GGMLContext()
    k = leaf(ctx, "f16", 64, hk, n_kv, values=rng.standard_normal(64 * hk * n_kv).astype(np.float16))
    kp = ggml.permute(ctx, k, 0, 2, 1, 3)                       # (64, n_kv, hk): the cache as attention sees it
    q = ggml.permute(ctx, leaf(ctx, "f32", 64, h, n_q), 0, 2, 1, 3)
    assert same_bits(*both_ways(ggml.mul_mat(ctx, kp, q), cpu))


@pytest.mark.parametrize("n_kv", [256, 260, 320])
def test_attention_kqv_fused_with_the_transposed_v_copy(n_kv, cpu):
    """kqv = MUL_MAT(CONT(V^T), probabilities) for one token: without hooks the fast plan reads V's rows
    in place (the CONT absorbed); with a capture hook every node runs, kqv along K. Both equal the
    reference, for the register layouts of both profiles (and a K that is not a whole number of steps)."""
    ctx = GGMLContext()
    v = leaf(ctx, "f16", 64 * 3, n_kv, values=rng.standard_normal(64 * 3 * n_kv).astype(np.float16))
    vt = ggml.cont(ctx, ggml.permute(ctx, ggml.reshape(ctx, v, 64, 3, n_kv), 1, 2, 0, 3))   # (n_kv, 64, 3)
    p = leaf(ctx, "f32", n_kv, 1, 9, values=rng.random(n_kv * 9).astype(np.float32))
    out = ggml.mul_mat(ctx, vt, p)
    g = build_forward(out)
    graph_compute(g, cpu=cpu)
    ref = out.numpy()
    plan = graph_plan(g.nodes, cpu=cpu)
    assert plan.n_fused == 1
    out.array()[...] = 0
    plan.compute()
    assert same_bits(out.numpy(), ref)
    out.array()[...] = 0
    got = plan.compute(capture=lambda n: True)
    assert same_bits(got[out.name] if out.name in got else out.numpy(), ref)


@pytest.mark.parametrize("K", [64, 72, 256])
@pytest.mark.parametrize("R", [256, 260])
@pytest.mark.parametrize("heads", [(3, 9), (1, 4), (2, 10)])
def test_f16_register_tiles_equal_vec_dot_f16(K, R, heads, cpu):
    """A decode step's KQ and KQV in 16-row register tiles (the cache rows kept in tiles between steps)
    give ggml_vec_dot_f16's bits: grouped heads (three, four and five a kv head), a K that ends in
    leftovers (added in double), rows that end in a partial tile, zero cells, and only the rows flagged
    as written re-tiled (a stale tile would show); kqv read in place gives the same."""
    from llmlab.ggml.cpu.fast import vec as fvec
    from llmlab.ggml.cpu import profiles
    from llmlab.ggml.cpu.vec import vec_dot_f16
    v = fvec.params(profiles.resolve(cpu))
    if not fvec.tiles_fit(v.arr, v.lanes, v.vec_prog, min(K, R)):
        pytest.skip("K shorter than one step of this profile's registers")
    Hk, H = heads
    cache = rng.standard_normal((R, Hk, K)).astype(np.float16) * 4
    cache[-20:] = 0                                             # unused cells: all products +-0, the sum +0
    A = cache.view(np.uint16).transpose(1, 0, 2)                # KQ: (Hk, R, K), the cache rows' view
    X = rng.standard_normal((H, 1, K)).astype(np.float32)
    flags = np.ones(R, np.uint8)
    AT = np.zeros((Hk, -(-R // fvec.TW), K, fvec.TW), np.uint16)
    V = cache.view(np.uint16).reshape(R, Hk, K)                 # KQV: V^T's rows are the cells' columns
    P = rng.random((H, 1, R)).astype(np.float32)
    vflags = np.ones(R, np.uint8)
    VT = np.zeros((Hk, K // fvec.TW, R, fvec.TW), np.uint16)
    for _ in range(2):
        want_kq = vec_dot_f16(X.astype(np.float16)[:, :, None, :], cache.transpose(1, 0, 2)[np.arange(H) // (H // Hk)][:, None],
                              cpu)
        Y = np.empty((H, 1, R), np.float32)
        fvec.mul_mat_f16_tiles(A, X, Y, v.arr, v.lanes, v.vec_prog, flags, AT, 0)
        assert same_bits(Y, want_kq)
        if K % fvec.TW == 0:
            vt = cache.transpose(1, 2, 0)[np.arange(H) // (H // Hk)]    # (H, K, R)
            want_kqv = vec_dot_f16(P.astype(np.float16)[:, :, None, :], vt[:, None], cpu)
            O = np.empty((H, 1, K), np.float32)
            fvec.mul_mat_f16_vt_tiles(V, P, O, v.arr, v.lanes, v.vec_prog, vflags, VT, 0)
            assert same_bits(O, want_kqv)
            O = np.empty((H, 1, K), np.float32)                 # the cache rows read in place
            fvec.mul_mat_f16_vt(V, P, O, v.arr, v.lanes, v.vec_prog, 0)
            assert same_bits(O, want_kqv)
        cache[5] = -cache[5]                                    # a written row, flagged as the journal would
        flags[5] = vflags[5] = 1


@pytest.mark.parametrize("K", [32, 128])
def test_f16_kernels_start_their_registers_at_plus_zero(K, cpu):
    """ggml_vec_dot_f16 starts from zeroed registers (GGML_F32_VEC_ZERO, then fma): zero cache rows against
    an all-negative query sum to +0, not -0 (a register started at its first product would stay -0), and
    so do V columns of -0 against the probabilities; every decode-step kernel gives the reference's +0."""
    from llmlab.ggml.cpu import profiles
    from llmlab.ggml.cpu.fast import vec as fvec
    from llmlab.ggml.cpu.vec import vec_dot_f16
    prof = profiles.resolve(cpu)
    v = fvec.params(prof)
    H, R = 2, 256
    cache = rng.standard_normal((R, 1, K)).astype(np.float16)
    cache[:20] = 0
    A = cache.view(np.uint16).transpose(1, 0, 2)                # (1, R, K)
    X = -np.abs(rng.standard_normal((H, 1, K))).astype(np.float32) - 0.5
    want = vec_dot_f16(X.astype(np.float16)[:, :, None, :], cache.transpose(1, 0, 2)[np.zeros(H, int)][:, None], prof)
    assert not want[..., :20].view(np.uint32).any()
    w = v.arr * v.lanes
    runs = {"mul_mat_f16": lambda Y: fvec.mul_mat_f16(A, X, Y, v.arr, v.lanes, v.vec_prog),
            "cached": lambda Y: fvec.mul_mat_f16_cached(A, X, Y, v.arr, v.lanes, v.vec_prog, np.ones(R, np.uint8),
                                                        np.zeros((1, K, -(-R // fvec.RB), fvec.RB), np.uint16), 0),
            "long": lambda Y: fvec.mul_mat_f16_long(A.reshape(1, R, K // w, w), X, Y, v.lanes, v.vec_prog)}
    if fvec.tiles_fit(v.arr, v.lanes, v.vec_prog, K):
        runs["tiles"] = lambda Y: fvec.mul_mat_f16_tiles(A, X, Y, v.arr, v.lanes, v.vec_prog, np.ones(R, np.uint8),
                                                         np.zeros((1, R // fvec.TW, K, fvec.TW), np.uint16), 0)
    for name, run in runs.items():
        if name == "long" and K % w:
            continue
        Y = np.empty((H, 1, R), np.float32)
        run(Y)
        assert same_bits(Y, want), name
    V = cache.copy()                                            # kqv: V^T's row d is the cells' column d
    V[:, :, 3] = -0.0
    P = rng.random((H, 1, R)).astype(np.float32)
    want = vec_dot_f16(P.astype(np.float16)[:, :, None, :], V.transpose(1, 2, 0)[np.zeros(H, int)][:, None], prof)
    assert not want[..., 3].view(np.uint32).any()
    for tiled in (False, True):
        O = np.empty((H, 1, K), np.float32)
        if tiled:
            fvec.mul_mat_f16_vt_tiles(V.view(np.uint16), P, O, v.arr, v.lanes, v.vec_prog, np.ones(R, np.uint8),
                                      np.zeros((1, K // fvec.TW, R, fvec.TW), np.uint16), 0)
        else:
            fvec.mul_mat_f16_vt(V.view(np.uint16), P, O, v.arr, v.lanes, v.vec_prog, 0)
        assert same_bits(O, want), tiled


def test_row_journal_marks_exactly_the_written_rows():
    from llmlab.ggml.cpu.journal import index_writer, reader, rows_written
    cache = np.zeros((16, 8), np.float16)
    flags = reader(cache[:10])
    assert flags is not None and flags.tolist() == [1] * 16
    flags[:] = 0
    rows_written(cache[:10], np.array([3, 7]))
    assert np.flatnonzero(flags).tolist() == [3, 7]
    flags[:] = 0
    rows_written(cache[:, :4].T)                             # a view whose rows are not the cache's: all
    assert flags.all()
    assert reader(cache[2:]) is None                         # rows shifted against the owner: no journal
    other = np.zeros((16, 8), np.float16)
    idx = np.array([1, 9], np.int32)
    note = index_writer([cache[:10], other], idx)            # a writer bound once sees later readers too
    later, of_other = reader(cache), reader(other)
    flags[:], later[:], of_other[:] = 0, 0, 0
    note()
    assert [np.flatnonzero(f).tolist() for f in (flags, later, of_other)] == [[1, 9]] * 3
    idx[:] = [4, 4]                                          # the index buffer read when the note is made
    note()
    assert np.flatnonzero(flags).tolist() == [1, 4, 9]
    many = np.arange(0, 16, 2, dtype=np.int32).repeat(3)     # more than FEW_ROWS: one fancy-index write
    flags[:] = 0
    index_writer([cache], many)()
    assert np.flatnonzero(flags).tolist() == list(range(0, 16, 2))
    flags[:] = 0
    index_writer([cache[:, :4].T], idx)()                    # rows not the cache's: all of them
    assert flags.all()


@pytest.mark.parametrize("type_", ["f16", "f32"])
def test_set_rows_converts_like_the_reference(type_):
    ctx = GGMLContext()
    dst = leaf(ctx, type_, 64, 12, values=np.zeros(64 * 12, np.float32))
    v = rng.standard_normal(64 * 3).astype(np.float32) * 1e3
    v[:4] = [65520.0, -1e-8, 3.0e-5, np.inf]                       # rounds to inf, to zero, a subnormal
    src = leaf(ctx, "f32", 64, 3, values=v)
    idx = leaf(ctx, "i32", 3, values=np.array([5, 0, 11], np.int32))
    out = ggml.set_rows(ctx, dst, src, idx)
    g = build_forward(out)
    graph_compute(g)
    ref = dst.array().copy()
    dst.set_data(np.zeros_like(dst.array()))
    plan = graph_plan(g.nodes)
    assert plan.n_fast == 1
    plan.compute()
    assert np.array_equal(dst.array().view(np.uint8), ref.view(np.uint8))
    idx.set_data(np.array([5, 12, 0], np.int32))
    with pytest.raises(IndexError):
        plan.compute()


def test_quantized_mul_mat_and_cont(cpu):
    from llmlab.ggml.quant import quantize
    ctx = GGMLContext()
    raw = quantize(rng.standard_normal(576 * 64).astype(np.float32), "q4_1").reshape(64, -1)
    w = ggml.new_tensor(ctx, "q4_1", 576, 64, name="w")
    w.set_data(raw.reshape(w.array().shape))
    x = leaf(ctx, "f32", 576, 3)
    y = ggml.mul_mat(ctx, w, x)
    out = ggml.cont(ctx, ggml.transpose(ctx, y))
    assert same_bits(*both_ways(out, cpu))


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    d = tmp_path_factory.mktemp("tinyfast")
    return {a: Model(write_tiny(d / f"{a}.gguf", a, n_layer=3, seed=5, sliding_window=4)) for a in ("llama", "gemma3")}


@pytest.mark.parametrize("arch", ["llama", "gemma3"])
def test_whole_model_prompt_and_decode_steps(tiny, arch, cpu):
    outs = {}
    for kernels in ("fast", "reference"):
        ctx = Context(tiny[arch], n_ctx=64, kernels=kernels, cpu=cpu)
        seq = [ctx.decode(Batch.from_tokens([3, 1, 4, 1, 5, 9, 2, 6, 5, 3], logits="all"))]
        for i, t in enumerate([7, 11, 13]):
            seq.append(ctx.decode(Batch.from_tokens([t], pos0=10 + i, logits="last")))
        outs[kernels] = seq
    assert all(same_bits(a, b) for a, b in zip(outs["fast"], outs["reference"]))


def test_fast_plan_binds_every_compute_node_of_a_real_decode_step(smollm2_path):
    """A SmolLM2 decode step: all its compute nodes run on bound steps (numba kernels, or NumPy calls
    prepared once)."""
    ctx = Context(Model(smollm2_path), n_ctx=256)
    ctx.decode(Batch.from_tokens([1, 2, 3], logits="last"))
    ctx.decode(Batch.from_tokens([4], pos0=3, logits="last"))
    plan = ctx.backend.plan(ctx.last_graph.gf)
    slow = {n.op for n, s in zip(plan.nodes, plan.steps) if s is not None} - {
        n.op for n in plan.nodes if n.op in ("RMS_NORM", "MUL", "ADD", "MUL_MAT", "ROPE", "SET_ROWS",
                                             "CONT", "SOFT_MAX", "SWIGLU", "GET_ROWS")}
    assert slow == set()
    assert plan.n_fast == len(plan._run) + plan.n_fused
    absorbed = sorted({plan.nodes[i].name.split("-")[0] for i in plan.absorbed if plan.nodes[i].op != "SET_ROWS"})
    # every layer's CONT of V^T (read in place); V computed with K and up with gate, one region and one
    # activation quantization each (Q not: K's output bytes are Q's, freed by Q's ROPE in between); every
    # RMS_NORM with its MUL by the weight, and the residual ADD before it (60 of them: the first norm reads
    # the embeddings); every layer's SET_ROWS of K with its SET_ROWS of V (30), and K's ROPE just before them
    # (30); every layer's attention (kq and its SOFT_MAX, one step with kqv: 60), written straight into
    # kqv_out's bytes (its CONT's step, 30)
    assert absorbed == ["Kcur", "Vcur", "ffn_inp", "ffn_up", "kq", "kq_soft_max", "kqv", "l_out", "norm", "v_cont"]
    assert sum(plan.nodes[i].op == "SET_ROWS" for i in plan.absorbed) == 30
    assert sum(plan.nodes[i].op == "ROPE" for i in plan.absorbed) == 30
    assert sum(plan.nodes[i].op == "SOFT_MAX" for i in plan.absorbed) == 30
    assert plan.n_fused == 90 + 61 + 60 + 30 + 30 + 60 + 30
    assert len(plan._run) == 335


def test_fused_steps_of_a_real_gemma3_decode_step(gemma3_path):
    """A Gemma 3 decode step: each layer's q and k norms run with their ROPE (q's SCALE too) in one step
    each, attn_out reads kqv in place (its CONT skipped), and kq and its SOFT_MAX run in kqv's step: 5 steps
    a layer fewer than with the norm, rope, copy and attention steps alone."""
    ctx = Context(Model(gemma3_path), n_ctx=256)
    ctx.decode(Batch.from_tokens([1, 2, 3], logits="last"))
    ctx.decode(Batch.from_tokens([4], pos0=3, logits="last"))
    plan = ctx.backend.plan(ctx.last_graph.gf)
    n_layer = ctx.model.hparams.n_layer
    fused = [plan.nodes[i] for i in plan.fused]
    assert sum(n.op == "SCALE" and n.src[0].op == "ROPE" for n in fused) == n_layer         # q
    assert sum(n.op == "ROPE" for n in fused) == n_layer                                    # k
    assert all(plan.nodes[i].op != "ROPE" or plan.nodes[i].src[0].op == "MUL" for i in plan.absorbed)
    assert sum(n.op == "CONT" and n.name.startswith("kqv_out") for n in map(plan.nodes.__getitem__, plan.absorbed)) == n_layer
    assert sum(n.op == "SOFT_MAX" for n in map(plan.nodes.__getitem__, plan.absorbed)) == n_layer   # attention
    assert len(plan._run) == 294 - 2 * n_layer


def test_unknown_kernel_set_is_refused(tiny):
    with pytest.raises(ValueError, match="kernels"):
        Context(tiny["llama"], kernels="turbo")


@pytest.mark.parametrize("cpu", ["avx512", "avx2"])
def test_threaded_kernels_do_not_depend_on_the_split(cpu):
    """Each output is computed whole by one thread, so how the rows are cut cannot change a bit."""
    from llmlab.ggml.cpu import profiles
    from llmlab.ggml.cpu.fast import sgemm as fsgemm, vec as fvec
    prof = profiles.get(cpu)
    v = fvec.params(prof)
    A = rng.standard_normal((2, 96, 64)).astype(np.float16).view(np.uint16)
    B = rng.standard_normal((6, 5, 64)).astype(np.float16).astype(np.float32)
    one = np.empty((6, 5, 96), np.float32)
    fvec.mul_mat_f16(A, B, one, v.arr, v.lanes, v.vec_prog)
    blas = np.empty_like(one)
    fsgemm.mul_mat_f16(A, B, blas, prof.sgemm_lanes, 1)
    x = rng.standard_normal((6, 5, 96)).astype(np.float32)
    m = np.zeros((0, 96), np.float32)
    sm = np.empty_like(x)
    fvec.soft_max(x, m, np.float32(0.5), sm, v.lanes, v.hsum_prog, v.expf)
    for n in (1, 2, 7):
        many = np.empty_like(one)
        fvec.mul_mat_f16_mt(A, B, many, v.arr, v.lanes, v.vec_prog, n)
        assert same_bits(one, many)
        blas_n = np.empty_like(one)
        fsgemm.mul_mat_f16(A, B, blas_n, prof.sgemm_lanes, n)
        assert same_bits(blas, blas_n)
        sm2 = np.empty_like(x)
        fvec.soft_max_mt(x, m, np.float32(0.5), sm2, v.lanes, v.hsum_prog, v.expf, n)
        assert same_bits(sm, sm2)


@pytest.mark.parametrize("cpu", ["avx512", "avx2"])
def test_expf_variants_equal_the_reference_everywhere(cpu):
    """ggml_v_expf of each profile on the whole range softmax and SiLU meet, saturation and -inf included."""
    from llmlab.ggml.cpu import profiles, vec
    from llmlab.ggml.cpu.fast import vec as fvec
    prof = profiles.get(cpu)
    x = np.concatenate([np.linspace(-120, 100, 20001, dtype=np.float32), rng.standard_normal(5000).astype(np.float32) * 30,
                        np.array([-np.inf, np.inf, np.nan, 0.0, -0.0, -87.5, 88.7, -103.9, -150.0, 130.0, 200.0, -200.0],
                                 np.float32),
                        np.float32(np.log(2)) * np.arange(-194, 195, 0.5, dtype=np.float32),   # each 2^n case's edges
                        np.arange(0, 1 << 32, 65537, dtype=np.uint64).astype(np.uint32).view(np.float32)])  # all exponents
    out = np.empty_like(x)
    fvec.expf(x, out, fvec.params(prof).expf)
    nan = np.isnan(x)                       # a NaN in gives a NaN out (its payload is not ggml's concern)
    assert same_bits(out[~nan], vec.v_expf(x[~nan], prof)) and np.isnan(out[nan]).all() and nan.sum() > 100


def test_decode_after_cache_edits_equals_reference(tiny):
    """A decode step keeps the cache rows it widened; rewriting cells (seq_rm, then other tokens at the
    same positions) must be seen, so fast and reference agree bit for bit through the edits."""
    outs = {}
    for kernels in ("fast", "reference"):
        ctx = Context(tiny["llama"], n_ctx=64, kernels=kernels)
        seq = [ctx.decode(Batch.from_tokens([3, 1, 4, 1, 5], logits="last"))]
        for i, t in enumerate([9, 2, 6]):
            seq.append(ctx.decode(Batch.from_tokens([t], pos0=5 + i, logits="last")))
        ctx.kv.seq_rm(0, 3, None)                              # forget positions 3.. and write them anew
        for i, t in enumerate([7, 7, 8, 1]):
            seq.append(ctx.decode(Batch.from_tokens([t], pos0=3 + i, logits="last")))
        outs[kernels] = seq
    assert all(same_bits(a, b) for a, b in zip(outs["fast"], outs["reference"]))


def test_small_read_only_operands_are_read_from_a_private_copy():
    """A norm's weight lies in the file's read-only mmap between quantized weights: the plan reads a copy
    (same bytes), so that its reads each step do not fault the packed weights' file pages back in."""
    from llmlab.ggml.cpu.cplan import SMALL_WEIGHT, _resident
    ro = np.arange(16, dtype=np.float32)
    ro.flags.writeable = False
    got = _resident(ro)
    assert got is not ro and got.flags.writeable and np.array_equal(got, ro)
    rw = np.arange(16, dtype=np.float32)
    assert _resident(rw) is rw                                  # an activation buffer: written by steps
    big = np.zeros(SMALL_WEIGHT // 4 + 1, np.float32)
    big.flags.writeable = False
    assert _resident(big) is big


def _file_rss_kib(path) -> int | None:
    """Resident KiB of this process's mappings of ``path`` (Linux's smaps; None elsewhere)."""
    import os
    import re
    try:
        lines = open("/proc/self/smaps", encoding="utf-8", errors="replace").read().splitlines()
    except OSError:
        return None
    total, on, want = 0, False, os.path.realpath(path)
    for line in lines:
        if re.match(r"^[0-9a-f]+-[0-9a-f]+ ", line):
            on = line.rstrip().endswith(want)
        elif on and line.startswith("Rss:"):
            total += int(line.split()[1])
    return total


def test_embedding_rows_do_not_keep_the_files_pages(tmp_path):
    """GET_ROWS reads the q8_0 embeddings from the file's mmap; each row read maps up to 64 KiB of file
    pages around it. The plan drops them every DROP_ROWS rows (the table is also the packed LM head's
    source, whose pages the packing dropped), so a prompt of spread-out tokens leaves the file's pages
    unmapped, and the logits are the reference's."""
    from llmlab.ggml.cpu.cplan import DROP_ROWS
    path = write_tiny(tmp_path / "emb.gguf", "llama", n_layer=1, n_embd=256, n_vocab=4096, seed=9, wtype="q8_0")
    toks = [int(t) for t in np.linspace(0, 4095, DROP_ROWS + 8).astype(int)]     # rows 32 KiB apart
    outs = {}
    for kernels in ("fast", "reference"):
        ctx = Context(Model(path), n_ctx=64, kernels=kernels, cpu="avx2")
        outs[kernels] = ctx.decode(Batch.from_tokens(toks, logits="all"))
        if kernels == "fast":
            kib = _file_rss_kib(path)
            if kib is not None:         # the table is 1.1 MB: read in place and kept, most of it stays mapped
                assert kib < 256, kib
    assert same_bits(outs["fast"], outs["reference"])
