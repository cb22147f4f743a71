"""Pictures and tables of the KV cache (notebook 04): cells and slots, the find_slot ring, masks, memory.

Every function takes a cache (or plain numbers) and returns a matplotlib
figure or an HTML table; nothing here changes a cache.
"""
from __future__ import annotations

from pathlib import Path
from typing import Sequence

import numpy as np

from ..llama.kv_cache import KVCache, cache_type, kv_cache_bytes
from ..llama.kv_cache_iswa import swa_cache_size
from .html import HTML, table

SEQ_COLORS = ["#4c72b0", "#dd8452", "#55a868", "#c44e52", "#8172b3", "#937860", "#da8bc3", "#8c8c8c"]
EMPTY = "#f4f4f4"


def _plt():
    import matplotlib
    import matplotlib.pyplot as plt
    return matplotlib, plt


def _fill_cell(ax, x, y, w, h, seqs: list[int]) -> None:
    """A cell as a box, striped with the colours of the sequences that see it."""
    from matplotlib.patches import Rectangle
    if not seqs:
        ax.add_patch(Rectangle((x, y), w, h, facecolor=EMPTY, edgecolor="#999", lw=0.8))
        return
    for k, s in enumerate(seqs):
        ax.add_patch(Rectangle((x + k * w / len(seqs), y), w / len(seqs), h,
                               facecolor=SEQ_COLORS[s % len(SEQ_COLORS)], edgecolor="none", alpha=0.85))
    ax.add_patch(Rectangle((x, y), w, h, facecolor="none", edgecolor="#333", lw=0.8))


def plot_cells(cache: KVCache, ax=None, title: str | None = None, per_row: int = 32, n_cells: int | None = None,
               slot=None):
    """The cells of a cache as a strip of boxes: colour = sequence(s), number = position, red mark = head.

    ``slot``: a :class:`~llmlab.llama.kv_cache.Slot` whose cells get a thick outline.
    """
    _, plt = _plt()
    n = cache.size if n_cells is None else min(n_cells, cache.size)
    rows = -(-n // per_row)
    if ax is None:
        fig, ax = plt.subplots(figsize=(min(per_row, n) * 0.42 + 0.6, rows * 0.62 + 0.7))
    marked = set() if slot is None else set(int(i) for i in slot.idxs)
    for i in range(n):
        x, y = i % per_row, -(i // per_row)
        seqs = sorted(cache.seq_ids(i))
        _fill_cell(ax, x, y, 0.92, 0.8, seqs)
        if cache.pos[i] >= 0:
            ax.text(x + 0.46, y + 0.4, str(int(cache.pos[i])), ha="center", va="center", fontsize=7,
                    color="white" if seqs else "black")
        if i in marked:
            from matplotlib.patches import Rectangle
            ax.add_patch(Rectangle((x - 0.04, y - 0.04), 1.0, 0.88, facecolor="none", edgecolor="black", lw=2.2))
    if cache.head < n:
        h = cache.head
        ax.plot([h % per_row + 0.46], [-(h // per_row) - 0.12], marker="^", color="red", ms=7, clip_on=False)
    ax.set_xlim(-0.2, min(per_row, n) + 0.1)
    ax.set_ylim(-(rows - 1) - 0.3, 0.95)
    ax.set_aspect("equal")
    ax.axis("off")
    seqs = sorted({s for i in range(n) for s in cache.seq_ids(i)})
    legend = "  ".join(f"seq {s}" for s in seqs)
    ax.set_title((title + "   " if title else "") + f"used {cache.used}/{cache.size}, head {cache.head}"
                 + (f"   [{legend}]" if legend else ""), fontsize=9, loc="left")
    return ax.figure


def plot_history(states: Sequence[tuple[str, KVCache]], per_row: int = 32, n_cells: int | None = None):
    """One strip per state: ``[(label, cache.snapshot()), ...]`` as the cache evolves."""
    _, plt = _plt()
    n = states[0][1].size if n_cells is None else n_cells
    rows = -(-min(n, states[0][1].size) // per_row)
    fig, axes = plt.subplots(len(states), 1, figsize=(min(per_row, n) * 0.42 + 0.6, len(states) * (rows * 0.62 + 0.55)))
    axes = np.atleast_1d(axes)
    for ax, (label, c) in zip(axes, states):
        plot_cells(c, ax=ax, title=label, per_row=per_row, n_cells=n_cells)
    fig.tight_layout()
    return fig


def find_slot_steps(cache: KVCache, ubatch, cont: bool = False):
    """The cells ``find_slot`` tests, in order, as ``[(cell, usable), ...]``, and the slot it returns."""
    trace: list = []
    slot = cache.find_slot(ubatch, cont=cont, trace=trace)
    return trace, slot


def plot_ring(cache: KVCache, trace=None, step: int | None = None, ax=None, title: str | None = None):
    """The cells on a ring, as ``find_slot`` walks them from ``head`` and wraps around.

    ``trace`` (from :func:`find_slot_steps`) up to ``step`` tests is drawn:
    green ring = taken for the micro-batch, red = occupied and skipped; the
    arrow is where the search stands (the head before the search).
    """
    _, plt = _plt()
    n = cache.size
    if ax is None:
        fig, ax = plt.subplots(figsize=(6.4, 6.4))
    fs = max(6.0, 1.4 * ax.get_position().width * ax.figure.get_figwidth())   # labels grow with the drawing
    ang = np.pi / 2 - 2 * np.pi * np.arange(n) / n       # cell 0 at the top, clockwise
    r = 1.0
    w = min(0.5, 2.6 / n ** 0.85)
    shown = trace[: len(trace) if step is None else step] if trace else []
    tested = {c: ok for c, ok in shown}
    for i in range(n):
        x, y = r * np.cos(ang[i]), r * np.sin(ang[i])
        seqs = sorted(cache.seq_ids(i))
        _fill_cell(ax, x - w / 2, y - w / 2, w, w, seqs)
        if cache.pos[i] >= 0:
            ax.text(x, y, str(int(cache.pos[i])), ha="center", va="center", fontsize=fs, color="white")
        ax.text(1.22 * np.cos(ang[i]), 1.22 * np.sin(ang[i]), str(i), ha="center", va="center", fontsize=fs, color="#666")
        if i in tested:
            circ = plt.Circle((x, y), w * 0.78, fill=False, lw=2, color="#2a9d2a" if tested[i] else "#d62728")
            ax.add_patch(circ)
    cur = shown[-1][0] + 1 if shown else cache.head
    a = np.pi / 2 - 2 * np.pi * (cur % n) / n
    ax.annotate("", xy=(0.72 * np.cos(a), 0.72 * np.sin(a)), xytext=(0, 0),
                arrowprops=dict(arrowstyle="->", color="red", lw=2))
    taken = sum(ok for _, ok in shown)
    ax.set_title(title or f"{len(shown)} cells tested, {taken} taken", fontsize=fs + 2)
    ax.set_xlim(-1.4, 1.4)
    ax.set_ylim(-1.4, 1.4)
    ax.set_aspect("equal")
    ax.axis("off")
    return ax.figure


def plot_find_slot(cache: KVCache, ubatch, n_frames: int = 4, cont: bool = False):
    """``find_slot`` as a row of frames: the ring before, during and after the search."""
    _, plt = _plt()
    trace, slot = find_slot_steps(cache, ubatch, cont)
    steps = sorted({int(round(x)) for x in np.linspace(0, len(trace), n_frames)})
    fig, axes = plt.subplots(1, len(steps), figsize=(3.3 * len(steps), 3.5))
    for ax, s in zip(np.atleast_1d(axes), steps):
        plot_ring(cache, trace, s, ax=ax, title=f"step {s}/{len(trace)}")
    fig.suptitle(f"find_slot for {ubatch.n_tokens} tokens from head {cache.head}: "
                 + (f"cells {slot.idxs.tolist()}" if slot is not None else "no room"), fontsize=10)
    fig.tight_layout()
    return fig


def plot_kq_mask(mask: np.ndarray, ax=None, title: str = "KQ mask", token_pos=None, cell_pos=None):
    """The mask as an image: dark = visible (0), light = masked (-inf); rows are tokens, columns cells."""
    _, plt = _plt()
    if ax is None:
        fig, ax = plt.subplots(figsize=(min(10, 0.25 * mask.shape[1] + 1.5), min(6, 0.25 * mask.shape[0] + 1.2)))
    ax.imshow(np.isfinite(mask), cmap="Greys", vmin=0, vmax=1.4, aspect="auto", interpolation="nearest")
    ax.set_xlabel("KV cell" + ("" if cell_pos is None else " (position)"))
    ax.set_ylabel("token" + ("" if token_pos is None else " (position)"))
    if token_pos is not None:
        ax.set_yticks(range(len(token_pos)), [str(p) for p in token_pos], fontsize=7)
    if cell_pos is not None:
        ax.set_xticks(range(len(cell_pos)), [str(p) if p >= 0 else "." for p in cell_pos], fontsize=6)
    ax.set_title(title, fontsize=10)
    return ax.figure


# ---------------------------------------------------------------------------------------------- memory tables
def human_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.2f} {unit}" if unit != "B" else f"{int(n)} B"
        n /= 1024


def kv_size_rows(models: Sequence[dict], n_ctx_list: Sequence[int], types: Sequence[str] = ("f16",)) -> list[dict]:
    """The KV-cache size formula for each (model, n_ctx, type).

    ``models``: dicts with ``name``, ``n_layer``, ``n_embd_gqa`` (and
    optionally ``n_layer_swa``, ``n_swa`` for models with sliding-window
    layers, whose cache holds the window plus one micro-batch).
    """
    rows = []
    for m in models:
        for n_ctx in n_ctx_list:
            for t in types:
                n_swa_layers = m.get("n_layer_swa", 0)
                full = kv_cache_bytes(n_ctx, m["n_layer"] - n_swa_layers, m["n_embd_gqa"], type_k=t)
                swa = 0
                if n_swa_layers:
                    swa = kv_cache_bytes(swa_cache_size(n_ctx, m["n_swa"], m.get("n_ubatch", 512)), n_swa_layers,
                                         m["n_embd_gqa"], type_k=t)
                rows.append(dict(model=m["name"], n_ctx=n_ctx, n_layer=m["n_layer"], n_embd_gqa=m["n_embd_gqa"],
                                 type=t, bytes_per_value=cache_type(t).type_size / cache_type(t).block_size,
                                 bytes=full + swa))
    return rows


def kv_size_table(rows: list[dict]) -> HTML:
    """:func:`kv_size_rows` as a table: the formula written out and its value (GiB and GB)."""
    out = []
    for r in rows:
        formula = f"{r['n_ctx']}×{r['n_layer']}×2×{r['n_embd_gqa']}×{r['bytes_per_value']:g}"
        out.append([r["model"], r["n_ctx"], r["n_layer"], r["n_embd_gqa"], r["type"], formula,
                    human_bytes(r["bytes"]), f"{r['bytes'] / 1e9:.3f} GB"])
    return table(["model", "n_ctx", "n_layer", "n_embd_gqa", "type", "n_ctx×n_layer×2×n_embd_gqa×sizeof", "size",
                  "size (10^9)"], out)


def model_kv_shape(path: str | Path) -> dict:
    """``name``, ``n_layer``, ``n_embd_gqa`` (and the sliding-window layout) of a GGUF model, for :func:`kv_size_rows`."""
    from ..ggml.gguf import GGUFFile
    from ..llama.model import load_hparams
    kv = GGUFFile(path).kv
    hp = load_hparams(kv)               # the architecture's own rules: which layers slide, and how far
    d = dict(name=kv.get("general.name", Path(path).stem), n_layer=hp.n_layer, n_embd_gqa=hp.n_embd_k_gqa)
    n_layer_swa = sum(hp.is_swa(il) for il in range(hp.n_layer))
    if n_layer_swa:
        d.update(n_layer_swa=n_layer_swa, n_swa=hp.n_swa)
    return d


def ubatch_attention_rows(n_tokens: int, n_ubatch: int, n_kv: int, head_dim: int = 128, bytes_per: int = 4) -> list[dict]:
    """Per micro-batch: Q [n_q, d], K [n_kv, d] and the score matrix [n_q, n_kv] of one head, and its bytes.

    Splitting the batch shrinks Q and the score matrix, never K: the peak
    memory of attention scales with ``n_ubatch``, not with the batch.
    """
    rows = [dict(case=f"no split (n_batch={n_tokens})", q=(n_tokens, head_dim), k=(n_kv, head_dim),
                 kq=(n_tokens, n_kv), bytes=n_tokens * n_kv * bytes_per)]
    for i, s in enumerate(range(0, n_tokens, n_ubatch)):
        n_q = min(n_ubatch, n_tokens - s)
        rows.append(dict(case=f"ubatch[{i}]", q=(n_q, head_dim), k=(n_kv, head_dim), kq=(n_q, n_kv),
                         bytes=n_q * n_kv * bytes_per))
    return rows


def ubatch_attention_table(rows: list[dict]) -> HTML:
    return table(["case", "Q", "K", "QK^T", "bytes (f32)"],
                 [[r["case"], list(r["q"]), list(r["k"]), list(r["kq"]), human_bytes(r["bytes"])] for r in rows])
