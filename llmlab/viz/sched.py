"""Pictures of graphs and schedules for the notebooks (matplotlib; imported on demand)."""
from __future__ import annotations

import numpy as np

from ..ggml.graphviz import backend_colors

THREAD_COLORS = ["#4e79a7", "#f28e2b", "#59a14f", "#e15759", "#76b7b2", "#edc948", "#b07aa1", "#ff9da7"]


def plot_passes(schedule, ax=None, title: str = "ggml_backend_sched_split_graph, pass by pass"):
    """One row per pass, one column per node (graph order), coloured by backend; grey = not yet assigned."""
    import matplotlib.pyplot as plt
    from matplotlib.colors import ListedColormap
    names = [b.name for b in schedule.backends]
    rows = [p[1] for p in schedule.passes]
    labels = [p[0] for p in schedule.passes]
    split_row = [0] * schedule.graph.n_nodes
    for s in schedule.splits:
        for i in range(s.i_start, s.i_end):
            split_row[i] = schedule.assignment.get(id(schedule.graph.nodes[i]), -1)
    rows.append(split_row)
    labels.append(f"5: cut into {schedule.n_splits} splits ({schedule.n_copies} copies)")
    data = np.array(rows) + 1                              # -1 -> 0 (unassigned)
    colors = backend_colors(names)
    cmap = ListedColormap(["#e0e0e0"] + [colors.get(n, "#bbbbbb") for n in names])
    if ax is None:
        _, ax = plt.subplots(figsize=(10, 0.45 * len(rows) + 1.4))
    ax.imshow(data, aspect="auto", cmap=cmap, vmin=0, vmax=len(names), interpolation="nearest")
    ax.set_yticks(range(len(labels)), labels, fontsize=11)
    ax.set_xlabel("node index (topological order)")
    for s in schedule.splits[1:]:
        ax.axvline(s.i_start - 0.5, color="black", lw=0.8)
    handles = [plt.Rectangle((0, 0), 1, 1, color=c) for c in ["#e0e0e0"] + [colors.get(n, "#bbb") for n in names]]
    ax.legend(handles, ["unassigned"] + names, loc="upper right", ncol=3, bbox_to_anchor=(1, -0.3), frameon=False)
    ax.set_title(title, fontsize=12, loc="left")
    return ax


def plot_partitions(traces, nth: int, width: float = 10.0):
    """The three intra-node partitions from a traced run: interleaved rows and blocks of rows on
    top, the mul_mat chunks below across the whole width (output rows along x), each chunk numbered
    by its place in the atomic counter's order where the number fits. Returns the figure."""
    import matplotlib.pyplot as plt
    from matplotlib.colors import ListedColormap

    from .layout import label_boxes
    pick = {}
    for t in traces:
        if t.kind not in pick and t.kind in ("interleaved", "blocks", "chunks"):
            pick[t.kind] = t
    fig = plt.figure(figsize=(width, 6.2))
    grid = fig.add_gridspec(2, 2, height_ratios=[1, 1.25])
    axes = {"interleaved": fig.add_subplot(grid[0, 0]), "blocks": fig.add_subplot(grid[0, 1]),
            "chunks": fig.add_subplot(grid[1, :])}
    titles = {"interleaved": "interleaved rows (SOFT_MAX, RMS_NORM)", "blocks": "contiguous blocks (ADD, MUL, ...)",
              "chunks": "atomic-counter chunks (MUL_MAT), numbered in the order they were taken"}
    boxes, labels = [], []
    for kind, ax in axes.items():
        t = pick.get(kind)
        if t is None:
            ax.set_axis_off()
            continue
        ax.set_title(f"{titles[kind]}\n{t.name} ({t.op})" if kind != "chunks" else f"{titles[kind]}: {t.name}", fontsize=11)
        if kind == "chunks":
            for ith, work in enumerate(t.work):
                for chunk, r0, r1, c0, c1 in work:
                    ax.add_patch(plt.Rectangle((r0, c0), r1 - r0, c1 - c0, facecolor=THREAD_COLORS[ith % 8],
                                               edgecolor="white", lw=0.8))
                    boxes.append((r0, c0, r1, c1))
                    labels.append(str(chunk))
            allw = [w for per in t.work for w in per]
            ax.set_xlim(0, max(w[2] for w in allw))
            ax.set_ylim(max(w[4] for w in allw), 0)
            ax.set_xlabel("output row (weight row)")
            ax.set_ylabel("token\n(src1 row)")
        else:
            nr = max((max(w) for w in t.work if w), default=0) + 1
            grid_rows = np.full((nr, 1), -1)
            for ith, rows in enumerate(t.work):
                grid_rows[rows, 0] = ith
            ax.imshow(grid_rows.T, aspect="auto", cmap=ListedColormap(THREAD_COLORS[:nth]), vmin=0, vmax=nth - 1)
            ax.set_yticks([])
            ax.set_xlabel("row")
    handles = [plt.Rectangle((0, 0), 1, 1, color=THREAD_COLORS[i]) for i in range(nth)]
    fig.legend(handles, [f"thread {i}" for i in range(nth)], loc="lower center", ncol=nth)
    fig.tight_layout(rect=(0, 0.07, 1, 1))
    if boxes:
        label_boxes(axes["chunks"], boxes, labels, color="white", fontsize=10)
    return fig


def plot_op_share(rows, ax=None, top: int = 8):
    """FLOP share per op (from graph.stats.op_table)."""
    import matplotlib.pyplot as plt
    rows = rows[:top]
    if ax is None:
        _, ax = plt.subplots(figsize=(8, 3.4))
    ax.barh([r["op"] for r in rows][::-1], [100 * r["share"] for r in rows][::-1], color="#f4a582")
    for i, r in enumerate(rows[::-1]):
        ax.text(100 * r["share"] + 0.5, i, f"{100 * r['share']:.2f}%  ({r['nodes']} nodes)", va="center", fontsize=10)
    ax.set_xlabel("share of the graph's FLOPs (%)")
    ax.set_xlim(0, 115)
    return ax


def split_lines(schedule) -> str:
    """The splits as text: backend, node range, first/last node, copied inputs."""
    out = []
    for r in schedule.summary():
        ins = ", ".join(r["inputs"]) or "-"
        out.append(f"split[{r['split']}] {r['backend']:<5} {r['nodes']:4d} nodes  {r['first']} .. {r['last']}"
                   f"   inputs copied in: {ins} ({r['input_bytes']:,} bytes)")
    return "\n".join(out)
