"""The backend scheduler: n_gpu_layers placement, the five passes, splits and copies, CPU threads, plug-ins."""
from __future__ import annotations

import numpy as np
import pytest

from llmlab.ggml import GGMLContext, build_forward, graph_compute
from llmlab.ggml import ops as ggml
from llmlab.llama import Batch, Context, Model
from llmlab.llama.tiny import write_tiny
from llmlab.ggml.sched import AccelBackend, CPUBackend, Scheduler
from llmlab.ggml import quant
from llmlab.ggml.sched.placement import layer_devices
from llmlab.ggml.cpu.thread_trace import mul_mat_chunking, rows_blocks, rows_interleaved, trace_nodes

TOKENS = [3, 17, 5, 99, 42, 7, 1, 250]


@pytest.fixture(scope="module")
def tiny_models(tmp_path_factory):
    d = tmp_path_factory.mktemp("tiny")
    return {arch: Model(write_tiny(d / f"{arch}.gguf", arch, n_layer=4, seed=1)) for arch in ("llama", "gemma3")}


@pytest.fixture(scope="module")
def tiny32(tmp_path_factory):
    p = write_tiny(tmp_path_factory.mktemp("t32") / "t32.gguf", "llama", n_layer=32, n_embd=32, n_head=4,
                   n_head_kv=2, n_ff=64, n_vocab=64)
    return Model(p)


def test_layer_placement_rule():
    """llama.cpp's load_tensors: the last n_gpu_layers of the n_layer + 1 slots (the output layer is the last)."""
    on = [d is not None for d in layer_devices(32, 20, [1.0])]
    assert on == [False] * 13 + [True] * 20                  # i_gpu_start = 33 - 20
    assert layer_devices(32, 1, [1.0]) == [None] * 32 + [0]  # one layer: the output layer only
    assert all(d == 0 for d in layer_devices(32, 33, [1.0])) and layer_devices(32, 0, [1.0]) == [None] * 33


def test_seed_example_32_layers_ngl20_gives_2_splits(tiny32):
    """The seed's 32-layer model with 20 layers offloaded: llama.cpp offloads blocks 13-31 and the output
    layer, so the run goes CPU -> accelerator once (the seed's CPU -> accelerator -> CPU is not llama.cpp's)."""
    sched = Scheduler([AccelBackend(), CPUBackend()], n_gpu_layers=20)
    Context(tiny32, n_ctx=32, sched=sched).decode(Batch.from_tokens([1, 2, 3], logits="all"))
    s = sched.last
    assert s.n_splits == 2
    rows = s.summary()
    assert [r["backend"] for r in rows] == ["CPU", "ACCEL"]
    assert rows[0]["first"] == "embd"                                    # the embedding lookup and blocks 0-12
    # block 12's closing residual add has no weight: the accelerator's expansion takes it, so both of its
    # operands cross instead of l_out-12
    assert {"ffn_out-12", "ffn_inp-12", "inp_pos", "kq_mask"} <= set(rows[1]["inputs"])
    assert rows[1]["last"] == "result_output"                            # blocks 13..31 + LM head
    assert len(s.passes) == 4 and all(len(p[1]) == s.graph.n_nodes for p in s.passes)


@pytest.mark.parametrize("arch", ["llama", "gemma3"])
@pytest.mark.parametrize("ngl,ops", [(0, None), (2, None), (5, None), (3, {"MUL_MAT", "ADD", "MUL", "RMS_NORM"}),
                                     (5, {"MUL_MAT"}), (5, {"MUL_MAT", "SOFT_MAX", "ROPE", "CPY", "CONT"})])
def test_scheduled_run_equals_single_backend(tiny_models, arch, ngl, ops):
    m = tiny_models[arch]
    ref = Context(m, n_ctx=32).decode(Batch.from_tokens(TOKENS, logits="all"))
    sched = Scheduler([AccelBackend(supported_ops=ops), CPUBackend()], n_gpu_layers=ngl)
    got = Context(m, n_ctx=32, sched=sched).decode(Batch.from_tokens(TOKENS, logits="all"))
    np.testing.assert_array_equal(got, ref)
    s = sched.last
    if ngl == 0:
        assert s.n_splits == 1 and s.n_copies == 0
    else:
        assert s.n_splits >= 2 and s.bytes_copied > 0
        assert s.n_copies == sum(len(sp.inputs) for sp in s.splits)


def test_unsupported_ops_make_more_splits(tiny_models):
    m = tiny_models["llama"]
    n = {}
    for name, ops in [("all", None), ("matmul only", {"MUL_MAT"})]:
        sched = Scheduler([AccelBackend(supported_ops=ops), CPUBackend()], n_gpu_layers=5)
        Context(m, n_ctx=32, sched=sched).decode(Batch.from_tokens(TOKENS, logits="all"))
        n[name] = sched.last.n_splits
    assert n["all"] == 2 and n["matmul only"] > 4 * 4


def test_op_offload_of_large_batches(tiny_models):
    """Weights on the CPU, a batch of >= 32 tokens: the accelerator asks to take the matmuls (pass 1 '1.off')."""
    m = tiny_models["llama"]
    sched = Scheduler([AccelBackend(), CPUBackend()], n_gpu_layers=0)
    toks = list(range(40))
    ref = Context(m, n_ctx=64).decode(Batch.from_tokens(toks, logits="all"))
    got = Context(m, n_ctx=64, sched=sched).decode(Batch.from_tokens(toks, logits="all"))
    np.testing.assert_array_equal(got, ref)
    assert "1.off" in sched.last.causes.values()


def test_split_graph_leaves_the_graph_untouched(tiny_models):
    """The copies are the schedule's: every node keeps its sources, scheduling twice gives the same splits and
    the same bytes to copy (notebook 06's slider re-schedules one graph)."""
    m = tiny_models["gemma3"]
    g = Context(m, n_ctx=32).build_graph(6)
    before = [(n, n.src) for n in g.gf.nodes]
    sched = Scheduler([AccelBackend(), CPUBackend()], n_gpu_layers=2)
    first = sched.schedule(g)
    assert [(n, n.src) for n in g.gf.nodes] == before
    second = sched.schedule(g)
    assert first.bytes_to_copy == second.bytes_to_copy > 0 and first.summary() == second.summary()
    read = {id(c) for srcs in first.node_src.values() for c in srcs}
    assert {id(c) for c in first.copies.values()} <= read                  # every copy has a reader
    assert all(n.src == src for n, src in before)


def test_copies_are_required():
    """The accelerator refuses to read CPU memory directly: the copies are not decoration."""
    from llmlab.ggml.sched.scheduler import Schedule, Split
    sched = Scheduler([AccelBackend(), CPUBackend()])
    ctx = GGMLContext()
    a = ggml.new_tensor(ctx, "f32", 4, name="a")
    a.set_data(np.ones(4))
    b = ggml.silu(ctx, a)
    g = build_forward(b)
    s = Schedule(g, sched.backends, {id(a): 1, id(b): 0}, [], {}, [Split(0, 0, 1)], {})
    with pytest.raises(RuntimeError, match="without a copy"):
        sched.compute_schedule(s)


def test_thread_partitions():
    assert rows_interleaved(12, 4)[1] == [1, 5, 9]
    assert rows_blocks(12, 4)[1] == [3, 4, 5]
    assert rows_blocks(10, 4) == [[0, 1, 2], [3, 4, 5], [6, 7, 8], [9]]
    # ggml: few chunks -> one per thread along the larger dimension
    assert mul_mat_chunking(576, 1, 2) == (9, 1, 64, 1)         # 64-row chunks for a matrix-vector product
    assert mul_mat_chunking(100, 1, 4) == (4, 1, 25, 1)
    n0, n1, dr0, dr1 = mul_mat_chunking(1536, 64, 4)
    assert (n0, n1, dr0, dr1) == (96, 4, 16, 16)


def test_traced_threads_compute_the_same_and_cover_every_chunk():
    rng = np.random.default_rng(0)
    ctx = GGMLContext()
    w = ggml.new_tensor(ctx, "f32", 32, 200, name="w")
    w.set_data(rng.standard_normal((200, 32)))
    x = ggml.new_tensor(ctx, "f32", 32, 40, name="x")
    x.set_data(rng.standard_normal((40, 32)))
    y = ggml.mul_mat(ctx, w, x)
    z = ggml.soft_max(ctx, y)
    g = build_forward(z)
    traces = trace_nodes(g.nodes, nth=3)
    traced = z.numpy().copy()
    graph_compute(g)
    np.testing.assert_allclose(traced, z.numpy(), rtol=1e-4, atol=1e-9)   # f32 sums in another order
    mm = traces[0]
    n0, n1, _, _ = mul_mat_chunking(200, 40, 3)
    chunks = sorted(c[0] for per_thread in mm.work for c in per_thread)
    assert chunks == list(range(n0 * n1))                         # every chunk exactly once
    assert [c[0] for c in mm.work[1]][0] == 1                      # thread ith starts at chunk ith
    assert traces[1].kind == "interleaved"


def test_plugin_first_plain_path_as_fallback():
    from llmlab.ggml.cpu.repack import RepackPlugin
    rng = np.random.default_rng(1)
    ctx = GGMLContext()
    W = rng.standard_normal((16, 64)).astype(np.float32)
    w = ggml.new_tensor(ctx, "q8_0", 64, 16, name="w")
    w.data[:] = quant.quantize(W.reshape(-1), "q8_0")
    x = ggml.new_tensor(ctx, "f32", 64, 3, name="x")
    x.set_data(rng.standard_normal((3, 64)))
    f = ggml.new_tensor(ctx, "f32", 64, 16, name="f")
    f.set_data(W)
    y, yf = ggml.mul_mat(ctx, w, x), ggml.mul_mat(ctx, f, x)
    g = build_forward(y)
    graph_compute(g)
    plain = y.numpy().copy()
    cpu = CPUBackend(extra=[RepackPlugin()])
    y.data = None
    cpu.compute(g.nodes)
    np.testing.assert_array_equal(y.numpy(), plain)
    assert cpu.plugin_log == [(y.name, "REPACK")]
    cpu.compute(build_forward(yf).nodes)          # f32 weight: the plug-in declines, plain path runs
    assert len(cpu.plugin_log) == 1
    np.testing.assert_allclose(yf.numpy(), x.numpy() @ W.T, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("kernels", ["fast", "reference"])
def test_cpu_backend_runs_a_graph_on_its_kernel_set(kernels):
    """A whole graph on the CPU backend: through its plan (kept for the same graph), the executor's bits;
    with a plug-in registered, node by node so that the plug-in sees every node."""
    from llmlab.ggml.cpu.repack import RepackPlugin
    rng = np.random.default_rng(2)
    ctx = GGMLContext(no_alloc=True)
    w = ggml.new_tensor(ctx, "q8_0", 64, 16, name="w")
    w.set_data(quant.quantize(rng.standard_normal(16 * 64).astype(np.float32), "q8_0"))
    x = ggml.new_tensor(ctx, "f32", 64, 3, name="x")
    x.set_data(rng.standard_normal((3, 64)))
    y = ggml.rms_norm(ctx, ggml.mul_mat(ctx, w, x), 1e-5)
    g = build_forward(y)
    graph_compute(g)
    ref = y.numpy().copy()
    for n in g.nodes:
        n.data = None
    be = CPUBackend(kernels=kernels)
    got = be.graph_compute(g, capture=[y.name])
    assert np.array_equal(got[y.name], ref) and be.plan(g) is be.plan(g)
    assert be.plan(g).n_fast == (2 if kernels == "fast" else 0)
    plug = CPUBackend(extra=[RepackPlugin()], kernels=kernels)
    plug.graph_compute(g)
    assert np.array_equal(y.numpy(), ref) and plug.plugin_log == [(g.nodes[0].name, "REPACK")]
    with pytest.raises(ValueError, match="kernels"):
        CPUBackend(kernels="turbo")


def test_cpu_backend_frees_the_plan_it_replaces_before_planning(monkeypatch):
    """The CPU backend keeps two plans (a context's one-token graph and its batch graph). A third graph's
    plan replaces the older one, which is gone before the new one is built: their arenas and cache
    tiles are never held at once (peak memory). The kept plans are still found."""
    import gc
    import weakref
    from llmlab.ggml.sched import backend as B

    def graph(n):
        ctx = GGMLContext(no_alloc=True)
        x = ggml.new_tensor(ctx, "f32", 8, n, name="x")
        x.set_data(np.ones((n, 8), np.float32))
        return build_forward(ggml.rms_norm(ctx, x, 1e-5))

    be = CPUBackend(kernels="reference")
    g1, g2, g3 = graph(1), graph(2), graph(3)
    p1 = weakref.ref(be.plan(g1))
    p2 = be.plan(g2)
    seen = []
    real = B.graph_plan

    def spy(nodes, **kw):
        gc.collect()
        seen.append(p1() is None)
        return real(nodes, **kw)
    monkeypatch.setattr(B, "graph_plan", spy)
    p3 = be.plan(g3)
    assert seen == [True]
    assert be.plan(g2) is p2 and be.plan(g3) is p3
