"""Pictures of attention (notebook 03): token labels, the step-by-step matrices, per-head heatmaps,
where one token attends, the N x N matrix and flash attention's tiles, and a layer/head widget.

Every function takes plain arrays (or an :class:`llmlab.attention.AttentionTrace`) and returns a
matplotlib figure or an HTML table; the widget only wires :func:`plot_head` to two sliders.
"""
from __future__ import annotations

from typing import Mapping, Sequence

import numpy as np

from .html import HTML, table


# ---- labels -------------------------------------------------------------------------------------------------

def token_texts(tok, ids: Sequence[int]) -> list[str]:
    """The text each token completes. A byte-level BPE splits a CJK character over several tokens: the
    token that supplies its last byte gets the character, the ones before it get ''."""
    out, buf = [], b""
    for i in ids:
        buf += tok.token_to_piece(int(i))
        text, n = "", len(buf)
        while n > 0:                     # the longest prefix that decodes; the rest waits for more bytes
            try:
                text = buf[:n].decode("utf-8")
                break
            except UnicodeDecodeError:
                n -= 1
        out.append(text)
        buf = buf[n:]
    return out


def find_token(texts: Sequence[str], s: str, start: int = 0) -> int:
    """Index of the first token (from ``start``) whose text contains ``s``."""
    for i in range(start, len(texts)):
        if s in texts[i]:
            return i
    raise ValueError(f"no token contains {s!r}")


def plot_labels(texts: Sequence[str], romanize: Mapping[str, str] | None = None) -> list[str]:
    """Tick labels a font without CJK glyphs can draw: characters through ``romanize`` (e.g. pinyin),
    '·' for a token that completes nothing (a leading byte), '␣' for a bare space, position numbers in front."""
    out = []
    for i, t in enumerate(texts):
        if romanize:
            t = "".join(romanize.get(c, c) for c in t)
        t = t.replace("\n", "\\n")
        out.append(f"{i}:{t if t.strip() else ('·' if not t else t.replace(' ', '␣'))}")
    return out


# ---- step by step -------------------------------------------------------------------------------------------

def _heat(ax, m, title, xl=None, yl=None, cmap="viridis", fs=6, **kw):
    m = np.asarray(m, np.float64)
    shown = np.where(np.isfinite(m), m, np.nan)
    im = ax.imshow(shown, cmap=cmap, aspect="auto", interpolation="nearest", **kw)
    ax.set_title(title, fontsize=8)
    for setter, lab, n in ((ax.set_xticks, xl, m.shape[1]), (ax.set_yticks, yl, m.shape[0])):
        if lab is not None and len(lab) == n:
            setter(range(n))
        else:
            setter([])
    if xl is not None and len(xl) == m.shape[1]:
        ax.set_xticklabels(xl, rotation=90, fontsize=fs)
    if yl is not None and len(yl) == m.shape[0]:
        ax.set_yticklabels(yl, fontsize=fs)
    return im


def plot_steps(L, labels: Sequence[str], head: int = 0):
    """One head of one layer, the way the formula reads: Q, K, S = QK^T, S*scale + mask, P = softmax, V, O = PV.
    ``L`` is a :class:`llmlab.attention.probe.LayerAttention`; the cells past the tokens are cut off."""
    import matplotlib.pyplot as plt
    from ..attention import repeat_kv
    n = L.q.shape[1]
    n_head = L.q.shape[0]
    k = repeat_kv(L.k, n_head)[head, :n]
    v = repeat_kv(L.v, n_head)[head, :n]
    s = L.kq[head, :, :n]
    masked = s * L.scale + L.mask[:, :n]
    p = L.probs[head, :, :n]
    o = L.kqv_out[:, head * v.shape[1]:(head + 1) * v.shape[1]]
    d = L.q.shape[2]
    panels = [(L.q[head], f"Q  [{n} x {d}]", "RdBu_r"), (k, f"K  [{n} x {d}]", "RdBu_r"),
              (s, f"S = Q K^T  [{n} x {n}]", "RdBu_r"), (masked, f"S*{L.scale:.3g} + mask", "RdBu_r"),
              (p, f"P = softmax  [{n} x {n}]", "viridis"), (v, f"V  [{n} x {v.shape[1]}]", "RdBu_r"),
              (o, f"O = P V  [{n} x {v.shape[1]}]", "RdBu_r")]
    fig, axes = plt.subplots(1, len(panels), figsize=(17, 3.6),
                             gridspec_kw={"width_ratios": [1.1, 1.1, 1, 1, 1, 1.1, 1.1]})
    for ax, (m, title, cmap) in zip(axes, panels):
        lim = np.nanmax(np.abs(np.where(np.isfinite(m), m, np.nan)))
        kw = {"vmin": -lim, "vmax": lim} if cmap == "RdBu_r" else {"vmin": 0, "vmax": 1}
        _heat(ax, m, title, labels if m.shape[1] == n else None, labels if ax is axes[0] else None, cmap, **kw)
    fig.suptitle(f"layer {L.layer}, head {head}: one attention, step by step (grey = -inf, masked)", fontsize=10)
    fig.tight_layout()
    return fig


# ---- heads ------------------------------------------------------------------------------------------------

def plot_head(probs: np.ndarray, labels: Sequence[str], head: int = 0, query: int | None = None,
              title: str = "", ax=None):
    """One head's (n_q x n_kv) probabilities with token labels; ``query`` outlines one row."""
    import matplotlib.pyplot as plt
    if ax is None:
        fig, ax = plt.subplots(figsize=(6.4, 5.6))
    p = probs[head]
    im = _heat(ax, p, title or f"head {head}", labels[:p.shape[1]], labels[:p.shape[0]], "viridis", fs=7,
               vmin=0, vmax=1)
    if query is not None:
        ax.add_patch(plt.Rectangle((-0.5, query - 0.5), p.shape[1], 1, fill=False, ec="red", lw=1.5))
    ax.set_xlabel("key (attended)", fontsize=8)
    ax.set_ylabel("query", fontsize=8)
    ax.figure.colorbar(im, ax=ax, fraction=0.04)
    return ax.figure


def plot_heads(probs: np.ndarray, labels: Sequence[str] | None = None, query: int | None = None,
               title: str = "", ncols: int = 5):
    """Every head's probability matrix, small multiples (labels only on the first)."""
    import matplotlib.pyplot as plt
    h = probs.shape[0]
    nrows = -(-h // ncols)
    fig, axes = plt.subplots(nrows, ncols, figsize=(2.6 * ncols, 2.6 * nrows), squeeze=False)
    for i, ax in enumerate(axes.flat):
        if i >= h:
            ax.axis("off")
            continue
        _heat(ax, probs[i], f"head {i}", None, None, "viridis", vmin=0, vmax=1)
        if query is not None:
            ax.axhline(query, color="red", lw=0.6)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    return fig


def plot_query(probs: np.ndarray, labels: Sequence[str], query: int, heads: Sequence[int] | None = None,
               title: str = ""):
    """Where one query token attends, one bar chart per head (only the keys it can see)."""
    import matplotlib.pyplot as plt
    heads = list(range(probs.shape[0])) if heads is None else list(heads)
    n = query + 1
    ncols = min(3, len(heads))
    nrows = -(-len(heads) // ncols)
    fig, axes = plt.subplots(nrows, ncols, figsize=(5.2 * ncols, 2.1 * nrows), squeeze=False, sharey=True)
    for ax, h in zip(axes.flat, heads):
        row = probs[h, query, :n]
        best = int(np.argmax(row))
        ax.bar(range(n), row, color=["crimson" if i == best else "steelblue" for i in range(n)])
        ax.set_xticks(range(n))
        ax.set_xticklabels(labels[:n], rotation=90, fontsize=6)
        ax.set_title(f"head {h}: max {row[best]:.2f} on {labels[best]}", fontsize=8)
    for ax in list(axes.flat)[len(heads):]:
        ax.axis("off")
    fig.suptitle(title or f"where {labels[query]} attends", fontsize=10)
    fig.tight_layout()
    return fig


def top_attended(probs: np.ndarray, texts: Sequence[str], query: int, k: int = 3) -> HTML:
    """Per head: the ``k`` keys the query gives most weight, with the weights (a table)."""
    rows = []
    for h in range(probs.shape[0]):
        row = probs[h, query, :query + 1]
        top = np.argsort(-row, kind="stable")[:k]
        rows.append([h] + [f"{i}:{texts[i] or '·'} {row[i]:.2f}" for i in top])
    return table(["head"] + [f"#{j + 1}" for j in range(k)], rows)


def heads_widget(trace, labels: Sequence[str], layer: int = 0, head: int = 0, query: int | None = None):
    """Sliders for layer and head over a traced decode, redrawing :func:`plot_head`."""
    import ipywidgets as W
    import matplotlib.pyplot as plt
    from IPython.display import display
    layers = sorted(trace.layers)
    out = W.Output()
    lw = W.SelectionSlider(options=layers, value=layer, description="layer")
    hw = W.IntSlider(value=head, min=0, max=trace.n_head - 1, description="head")

    def draw(*_):
        with out:
            out.clear_output(wait=True)
            fig = plot_head(trace.probs(lw.value), labels, hw.value, query, f"layer {lw.value}, head {hw.value}")
            display(fig)
            plt.close(fig)

    lw.observe(draw, "value")
    hw.observe(draw, "value")
    draw()
    return W.VBox([W.HBox([lw, hw]), out])


# ---- N x N and tiles ----------------------------------------------------------------------------------------

def plot_nn_memory(ns: Sequence[int], n_head: int, block: int = 64, bytes_per: int = 4, ax=None, title: str = ""):
    """Bytes of the full (n_head x N x N) score matrix vs one block x block tile per head, over N (log-log)."""
    import matplotlib.pyplot as plt
    if ax is None:
        fig, ax = plt.subplots(figsize=(6, 3.4))
    ns = np.asarray(ns, np.float64)
    ax.loglog(ns, n_head * ns * ns * bytes_per / 2**20, marker="o", label=f"naive: {n_head} x N x N scores")
    ax.loglog(ns, np.full_like(ns, n_head * block * block * bytes_per / 2**20), ls="--",
              label=f"flash: {n_head} x {block} x {block} tile")
    ax.set_xlabel("sequence length N")
    ax.set_ylabel("MiB per layer")
    ax.legend(fontsize=8)
    ax.set_title(title or "the attention matrix grows as N², a tile does not", fontsize=10)
    return ax.figure


def plot_tiles(mask: np.ndarray, block_q: int, block_k: int, ax=None, title: str = ""):
    """The N x N score matrix cut into tiles: which are computed, which a causal mask lets flash skip."""
    import matplotlib.pyplot as plt
    from matplotlib.patches import Rectangle
    if ax is None:
        fig, ax = plt.subplots(figsize=(4.2, 4.2))
    n_q, n_kv = mask.shape
    ax.imshow(np.isfinite(mask), cmap="Greys", vmin=-0.3, vmax=1.6, interpolation="nearest")
    done = skipped = 0
    for q0 in range(0, n_q, block_q):
        for k0 in range(0, n_kv, block_k):
            live = np.isfinite(mask[q0:q0 + block_q, k0:k0 + block_k]).any()
            done, skipped = done + live, skipped + (not live)
            ax.add_patch(Rectangle((k0 - 0.5, q0 - 0.5), min(block_k, n_kv - k0), min(block_q, n_q - q0),
                                   fill=live, alpha=0.25 if live else 1, fc="tab:orange", ec="black", lw=0.8,
                                   ls="-" if live else ":"))
    counts = f"{done} tiles computed, {skipped} skipped ({block_q}x{block_k})"
    ax.set_title(f"{title}\n{counts}" if title else counts, fontsize=9)
    ax.set_xlabel("key")
    ax.set_ylabel("query")
    return ax.figure


def plot_running_max(stats, title: str = "", ax=None):
    """Flash attention's running max of the first query row of each query tile, key tile after key tile."""
    import matplotlib.pyplot as plt
    if ax is None:
        fig, ax = plt.subplots(figsize=(5.5, 3))
    by_q: dict[int, list] = {}
    for qt, kt, m in stats.history:
        by_q.setdefault(qt, []).append((kt, m))
    for qt, pts in sorted(by_q.items()):
        xs, ys = zip(*pts)
        ax.step(xs, ys, where="post", marker="o", ms=3, label=f"query tile {qt}")
    ax.set_xlabel("key tile")
    ax.set_ylabel("running max m")
    ax.legend(fontsize=7)
    ax.set_title(title or "the running max only grows; each growth rescales what was summed", fontsize=9)
    return ax.figure


def kv_table_html(rows: list[dict]) -> HTML:
    """The rows of :func:`llmlab.attention.kv_table` as a table."""
    header = list(rows[0]) if rows else []
    return table(header, [[r[h] for h in header] for r in rows])
