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


def describe_label(label: str) -> str:
    """A plot label ``"i:text"`` in words for a legend: ``"0:·"`` (a token holding only the leading bytes of
    a character) becomes "token 0 (leading bytes of the next character)"."""
    i, _, text = label.partition(":")
    return f"token {i} (leading bytes of the next character)" if text == "·" else f"token {i}: {text}"


# ---- step by step -------------------------------------------------------------------------------------------

LABEL_PT = 9        # token tick labels: readable at the notebooks' 80 dpi, figures at most ~11 inches wide


def _ticks(n: int, max_labels: int | None, keep: Sequence[int] = ()) -> list[int]:
    """Tick positions: all of 0..n-1, or every k-th when there are more than ``max_labels`` (plus ``keep``)."""
    if not max_labels or n <= max_labels:
        return list(range(n))
    k = -(-n // max_labels)
    kept = {i for i in keep if 0 <= i < n}
    # a kept tick (the query's row) pushes away the regular ticks that would overlap its label
    return sorted({i for i in range(0, n, k) if all(abs(i - j) >= k for j in kept)} | kept)


MASKED = "#b0b0b0"   # the colour of a masked (-inf) score in every heatmap


def _heat(ax, m, title, xl=None, yl=None, cmap="viridis", fs=LABEL_PT, max_labels=None, keep=(), **kw):
    """A heatmap with token labels; -inf (masked) cells are drawn grey, not left blank."""
    import matplotlib
    m = np.asarray(m, np.float64)
    shown = np.where(np.isfinite(m), m, np.nan)
    cm = matplotlib.colormaps[cmap].with_extremes(bad=MASKED)
    im = ax.imshow(shown, cmap=cm, aspect="auto", interpolation="nearest", **kw)
    ax.set_title(title, fontsize=10)
    for axis, lab, n in ((ax.xaxis, xl, m.shape[1]), (ax.yaxis, yl, m.shape[0])):
        if lab is not None and len(lab) == n:
            t = _ticks(n, max_labels, keep)
            axis.set_ticks(t)
            axis.set_ticklabels([lab[i] for i in t], fontsize=fs, rotation=90 if axis is ax.xaxis else 0)
        else:
            axis.set_ticks([])
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
    fig, axes = plt.subplots(2, 4, figsize=(11, 7.8))          # two rows: readable labels at notebook width
    order = [0, 1, 2, 3, 4, 5, 6]
    for i, ax in enumerate(axes.flat):
        if i >= len(order):
            ax.axis("off")
            continue
        m, title, cmap = panels[order[i]]
        lim = np.nanmax(np.abs(np.where(np.isfinite(m), m, np.nan)))
        kw = {"vmin": -lim, "vmax": lim} if cmap == "RdBu_r" else {"vmin": 0, "vmax": 1}
        im = _heat(ax, m, title, labels if m.shape[1] == n else None, labels if i % 4 == 0 else None, cmap,
                   fs=8, max_labels=16, **kw)
        fig.colorbar(im, ax=ax, fraction=0.046, pad=0.03)
    fig.suptitle(f"layer {L.layer}, head {head}: one attention, step by step (grey = -inf, masked)", fontsize=11)
    fig.tight_layout()
    return fig


# ---- heads ------------------------------------------------------------------------------------------------

def plot_head(probs: np.ndarray, labels: Sequence[str], head: int = 0, query: int | None = None,
              title: str = "", ax=None):
    """One head's (n_q x n_kv) probabilities with token labels; ``query`` outlines one row."""
    import matplotlib.pyplot as plt
    if ax is None:
        fig, ax = plt.subplots(figsize=(9, 8))
    p = probs[head]
    keep = () if query is None else (query,)
    im = _heat(ax, p, title or f"head {head}", labels[:p.shape[1]], labels[:p.shape[0]], "viridis",
               max_labels=40, keep=keep, vmin=0, vmax=1)
    if query is not None:
        ax.add_patch(plt.Rectangle((-0.5, query - 0.5), p.shape[1], 1, fill=False, ec="red", lw=1.5))
    ax.set_xlabel("key (attended)", fontsize=10)
    ax.set_ylabel("query", fontsize=10)
    ax.figure.colorbar(im, ax=ax, fraction=0.04)
    return ax.figure


def plot_heads(probs: np.ndarray, labels: Sequence[str] | None = None, query: int | None = None,
               title: str = "", ncols: int = 5):
    """Every head's probability matrix, small multiples (labels only on the first)."""
    import matplotlib.pyplot as plt
    h = probs.shape[0]
    nrows = -(-h // ncols)
    fig, axes = plt.subplots(nrows, ncols, figsize=(11, 2.3 * nrows), squeeze=False)
    for i, ax in enumerate(axes.flat):
        if i >= h:
            ax.axis("off")
            continue
        im = _heat(ax, probs[i], f"head {i}", None, None, "viridis", vmin=0, vmax=1)
        if query is not None:
            ax.axhline(query, color="red", lw=0.8)
    fig.suptitle(title, fontsize=11)
    fig.tight_layout()
    fig.colorbar(im, ax=axes, fraction=0.02, pad=0.01, label="probability")
    return fig


def plot_query(probs: np.ndarray, labels: Sequence[str], query: int, heads: Sequence[int] | None = None,
               title: str = ""):
    """Where one query token attends: one row per head, one column per key it can see, the weight as
    colour and, where it is at least 0.1, as a number; each head's largest weight is outlined."""
    import matplotlib.pyplot as plt
    heads = list(range(probs.shape[0])) if heads is None else list(heads)
    n = query + 1
    m = np.stack([probs[h, query, :n] for h in heads])
    fig, ax = plt.subplots(figsize=(11, 1.2 + 0.42 * len(heads) + 0.09 * max(len(x) for x in labels[:n])))
    im = _heat(ax, m, "", labels[:n], [f"head {h}" for h in heads], "Blues", vmin=0, vmax=1)
    fig.colorbar(im, ax=ax, fraction=0.03, pad=0.01, label="probability")
    for r in range(len(heads)):
        best = int(np.argmax(m[r]))
        ax.add_patch(plt.Rectangle((best - 0.5, r - 0.5), 1, 1, fill=False, ec="crimson", lw=1.8))
        for c in np.flatnonzero(m[r] >= 0.1):
            ax.text(c, r, f"{m[r, c]:.1f}", ha="center", va="center", fontsize=7,
                    color="white" if m[r, c] > 0.6 else "black")
    ax.set_title(title or f"where {labels[query]} attends", fontsize=11)
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
    """Sliders for layer and head over a traced decode, redrawing :func:`plot_head`: one
    :func:`llmlab.viz.live` view (live in JupyterLab, its first picture elsewhere). Not displayed:
    show it with ``display(...)`` or as a cell's last value; ``.box.children[0]`` holds the sliders."""
    import ipywidgets as W
    from .live import live
    layers = sorted(trace.layers)
    controls = {"layer": W.SelectionSlider(options=layers, value=layer, description="layer"),
                "head": W.IntSlider(value=head, min=0, max=trace.n_head - 1, description="head")}

    def render(layer, head):
        where = "" if query is None else f": red = the row of {labels[query]}"
        return plot_head(trace.probs(layer), labels, head, query, f"layer {layer}, head {head}{where}")
    view = live(render, controls, columns=2, show=False)
    view.children = view.box.children           # the test's and old callers' VBox-like access
    return view


# ---- N x N and tiles ----------------------------------------------------------------------------------------

def plot_nn_memory(ns: Sequence[int], n_head: int, block: int = 64, bytes_per: int = 4, ax=None, title: str = "",
                   ubatch: int | None = None):
    """Bytes of the full (n_head x N x N) score matrix vs one block x block tile per head, over N (log-log);
    with ``ubatch``, llama.cpp's ``kq`` without flash attention: n_head x min(N, n_ubatch) x N."""
    import matplotlib.pyplot as plt
    if ax is None:
        fig, ax = plt.subplots(figsize=(6, 3.4))
    ns = np.asarray(ns, np.float64)
    ax.loglog(ns, n_head * ns * ns * bytes_per / 2**20, marker="o", label=f"all at once: {n_head} x N x N")
    if ubatch:
        ax.loglog(ns, n_head * np.minimum(ns, ubatch) * ns * bytes_per / 2**20, marker="s",
                  label=f"llama.cpp's kq: {n_head} x {ubatch} x N")
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


# ---- which head finds the nouns ------------------------------------------------------------------------------

NOUNS = {"zh": "苹果公司手机", "en": ("Apple", "phone")}


def noun_candidates(texts: Sequence[str], query: int, lang: str) -> list[int]:
    """Tokens before ``query`` that belong to the sentence's nouns (苹果/公司/手机, or Apple/phone)."""
    def is_noun(t: str) -> bool:
        return any(c in t for c in NOUNS["zh"]) if lang == "zh" else t.strip() in NOUNS["en"]
    return [i for i, t in enumerate(texts) if i < query and t.strip() and is_noun(t)]


def noun_heads(traces: Mapping, texts: Mapping, queries: Mapping, k: int = 3):
    """For every traced (model, sentence): the (layer, head) whose query row puts most weight on the
    nouns before it, that weight and the ``k`` keys it weighs most. Returns ``(table, best)`` with
    ``best[(model, lang)] = (layer, head)``."""
    rows, best = [], {}
    for key, trc in traces.items():
        name, lang = key
        tx, qq = texts[key], queries[key]
        w, il, h = trc.rank_heads(qq, noun_candidates(tx, qq, lang))[0]
        p = trc.probs(il)[h, qq, :qq + 1]
        top = np.argsort(-p, kind="stable")[:k]
        rows.append([name, lang, f"{qq}: {tx[qq]!r}", il, h, f"{w:.2f}",
                     ", ".join(f"{tx[i] or '·'!r} {p[i]:.2f}" for i in top)])
        best[key] = (il, h)
    return table(["model", "sentence", "query", "layer", "head", "weight on the nouns", "top keys"], rows), best
