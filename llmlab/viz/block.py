"""Pictures of the transformer block around attention (notebook 03): the block as a diagram, what RMSNorm
does to a row, RoPE's pairs, frequencies and relative-position property, the FFN's gate on one token, and
the residual stream through the layers. Every function takes a :class:`llmlab.block.BlockTrace` (or plain
arrays) and returns a matplotlib figure or HTML; the numbers come from :mod:`llmlab.block`.
"""
from __future__ import annotations

import numpy as np

from .. import block as B

_FILL = {"norm": "#fde2a7", "attn": "#e8f1f8", "ffn": "#d5f0c8", "add": "#f4d4d4"}


def block_steps(arch: str) -> tuple[tuple[str, str, str], ...]:
    """One layer of ``arch`` as its spec draws it: ``(node, label, kind)`` in graph order (``ArchSpec.block_steps``)."""
    from ..llama.arch import get_arch
    steps = get_arch(arch).block_steps
    if not steps:
        raise ValueError(f"architecture {arch!r} has no block_steps in its spec: nothing to draw")
    return steps


def block_dot(arch: str) -> str:
    """Graphviz source of one layer, left to right in two rows that fit a projector: the attention branch on
    the first, the FFN branch on the second; each ⊕ adds a branch back into the stream (dashed: the stream
    as it was before the branch)."""
    steps = list(block_steps(arch))
    split = next(i for i, (_, _, kind) in enumerate(steps) if kind == "add") + 1     # after the first addition
    rows = [[("x", "stream x\n(layer input)", None)] + steps[:split], steps[split:] + [("out", "next layer", None)]]
    lines = ['digraph block {', 'rankdir=LR; bgcolor="transparent"; nodesep=0.35; ranksep=0.3; newrank=true;',
             'node [shape=box, style="rounded,filled", fontname="Helvetica", fontsize=13, color="#555577"];',
             'edge [color="#555555", fontname="Helvetica", fontsize=11];']
    for name, label, kind in rows[0] + rows[1]:
        fill = _FILL[kind] if kind else "#ffffff"
        lines.append(f'{name} [label="{label}", fillcolor="{fill}"];'.replace("\n", "\\n"))
    for row in rows:                    # each row a chain, left to right
        lines.append(" -> ".join(n for n, _, _ in row) + ";")
    # the second row starts under the first: column by column, the same rank
    for (a, _, _), (b, _, _) in zip(rows[0][1:], rows[1]):
        lines.append(f"{{rank=same; {a}; {b};}}")
    lines.append(f"{rows[0][-1][0]} -> {rows[1][0][0]} [constraint=false];")      # the stream goes on below
    last_add = "x"
    for name, _, kind in steps:
        if kind == "add":
            lines.append(f'{last_add} -> {name} [style=dashed, color="#cc4444", label=" residual", constraint=false];')
            last_add = name
    lines.append("}")
    return "\n".join(lines)


def block_graph(arch: str):
    """:func:`block_dot` drawn as inline SVG."""
    from .overview import dot_html
    return dot_html(block_dot(arch))


# ---- RMSNorm ------------------------------------------------------------------------------------------------

def plot_rms_norm(tr, layer: int, token: int, label: str = "", show_gemma=None):
    """One token's row through RMSNorm: the input x, x / rms(x), the learned weight w, and the output. With
    ``show_gemma`` (a second trace), a fifth panel with both models' stored weights of the same norm."""
    import matplotlib.pyplot as plt
    L = tr[layer]
    x, n, w, y = L.x[token], L.normed[token], L.norm_w, L.attn_norm[token]
    rms = float(np.sqrt((x.astype(np.float64) ** 2).mean()))
    panels = [(x, f"x: the stream's row (RMS {rms:.3g}, mean {x.mean():+.3g})"),
              (n, f"x / sqrt(mean(x²) + eps): RMS 1, mean {n.mean():+.3g} (not 0)"),
              (w, f"w: the learned weight attn_norm.weight (mean {w.mean():+.3g})"),
              (y, "x / rms(x) * w: what the Q, K, V projections read")]
    fig, axes = plt.subplots(len(panels), 1, figsize=(11, 1.75 * len(panels) + 0.5), sharex=True)
    for ax, (v, title) in zip(axes, panels):
        ax.plot(v, lw=0.8, color="#335577")
        ax.axhline(0, color="grey", lw=0.6)
        ax.set_title(title, fontsize=11, loc="left")
    axes[1].axhspan(-1, 1, color="tab:orange", alpha=0.15, lw=0)
    axes[-1].set_xlabel(f"channel (0..{len(x) - 1})")
    fig.suptitle(f"RMSNorm of layer {layer}'s input, token {label or token}", fontsize=12)
    fig.tight_layout()
    return fig


def plot_norm_weights(traces: dict, layer: int = 0):
    """Histograms of the stored ``attn_norm.weight`` of each model at ``layer``: SmolLM2 keeps w, Gemma's
    converter stores 1 + w (its RMSNorm multiplies by 1 + w, so llama.cpp's plain multiply needs the shift)."""
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(1, len(traces), figsize=(11, 2.9))
    for ax, (name, tr) in zip(np.atleast_1d(axes), traces.items()):
        w = tr[layer].norm_w
        ax.hist(w, bins=60, color="#557799")
        ax.axvline(0, color="grey", lw=0.8)
        ax.axvline(1, color="tab:red", lw=0.8, ls="--")
        ax.set_title(f"{name}: attn_norm.weight of layer {layer} ({len(w)} values, min {w.min():.2g}, max {w.max():.3g})",
                     fontsize=10)
        ax.set_xlabel("stored weight (dashed: 1)")
    fig.tight_layout()
    return fig


# ---- RoPE ---------------------------------------------------------------------------------------------------

def plot_rope_pairing(n_dims: int = 16):
    """Which dimensions rotate together in NORM (adjacent) and NEOX (i, i + n/2) mode, for a small head."""
    import matplotlib.pyplot as plt
    modes = list(B.ROPE_PAIRING)
    fig, axes = plt.subplots(len(modes), 1, figsize=(11, 2.0 * len(modes) + 0.3))
    cmap = plt.get_cmap("tab20")
    for ax, mode in zip(axes, modes):
        pairs = B.rope_pairs(n_dims, mode)
        for i, (a, b) in enumerate(pairs):
            c = cmap(i % 20)
            for d in (a, b):
                ax.add_patch(plt.Rectangle((d - 0.45, 0), 0.9, 0.8, color=c))
                ax.text(d, 0.4, str(i), ha="center", va="center", fontsize=11)
            t = np.linspace(0, 1, 40)
            ax.plot(a + (b - a) * t, 0.85 + (0.25 + 0.08 * abs(b - a)) * np.sin(np.pi * t), color=c, lw=1.6)
        ax.set_xlim(-0.6, n_dims - 0.4)
        ax.set_ylim(-0.1, 1.15 + 0.08 * n_dims / 2)
        ax.set_xticks(range(n_dims))
        ax.set_yticks([])
        for s in ("top", "right", "left"):
            ax.spines[s].set_visible(False)
        who = "llama, SmolLM2" if mode == "norm" else "GPT-NeoX, qwen2, Gemma 3"
        ax.set_title(f"{mode.upper()} ({who}): the number in a dimension is its pair i, rotated by pos · θ_i",
                     fontsize=11, loc="left")
    axes[-1].set_xlabel(f"dimension of a {n_dims}-wide head")
    fig.tight_layout()
    return fig


def plot_rope_freqs(models: dict):
    """θ_i per pair and the wavelength 2π/θ_i in positions, for each ``name: (n_dims, base)``."""
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(1, 2, figsize=(11, 3.6))
    for name, (n_dims, base) in models.items():
        th = B.rope_freqs(n_dims, base)
        x = np.arange(len(th)) / len(th)
        axes[0].semilogy(x, th, label=f"{name} ({n_dims} dims, base {base:g})")
        axes[1].semilogy(x, 2 * np.pi / th, label=name)
    axes[0].set_title("θ_i = base^(-2i/n): radians per position", fontsize=11)
    axes[1].set_title("wavelength 2π/θ_i: positions per full turn", fontsize=11)
    for ax in axes:
        ax.set_xlabel("pair i / (n/2): fast pairs left, slow pairs right")
        ax.grid(alpha=0.3, which="both")
    axes[0].legend(fontsize=9)
    fig.tight_layout()
    return fig


def plot_rope_relative(q: np.ndarray, k: np.ndarray, mode: str, base: float, n_pos: int = 48, title: str = ""):
    """Left: q·k with q placed at every position m and k at every position n (one real head's vectors):
    constant along each diagonal, i.e. a function of m - n. Right: that function against the distance."""
    import matplotlib.pyplot as plt
    pos = np.arange(n_pos)
    s = B.rope_scores(q, k, pos, pos, mode, base)
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2), gridspec_kw={"width_ratios": [1, 1.4]})
    im = axes[0].imshow(s, cmap="viridis", interpolation="nearest")
    fig.colorbar(im, ax=axes[0], fraction=0.046, label="q·k")
    axes[0].set_xlabel("key position n")
    axes[0].set_ylabel("query position m")
    axes[0].set_title("q·k after RoPE at (m, n)", fontsize=11)
    d = np.arange(-(n_pos - 1), n_pos)
    axes[1].plot(d, B.rope_scores(q, k, [0], -d, mode, base)[0], color="#335577")
    axes[1].axhline(float(q.astype(np.float64) @ k), color="grey", ls="--", lw=0.8, label="q·k without RoPE")
    axes[1].set_xlabel("m - n (query position minus key position)")
    axes[1].set_title("the same score, as a function of the distance alone", fontsize=11)
    axes[1].legend(fontsize=9)
    fig.suptitle(title, fontsize=12)
    fig.tight_layout()
    return fig


# ---- the FFN ------------------------------------------------------------------------------------------------

def plot_glu(tr, layer: int, token: int, label: str = "", top: int = 40):
    """The gated FFN on one token: the activation curve with the token's gate values on it, and for the
    ``top`` channels with the largest |act(gate) * up|: act(gate), up and their product."""
    import matplotlib.pyplot as plt
    L = tr[layer]
    g, u, p = L.gate[token], L.up[token], L.glu[token]
    act = {"silu": B.silu_f64, "gelu": B.gelu_f64}[tr.act]
    fig, axes = plt.subplots(1, 2, figsize=(11, 4), gridspec_kw={"width_ratios": [1, 1.7]})
    xs = np.linspace(min(g.min(), -4), max(g.max(), 4), 400)
    axes[0].plot(xs, B.silu_f64(xs), label="silu(x) = x·σ(x)", color="tab:blue")
    axes[0].plot(xs, B.gelu_f64(xs), label="gelu(x)", color="tab:green", ls="--")
    axes[0].scatter(g, act(g), s=4, color="black", alpha=0.35, label=f"this token's {len(g)} gate values")
    axes[0].axhline(0, color="grey", lw=0.6)
    axes[0].set_xlabel("gate = W_gate · x")
    axes[0].set_title(f"{tr.act}(gate): near 0 for negative gates", fontsize=11)
    axes[0].legend(fontsize=8)
    idx = np.argsort(-np.abs(p))[:top]
    xx = np.arange(len(idx))
    axes[1].bar(xx - 0.27, act(g[idx]), 0.27, label=f"{tr.act}(gate)", color="tab:blue")
    axes[1].bar(xx, u[idx], 0.27, label="up", color="tab:orange")
    axes[1].bar(xx + 0.27, p[idx], 0.27, label=f"{tr.act}(gate) * up", color="black")
    axes[1].axhline(0, color="grey", lw=0.6)
    axes[1].set_xticks(xx)
    axes[1].set_xticklabels([str(i) for i in idx], rotation=90, fontsize=8)
    axes[1].set_xlabel("channel (the largest products of this token)")
    axes[1].set_title(f"the {top} channels that pass the most", fontsize=11)
    # below the axes, so that it covers no bar
    axes[1].legend(fontsize=9, ncol=3, loc="upper center", bbox_to_anchor=(0.5, -0.3), frameon=False)
    fig.suptitle(f"layer {layer}'s FFN on token {label or token}: {tr.act}(gate) * up", fontsize=12)
    fig.tight_layout()
    return fig


# ---- the residual stream ------------------------------------------------------------------------------------

def plot_stream(traces: dict, labels: dict, highlight: dict):
    """Per model: the RMS of every token's stream row entering layer 0 and after each layer (log scale; the
    ``highlight`` tokens in colour), and what attention and the FFN of each layer add (median over tokens)."""
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(2, len(traces), figsize=(11, 7), squeeze=False)
    for c, (name, tr) in enumerate(traces.items()):
        rms = tr.stream_rms()
        ax = axes[0, c]
        from .attention import describe_label
        lines = ax.semilogy(rms, color="grey", lw=0.6, alpha=0.6)
        lines[0].set_label("every other token")
        for t in highlight.get(name, ()):
            ax.semilogy(rms[:, t], lw=2, label=describe_label(labels[name][t]))
        ax.set_xlabel("after layer (0 = the embedding entering layer 0)")
        ax.set_xticks(range(0, rms.shape[0], 5 if rms.shape[0] > 20 else 3))
        ax.set_xticklabels([str(i) for i in range(0, rms.shape[0], 5 if rms.shape[0] > 20 else 3)])
        ax.set_ylabel("RMS of the row")
        ax.set_title(f"{name}: the stream, token by token", fontsize=11)
        ax.legend(fontsize=9, loc="lower right")
        con = np.median(tr.contributions(), -1)
        ax = axes[1, c]
        il = np.arange(con.shape[0])
        ax.bar(il - 0.2, con[:, 0], 0.4, label="attention adds", color="tab:blue")
        ax.bar(il + 0.2, con[:, 1], 0.4, label="FFN adds", color="tab:green")
        ax.set_yscale("log")
        ax.set_xlabel("layer")
        ax.set_ylabel("RMS of the addition")
        ax.set_xticks(il[::5 if len(il) > 20 else 3])
        ax.set_title(f"{name}: what each branch writes (median over tokens)", fontsize=11)
        ax.legend(fontsize=9)
    fig.tight_layout()
    return fig
