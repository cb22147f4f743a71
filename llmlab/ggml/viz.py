"""Pictures of graphs and schedules for the notebooks (matplotlib; imported on demand)."""
from __future__ import annotations

import numpy as np

BACKEND_RGB = {"CPU": "#9ecae1", "ACCEL": "#fc9272"}
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
    cmap = ListedColormap(["#e0e0e0"] + [BACKEND_RGB.get(n, "#bbbbbb") for n in names])
    if ax is None:
        _, ax = plt.subplots(figsize=(12, 0.45 * len(rows) + 1.2))
    ax.imshow(data, aspect="auto", cmap=cmap, vmin=0, vmax=len(names), interpolation="nearest")
    ax.set_yticks(range(len(labels)), labels, fontsize=8)
    ax.set_xlabel("node index (topological order)")
    for s in schedule.splits[1:]:
        ax.axvline(s.i_start - 0.5, color="black", lw=0.8)
    handles = [plt.Rectangle((0, 0), 1, 1, color=c) for c in ["#e0e0e0"] + [BACKEND_RGB.get(n, "#bbb") for n in names]]
    ax.legend(handles, ["unassigned"] + names, loc="upper right", fontsize=8, ncol=3, bbox_to_anchor=(1, 1.35))
    ax.set_title(title, fontsize=10, loc="left")
    return ax


def plot_partitions(traces, nth: int, axes=None):
    """The three intra-node partitions from a traced run: interleaved rows, blocks of rows, mul_mat chunks."""
    import matplotlib.pyplot as plt
    pick = {}
    for t in traces:
        if t.kind not in pick and t.kind in ("interleaved", "blocks", "chunks"):
            pick[t.kind] = t
    if axes is None:
        _, axes = plt.subplots(1, 3, figsize=(13, 3.6))
    for ax, kind, title in zip(axes, ["interleaved", "blocks", "chunks"],
                               ["interleaved rows (SOFT_MAX, RMS_NORM)", "contiguous blocks (ADD, MUL, ...)",
                                "atomic-counter chunks (MUL_MAT)"]):
        t = pick.get(kind)
        if t is None:
            ax.set_axis_off()
            continue
        if kind == "chunks":
            for ith, work in enumerate(t.work):
                for chunk, r0, r1, c0, c1 in work:
                    ax.add_patch(plt.Rectangle((c0, r0), c1 - c0, r1 - r0, color=THREAD_COLORS[ith % 8], alpha=0.85))
                    ax.text((c0 + c1) / 2, (r0 + r1) / 2, str(chunk), ha="center", va="center", fontsize=6)
            allw = [w for per in t.work for w in per]
            ax.set_xlim(0, max(w[4] for w in allw))
            ax.set_ylim(max(w[2] for w in allw), 0)
            ax.set_xlabel("token (src1 row)")
            ax.set_ylabel("output row (weight row)")
        else:
            nr = max((max(w) for w in t.work if w), default=0) + 1
            grid = np.full((nr, 1), -1)
            for ith, rows in enumerate(t.work):
                grid[rows, 0] = ith
            from matplotlib.colors import ListedColormap
            ax.imshow(grid.T, aspect="auto", cmap=ListedColormap(THREAD_COLORS[:nth]), vmin=0, vmax=nth - 1)
            ax.set_yticks([])
            ax.set_xlabel("row")
        ax.set_title(f"{title}\n{t.name} ({t.op})", fontsize=9)
    handles = [plt.Rectangle((0, 0), 1, 1, color=THREAD_COLORS[i]) for i in range(nth)]
    axes[0].figure.legend(handles, [f"thread {i}" for i in range(nth)], loc="lower center", ncol=nth, fontsize=8)
    axes[0].figure.subplots_adjust(bottom=0.25)
    return axes


def plot_op_share(rows, ax=None, top: int = 8):
    """FLOP share per op (from graph.stats.op_table)."""
    import matplotlib.pyplot as plt
    rows = rows[:top]
    if ax is None:
        _, ax = plt.subplots(figsize=(7, 3))
    ax.barh([r["op"] for r in rows][::-1], [100 * r["share"] for r in rows][::-1], color="#f4a582")
    for i, r in enumerate(rows[::-1]):
        ax.text(100 * r["share"] + 0.5, i, f"{100 * r['share']:.2f}%  ({r['nodes']} nodes)", va="center", fontsize=8)
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
