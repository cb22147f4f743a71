"""Pictures of RPC traffic for notebook 06 (matplotlib; imported on demand): bytes per command, load against
one token, and the time a decode step spends on the wire."""
from __future__ import annotations


def plot_traffic(phases: dict[str, list[dict]], ax=None, title: str = "bytes on the wire, per command"):
    """Grouped horizontal bars: for each phase (e.g. "load", "one token"), bytes out + in of each command, on
    a log scale (the weights' upload and one token's copies differ by four orders of magnitude)."""
    import matplotlib.pyplot as plt
    import numpy as np
    cmds = []
    for rows in phases.values():
        for r in rows:
            if r["command"] not in cmds:
                cmds.append(r["command"])
    if ax is None:
        _, ax = plt.subplots(figsize=(10, 0.3 * len(cmds) * len(phases) + 1.2))
    h = 0.8 / len(phases)
    y = np.arange(len(cmds))
    for k, (label, rows) in enumerate(phases.items()):
        by = {r["command"]: r["bytes_out"] + r["bytes_in"] for r in rows}
        vals = [by.get(c, 0) for c in cmds]
        bars = ax.barh(y + k * h, [max(v, 0.5) for v in vals], height=h, label=label)
        for b, v in zip(bars, vals):
            if v:
                ax.text(b.get_width() * 1.15, b.get_y() + h / 2, f"{v:,}", va="center", fontsize=10)
    ax.set_xscale("log")
    ax.set_yticks(y + h * (len(phases) - 1) / 2, cmds, fontsize=11)
    ax.invert_yaxis()
    ax.set_xlabel("bytes (request + reply, headers included), log scale")
    ax.set_xlim(1, ax.get_xlim()[1] * 30)
    ax.legend(loc="lower right", fontsize=11)
    ax.set_title(title, fontsize=12, loc="left")
    return ax


def plot_wire_time(rows: list[dict], ax=None):
    """Stacked bars per link: round trips x RTT (latency) and bytes / bandwidth (transfer), in ms per token."""
    import matplotlib.pyplot as plt
    if ax is None:
        _, ax = plt.subplots(figsize=(10, 0.55 * len(rows) + 1.6))
    names = [f"{r['link']} ({r['measured']})" for r in rows]
    lat = [r["latency_ms"] for r in rows]
    tr = [r["transfer_ms"] for r in rows]
    ax.barh(names, lat, color="#e15759", label="round trips x RTT")
    ax.barh(names, tr, left=lat, color="#4e79a7", label="bytes / bandwidth")
    top = max(r["wire_ms"] for r in rows)
    for i, r in enumerate(rows):
        ax.text(r["wire_ms"] + top * 0.01, i, f"{r['wire_ms']:.2f} ms", va="center", fontsize=11)
    ax.invert_yaxis()
    ax.tick_params(labelsize=11)
    ax.set_xlabel("ms on the wire per decoded token", fontsize=11)
    ax.set_xlim(0, top * 1.2)
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.3), ncol=2, frameon=False, fontsize=11)
    ax.set_title("one decode step: waiting against transferring", fontsize=12, loc="left")
    return ax
