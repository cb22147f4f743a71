"""Pictures of a GGUF file: coloured hex, a to-scale map, tables, the loading phases.

Notebook 01 calls these; each takes the parsed ``GGUFFile`` and plain parameters.
"""
from __future__ import annotations

import html
import time

import numpy as np

from ..ggml.gguf import GGUFFile, StringArray
from ..ggml.gguf.dump import type_histogram
from .html import HTML, table

KIND_COLOURS = {"header": "#f4a261", "kv": "#8ecae6", "tensor_info": "#b5e48c",
                "padding": "#dddddd", "tensor_data": "#cdb4db"}

# one colour per ggml type name, stable across models
TYPE_COLOURS = {"f32": "#e76f51", "f16": "#f4a261", "bf16": "#e9c46a", "q8_0": "#2a9d8f", "q4_0": "#264653",
                "q4_1": "#457b9d", "q5_0": "#6d597a", "q5_1": "#b56576", "q4_k": "#1d3557", "q5_k": "#6a4c93",
                "q6_k": "#8ab17d", "q2_k": "#ffb703", "q3_k": "#fb8500", "q8_k": "#023047"}


def _field_parts(f: GGUFFile, key: str) -> list[tuple[int, int, str]]:
    """Split one KV pair's bytes into its fields: key length, key, type, value."""
    s = f.fields[key].span
    klen = 8 + len(key.encode())
    return [(s.start, s.start + 8, "key length (u64)"), (s.start + 8, s.start + klen, f"key {key!r}"),
            (s.start + klen, s.start + klen + 4, f"value type {f.fields[key].type.name}"),
            (s.start + klen + 4, s.end, "value")]


def byte_regions(f: GGUFFile, end: int) -> list[tuple[int, int, str, str]]:
    """(start, end, colour, tooltip) for every field in the first ``end`` bytes."""
    regions = [(0, 4, "#e76f51", 'magic "GGUF"'), (4, 8, "#f4a261", f"version = {f.version}"),
               (8, 16, "#e9c46a", f"tensor count = {len(f.tensors)}"), (16, 24, "#ffd166", f"kv count = {len(f.fields)}")]
    palette = ["#8ecae6", "#219ebc", "#bde0fe", "#a2d2ff"]
    for key, fld in f.fields.items():
        if fld.span.start >= end:
            break
        for (a, b, what), colour in zip(_field_parts(f, key), palette):
            regions.append((a, b, colour, what))
    return regions


def hex_view(f: GGUFFile, start: int = 0, end: int = 256, width: int = 16) -> HTML:
    """Hex and ASCII of ``[start, end)``, each byte coloured by the field it belongs to."""
    buf = f.buffer[start:end].tobytes()
    colour = [None] * len(buf)
    tip = [""] * len(buf)
    for a, b, c, t in byte_regions(f, end):
        for i in range(max(a, start), min(b, end)):
            colour[i - start], tip[i - start] = c, t
    rows = []
    for r in range(0, len(buf), width):
        cells, chars = [], []
        for i in range(r, min(r + width, len(buf))):
            style = f"background:{colour[i]}" if colour[i] else ""
            t = html.escape(tip[i], quote=True)
            cells.append(f'<span style="{style}" title="{t}">{buf[i]:02x}</span>')
            ch = chr(buf[i]) if 32 <= buf[i] < 127 else "."
            chars.append(f'<span style="{style}" title="{t}">{html.escape(ch)}</span>')
        rows.append(f"<span style='color:#888'>{start + r:08x}</span>  " + " ".join(cells) + "  " + "".join(chars))
    legend = " ".join(f'<span style="background:{c};padding:0 4px">{html.escape(t)}</span>'
                      for a, b, c, t in byte_regions(f, end) if a < end and b > start)
    return HTML("<pre style='font-size:12px;line-height:1.35'>" + "\n".join(rows) + "</pre>"
                + f"<div style='font-size:11px;line-height:1.9'>{legend}</div>")


def _value_text(v, n: int = 6) -> str:
    if isinstance(v, (np.ndarray, StringArray, list)):
        items = [repr(x) if isinstance(x, str) else str(x) for x in list(v[:n])]
        return "[" + ", ".join(items) + (", ..." if len(v) > n else "") + f"] ({len(v):,} items)"
    s = repr(v) if isinstance(v, str) else str(v)
    return s if len(s) < 90 else s[:87] + "..."


def metadata_table(f: GGUFFile) -> HTML:
    rows = []
    for k, fld in f.fields.items():
        t = fld.type.name.lower() + (f"[{fld.item_type.name.lower()}]" if fld.item_type is not None else "")
        rows.append([k, t, _value_text(fld.value), f"{fld.span.start:,}", f"{fld.span.size:,}"])
    return table(["key", "type", "value", "offset", "bytes"], rows)


def tensor_table(f: GGUFFile, names: list[str] | None = None, limit: int | None = None) -> HTML:
    ts = [f.tensor(n) for n in names] if names else f.tensors[:limit]
    rows = [[t.name, t.type.name, str(list(t.shape)), f"{t.offset:,}", f"{t.nbytes:,}",
             f"{8 * t.nbytes / t.n_elements:.2f}"] for t in ts]
    return table(["name", "type", "ne (ggml order)", "offset in data", "bytes", "bits/weight"], rows)


def type_table(f: GGUFFile) -> HTML:
    rows = [[name, n, f"{el:,}", f"{by:,}", f"{8 * by / el:.2f}", f"{100 * by / f.file_size:.1f}%"]
            for name, n, el, by in type_histogram(f)]
    return table(["type", "tensors", "elements", "bytes", "bits/weight", "of file"], rows)


def file_map(f: GGUFFile, ax=None, zoom: bool = True, highlight: str | None = None):
    """The whole file to scale (top bar), and its first ``data_offset`` bytes enlarged (bottom bar).
    ``highlight`` names a tensor whose directory entry and data are marked."""
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    rows = 2 if zoom else 1
    if ax is None:
        fig, axes = plt.subplots(rows, 1, figsize=(12, 1.5 * rows + 0.7))
        axes = np.atleast_1d(axes)
    else:
        axes, fig = np.atleast_1d(ax), np.atleast_1d(ax)[0].figure

    def draw(a, lo, hi, title):
        for s in f.spans:
            if s.end <= lo or s.start >= hi:
                continue
            c = TYPE_COLOURS.get(f.tensor(s.label).type.name, "#999") if s.kind == "tensor_data" else KIND_COLOURS[s.kind]
            w = min(s.end, hi) - max(s.start, lo)
            a.barh(0, w, left=max(s.start, lo), color=c, height=0.8,
                   edgecolor="white" if s.kind in ("tensor_data", "kv") else None, linewidth=0.3)
            if s.kind == "kv" and w > 0.06 * (hi - lo):
                a.text(max(s.start, lo) + w / 2, 0, s.label, ha="center", va="center", fontsize=8)
        if highlight is not None:
            t = f.tensor(highlight)
            for span in (t.info_span, t.data_span):
                if span.end > lo and span.start < hi:
                    mid = (max(span.start, lo) + min(span.end, hi)) / 2
                    a.plot([mid, mid], [-0.4, 0.45], color="crimson", lw=1.5)
                    a.text(mid, 0.47, highlight, ha="center", va="bottom", fontsize=8, color="crimson")
        a.set_ylim(-0.45, 0.8)
        a.set_xlim(lo, hi)
        a.set_yticks([])
        a.set_title(title, fontsize=10, loc="left")
        a.xaxis.set_major_formatter(lambda x, _: f"{x / 1e6:.1f} MB" if hi > 5e6 else f"{x / 1e3:.0f} kB")

    draw(axes[0], 0, f.file_size, f"{f.path.name}: {f.file_size / 1e6:.1f} MB to scale (tensor data coloured by type)")
    if zoom:
        draw(axes[1], 0, f.data_offset, f"the first {f.data_offset / 1e6:.2f} MB: header, metadata, tensor directory")
    used = {f.tensor(s.label).type.name for s in f.spans if s.kind == "tensor_data"}
    handles = [Patch(color=KIND_COLOURS[k], label=k.replace("_", " ")) for k in ("header", "kv", "tensor_info", "padding")]
    handles += [Patch(color=TYPE_COLOURS.get(t, "#999"), label=f"data: {t}") for t in sorted(used)]
    axes[-1].legend(handles=handles, ncol=len(handles), loc="upper center", bbox_to_anchor=(0.5, -0.45),
                    fontsize=8, frameon=False)
    fig.tight_layout()
    return fig


def kv_size_breakdown(f: GGUFFile) -> list[tuple[str, int]]:
    """Bytes of the metadata by key, largest first (the vocabulary dominates)."""
    return sorted(((k, fld.span.size) for k, fld in f.fields.items()), key=lambda r: -r[1])


def time_loading_phases(path, repeat: int = 3) -> dict[str, float]:
    """The four loading phases of llama.cpp, timed in llmlab (best of ``repeat``, seconds):
    1. parse the GGUF; 2. architecture, hparams and vocabulary; 3. tensor descriptors (no data);
    4. data binding, two ways: mmap views (zero-copy) vs reading every byte into memory,
    and the first touch of mmapped data (page faults)."""
    best: dict[str, float] = {}

    def tick(name, t0):
        best[name] = min(best.get(name, np.inf), time.perf_counter() - t0)

    for _ in range(repeat):
        t0 = time.perf_counter()
        f = GGUFFile(path)
        tick("1. parse GGUF (header, metadata, directory)", t0)
        t0 = time.perf_counter()
        arch = f.architecture
        hp = {k: v for k, v in f.kv.items() if k.startswith(arch + ".")}
        vocab = f.kv["tokenizer.ggml.tokens"].tolist()
        tick("2. architecture, hparams, vocabulary", t0)
        t0 = time.perf_counter()
        descriptors = {t.name: (t.type.name, t.shape, t.offset) for t in f.tensors}
        tick("3. tensor descriptors (no data)", t0)
        t0 = time.perf_counter()
        views = {t.name: t.data for t in f.tensors}
        tick("4a. data binding: mmap views", t0)
        t0 = time.perf_counter()
        total = 0
        for v in views.values():
            total += int(v[::4096].sum())   # one byte per page: every page faulted in
        tick("4b. first touch of every mmapped page", t0)
        t0 = time.perf_counter()
        with open(path, "rb") as fh:
            fh.seek(f.data_offset)
            data = fh.read()
        tick("4c. data loading: read() into memory", t0)
        del views, data, descriptors, hp, vocab
        f.close()
    return best


# The seed's hparams table: llama.cpp's name, the GGUF key (after "{arch}."), what it means.
HPARAM_KEYS = [
    ("n_embd", "embedding_length", "hidden size"),
    ("n_layer", "block_count", "transformer layers"),
    ("n_head", "attention.head_count", "attention heads"),
    ("n_head_kv", "attention.head_count_kv", "KV heads (fewer under GQA)"),
    ("n_vocab", "vocab_size", "vocabulary size"),
    ("n_ff", "feed_forward_length", "FFN inner size"),
    ("n_ctx_train", "context_length", "training context length"),
    ("head_dim", "attention.key_length", "size of one head"),
]

# how each per-layer weight's ne follows from the hparams (ne[0] is the input side of the matmul)
SHAPE_RULES = {
    "token_embd.weight": ("n_embd", "n_vocab"),
    "blk.{i}.attn_q.weight": ("n_embd", "n_head*head_dim"),
    "blk.{i}.attn_k.weight": ("n_embd", "n_head_kv*head_dim"),
    "blk.{i}.attn_v.weight": ("n_embd", "n_head_kv*head_dim"),
    "blk.{i}.attn_output.weight": ("n_head*head_dim", "n_embd"),
    "blk.{i}.ffn_gate.weight": ("n_embd", "n_ff"),
    "blk.{i}.ffn_up.weight": ("n_embd", "n_ff"),
    "blk.{i}.ffn_down.weight": ("n_ff", "n_embd"),
    "blk.{i}.attn_norm.weight": ("n_embd",),
    "blk.{i}.ffn_norm.weight": ("n_embd",),
}


def hparams_of(f: GGUFFile) -> dict[str, int]:
    """The seed's hparams, read from the file (llama.cpp's defaults where a key is absent)."""
    arch = f.architecture
    hp = {}
    for name, key, _ in HPARAM_KEYS:
        v = f.kv.get(f"{arch}.{key}")
        if v is None and name == "n_vocab":
            v = len(f.kv["tokenizer.ggml.tokens"])
        if v is None and name == "head_dim":
            v = hp["n_embd"] // hp["n_head"]
        hp[name] = int(v)
    return hp


def expected_shape(rule: tuple[str, ...], hp: dict[str, int]) -> tuple[int, ...]:
    out = []
    for expr in rule:
        n = 1
        for factor in expr.split("*"):
            n *= hp[factor]
        out.append(n)
    return tuple(out)


def shape_check(f: GGUFFile) -> list[list]:
    """For every rule: the formula, the shape it predicts, the file's shape of layer 0, and
    whether every layer agrees."""
    hp = hparams_of(f)
    rows = []
    for pattern, rule in SHAPE_RULES.items():
        want = expected_shape(rule, hp)
        names = [pattern.format(i=i) for i in range(hp["n_layer"])] if "{i}" in pattern else [pattern]
        got = [f.tensor(n).shape for n in names if n in f]
        rows.append([pattern.format(i=0), "[" + ", ".join(rule) + "]", list(want),
                     list(got[0]) if got else "absent", bool(got) and all(g == want for g in got)])
    return rows


def tensor_groups(f: GGUFFile) -> dict[str, list[str]]:
    """Tensor names grouped by layer, in layer order: "global" (embedding, output norm, LM head)
    first, then "blk.0", "blk.1", ... For menus that would otherwise list hundreds of names."""
    groups: dict[str, list[str]] = {"global": []}
    layers: dict[int, list[str]] = {}
    for t in f.tensors:
        parts = t.name.split(".")
        if parts[0] == "blk" and len(parts) > 1 and parts[1].isdigit():
            layers.setdefault(int(parts[1]), []).append(t.name)
        else:
            groups["global"].append(t.name)
    for i in sorted(layers):
        groups[f"blk.{i}"] = sorted(layers[i])
    return groups
