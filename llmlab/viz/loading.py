"""Notebook 05's last section: the loader's pinned-buffer upload ring, as a timeline."""
from __future__ import annotations

import numpy as np

BUFFER_COLORS = ["#2a9d8f", "#e9c46a", "#e76f51", "#264653"]


def plot_upload_timeline(chunks, t: np.ndarray, first: int = 24, title: str = ""):
    """Two lanes, file reads and uploads, one bar per chunk coloured by its pinned buffer (the first ``first`` chunks)."""
    import matplotlib.pyplot as plt
    n = min(first, len(chunks))
    fig, ax = plt.subplots(figsize=(10, 2.6))
    for i in range(n):
        color = BUFFER_COLORS[chunks[i].buffer % len(BUFFER_COLORS)]
        ax.barh(1, (t[i, 1] - t[i, 0]) * 1e3, left=t[i, 0] * 1e3, color=color, ec="k", lw=0.4)
        ax.barh(0, (t[i, 3] - t[i, 2]) * 1e3, left=t[i, 2] * 1e3, color=color, ec="k", lw=0.4)
    ax.set_yticks([0, 1], ["upload to GPU\n(tensor_set_async)", "read from file\n(into pinned buffer)"])
    ax.set_xlabel("milliseconds")
    ax.set_title(title or f"first {n} chunks; colour = which of the {len(BUFFER_COLORS)} pinned buffers", fontsize=10)
    fig.tight_layout()
    return fig
