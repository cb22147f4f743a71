"""Pictures of the sampler chain: the next-token distribution before and after each sampler, and a
live view to turn the knobs (``llmlab.viz.live``: its default picture where widgets cannot run)."""
from __future__ import annotations

import numpy as np

from ..llama.sampling import SamplingParams, TokenDataArray, common_sampler_init


def _label(tokenizer, i: int) -> str:
    b = tokenizer.token_to_piece(int(i), special=True)
    s = b.decode("utf-8", "replace")
    return repr(s)[1:-1].replace(" ", "␣") or "∅"


def plot_chain(steps: list[tuple[str, TokenDataArray]], tokenizer, top: int = 12, title: str = "",
               columns: int = 4, width: float = 10.0):
    """One panel per stage of ``SamplerChain.trace``, ``columns`` to a row: the probabilities the
    surviving candidates stand for (log scale), over the ``top`` most likely tokens of the start; a
    grey x marks a token the stage removed, the red bar the token ``dist`` drew."""
    import matplotlib.pyplot as plt
    first = steps[0][1]
    ids = first.id[np.argsort(-first.logit, kind="stable")[:top]]
    floor = 1e-4
    nrows = -(-len(steps) // columns)
    fig, axes = plt.subplots(nrows, columns, figsize=(width, nrows * (0.27 * top + 1.1) + 0.6), sharey=True,
                             squeeze=False)
    y = np.arange(len(ids))
    for k, ax in enumerate(axes.flat):
        if k >= len(steps):
            ax.set_axis_off()
            continue
        name, cur = steps[k]
        probs = dict(zip(cur.id.tolist(), cur.probs().tolist())) if len(cur) else {}
        alive = np.array([int(i) in probs for i in ids])
        p = np.array([max(probs.get(int(i), 0.0), floor) for i in ids])
        picked = cur.token if 0 <= cur.selected < len(cur) else None
        colors = ["tab:red" if int(i) == picked else "tab:blue" for i in ids]
        ax.barh(y[alive], p[alive] - floor, left=floor, color=[c for c, a in zip(colors, alive) if a])
        ax.plot(np.full((~alive).sum(), 2 * floor), y[~alive], "x", color="grey", ms=6)
        ax.set_xscale("log")
        ax.set_xlim(floor, 1)
        ax.set_xticks([1e-4, 1e-2, 1], ["10⁻⁴", "0.01", "1"])
        ax.minorticks_off()
        ax.set_title(f"{name}: {len(cur)} left", fontsize=11)
    axes[0, 0].set_yticks(range(len(ids)), [_label(tokenizer, i) for i in ids])
    axes[0, 0].invert_yaxis()
    for row in axes:
        row[0].tick_params(labelleft=True)
    fig.suptitle(title or f"the {top} most likely next tokens through the chain: probability of what is left")
    fig.supxlabel("probability after the stage (log scale; grey x: removed by it, red: the token drawn)",
                  fontsize=11)
    fig.tight_layout()
    return fig


def chain_figure(logits, tokenizer, params: SamplingParams | None = None, top: int = 12, title: str = ""):
    """``plot_chain`` of llama.cpp's chain (``common_sampler_init``) for these parameters."""
    params = params or SamplingParams(seed=0)
    return plot_chain(common_sampler_init(params).trace(logits), tokenizer, top, title)


def chain_live(logits, tokenizer, top: int = 12, show: bool = True):
    """Sliders for temperature, top-k, top-p, min-p and seed over :func:`chain_figure`, as one
    ``llmlab.viz.live`` view (live in JupyterLab, its default picture anywhere else)."""
    import ipywidgets as W
    from .live import live
    d = SamplingParams(seed=0)
    knobs = dict(temp=W.FloatSlider(value=d.temp, min=0.0, max=2.0, step=0.05, description="temperature"),
                 top_k=W.IntSlider(value=d.top_k, min=0, max=100, description="top-k"),
                 top_p=W.FloatSlider(value=d.top_p, min=0.05, max=1.0, step=0.01, description="top-p"),
                 min_p=W.FloatSlider(value=d.min_p, min=0.0, max=0.5, step=0.01, description="min-p"),
                 seed=W.IntSlider(value=0, min=0, max=99, description="seed"))

    def render(**v):
        return chain_figure(logits, tokenizer, SamplingParams(**v), top,
                            title=", ".join(f"{k} {x:g}" for k, x in v.items()))
    return live(render, knobs, columns=3, show=show)
