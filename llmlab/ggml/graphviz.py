"""Draw a graph with Graphviz: nodes coloured by op or by backend, shapes and types on labels,
a layer or a range of layers, optional clusters by split."""
from __future__ import annotations

import shutil
from typing import Iterable

from .cgraph import CGraph
from .tensor import Tensor

OP_COLORS = {
    "MUL_MAT": "#f4a582", "GET_ROWS": "#fddbc7", "ADD": "#d1e5f0", "MUL": "#92c5de", "SCALE": "#c6dbef",
    "RMS_NORM": "#b8e186", "NORM": "#b8e186", "ROPE": "#fee08b", "SOFT_MAX": "#d9a0d9", "FLASH_ATTN_EXT": "#c994c7",
    "SILU": "#80cdc1", "GELU": "#80cdc1", "SWIGLU": "#80cdc1", "GEGLU": "#80cdc1",
    "CPY": "#e0e0e0", "SET_ROWS": "#e0e0e0", "CONT": "#e0e0e0", "VIEW": "#f7f7f7", "RESHAPE": "#f7f7f7", "PERMUTE": "#f7f7f7",
    "TRANSPOSE": "#f7f7f7", "NONE": "#ffffff",
}
BACKEND_COLORS = {"CPU": "#9ecae1", "ACCEL": "#fc9272", "?": "#dddddd"}
RPC_COLORS = ("#a1d99b", "#fdae6b", "#bcbddc", "#c7e9c0")     # one per RPC device, beside CPU's blue and ACCEL's red


def backend_colors(names) -> dict[str, str]:
    """Each backend's colour in the scheduler drawings (``to_dot`` and :mod:`llmlab.viz.sched`), for the
    backends ``names`` of one schedule: CPU and ACCEL their own, the RPC devices in turn from ``RPC_COLORS``.
    A name without a colour is left out (each drawing has its grey for it)."""
    names = list(names)
    out = {n: BACKEND_COLORS[n] for n in names if n in BACKEND_COLORS}
    for i, n in enumerate(n for n in names if n.startswith("RPC")):
        out[n] = RPC_COLORS[i % len(RPC_COLORS)]
    return out


def _layer_from_name(t: Tensor) -> int | None:
    name = t.name
    if name.startswith("blk."):
        try:
            return int(name.split(".")[1])
        except ValueError:
            return None
    head, _, tail = name.rpartition("-")
    if head and tail.isdigit():
        return int(tail)
    return None


def _label(t: Tensor) -> str:
    name = t.name.replace('"', "'")
    if len(name) > 40:
        name = name[:37] + "..."
    op = t.op if t.op != "NONE" else ("weight" if t.name.endswith(".weight") else "leaf")
    return f"{name}\\n{op} {t.type.name} {t.shape_str()}"


def to_dot(graph, layers: int | Iterable[int] | None = None, color_by: str = "op", schedule=None,
           show_leafs: bool = True, clusters: bool = False, max_nodes: int = 600) -> str:
    """DOT text for a CGraph (or an LLMGraph: its ``gf`` and layer map are used).

    layers: a layer index or an iterable of them (-1: the input part, n_layer: the output part);
    color_by: "op" or "backend" (needs ``schedule``, a sched.Schedule); clusters: group by split.
    """
    layer_of = getattr(graph, "layer_of", None)
    gf: CGraph = getattr(graph, "gf", graph)
    if isinstance(layers, int):
        layers = [layers]
    want = set(layers) if layers is not None else None

    def layer(t: Tensor):
        if layer_of is not None and id(t) in layer_of:
            return layer_of[id(t)]
        return _layer_from_name(t)

    nodes = [n for n in gf.nodes if want is None or layer(n) in want]
    if len(nodes) > max_nodes:
        raise ValueError(f"{len(nodes)} nodes is too many to draw; pick a layer or a range (max_nodes={max_nodes})")
    keep = {id(n) for n in nodes}

    by_backend = backend_colors(b.name for b in getattr(schedule, "backends", ()))

    def color(t: Tensor) -> str:
        if color_by == "backend" and schedule is not None:
            return by_backend.get(schedule.backend_of(t), "#dddddd")
        return OP_COLORS.get(t.op, "#ffffff")

    lines = ["digraph G {", '  rankdir=TB; node [shape=box, style="rounded,filled", fontname="Helvetica", fontsize=9];',
             '  edge [color="#666666", arrowsize=0.6];']
    ids: dict[int, str] = {}

    def nid(t: Tensor) -> str:
        if id(t) not in ids:
            ids[id(t)] = f"t{len(ids)}"
        return ids[id(t)]

    def node_line(t: Tensor, indent="  ") -> str:
        shape = ', shape=ellipse' if t.op == "NONE" else ""
        return f'{indent}{nid(t)} [label="{_label(t)}", fillcolor="{color(t)}"{shape}];'

    if clusters and schedule is not None:
        for k, s in enumerate(schedule.splits):
            members = [n for n in schedule.split_nodes(s) if id(n) in keep]
            if not members:
                continue
            lines.append(f'  subgraph cluster_{k} {{ label="split {k}: {schedule.backends[s.backend].name}"; '
                         f'style=dashed; color="#888888";')
            lines += [node_line(n, "    ") for n in members]
            lines.append("  }")
    else:
        lines += [node_line(n) for n in nodes]
    outside = {}
    for n in nodes:
        for s in n.src:
            if id(s) in keep:
                continue
            if s.op == "NONE" and not show_leafs:
                continue
            if id(s) not in outside:
                outside[id(s)] = s
                style = ', style="rounded,filled,dashed"' if s.op != "NONE" else ""
                lines.append(f'  {nid(s)} [label="{_label(s)}", fillcolor="{color(s) if s.op != "NONE" else "#ffffff"}"'
                             f'{", shape=ellipse" if s.op == "NONE" else ""}{style}];')
    for n in nodes:
        for s in n.src:
            if id(s) in keep or id(s) in outside:
                lines.append(f"  {nid(s)} -> {nid(n)};")
    lines.append("}")
    return "\n".join(lines)


def has_dot() -> bool:
    return shutil.which("dot") is not None


def render(dot_text: str, fmt: str = "svg"):
    """A ``graphviz.Source`` (shown inline by Jupyter) when Graphviz's ``dot`` program exists;
    otherwise a one-line message saying so, with the install hint (a ``str``), which Jupyter shows
    with a simplified static drawing under it (:mod:`llmlab.ggml.graphviz_fallback`)."""
    if not has_dot():
        from .graphviz_fallback import StaticGraph
        return StaticGraph(dot_text)
    import graphviz
    src = graphviz.Source(dot_text, format=fmt)
    return src
