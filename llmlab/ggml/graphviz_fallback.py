"""A graph drawn without Graphviz: where the ``dot`` program is missing, the graph functions
(:func:`llmlab.ggml.graphviz.render`, ``nb.graph``, ``viz.overview.pipeline_graph``) say so in one line
and show this static drawing instead of raising.

It reads the DOT text llmlab writes (nodes with a label and fill colour, edges, ``rankdir``), puts
each node on the rank of its longest path from an input, orders each rank by the mean position of
its neighbours (a few sweeps), and draws boxes and straight arrows with matplotlib as SVG. A
simplified picture, not Graphviz's layout: enough to read the graph's structure.
"""
from __future__ import annotations

import html as _html
import io
import re
from dataclasses import dataclass, field

_TOKEN = re.compile(r'\s+|//[^\n]*|#[^\n]*|/\*.*?\*/|("(?:\\.|[^"\\])*")|(->|--|[{}\[\];,=])|([^\s{}\[\];,="]+)', re.S)


@dataclass
class DotGraph:
    nodes: dict = field(default_factory=dict)        # id -> attributes
    edges: list = field(default_factory=list)        # (src, dst, attributes)
    attrs: dict = field(default_factory=dict)        # graph attributes (rankdir, ...)


def _tokens(text: str) -> list[str]:
    out = []
    for m in _TOKEN.finditer(text):
        if m.group(1) is not None:
            out.append(m.group(1))
        elif m.group(2) is not None or m.group(3) is not None:
            out.append(m.group(2) or m.group(3))
    return out


def _unquote(tok: str) -> str:
    if tok.startswith('"') and tok.endswith('"'):
        tok = tok[1:-1]
        tok = re.sub(r"\\([nlr])", "\n", tok)
        return tok.replace('\\"', '"').replace("\\\\", "\\")
    return tok


def parse(text: str) -> DotGraph:
    """The nodes, edges and graph attributes of DOT text (clusters and subgraphs are flattened)."""
    toks = _tokens(text)
    g = DotGraph()
    node_defaults: dict = {}
    depth, i = 0, 0

    def attr_list(i):
        attrs = {}
        while i < len(toks) and toks[i] == "[":
            i += 1
            while i < len(toks) and toks[i] != "]":
                if toks[i] in (",", ";"):
                    i += 1
                    continue
                key = _unquote(toks[i])
                if i + 2 < len(toks) and toks[i + 1] == "=":
                    attrs[key] = _unquote(toks[i + 2])
                    i += 3
                else:
                    i += 1
            i += 1
        return attrs, i

    def add_node(nid, attrs=None):
        if nid not in g.nodes:
            g.nodes[nid] = dict(node_defaults)
        if attrs:
            g.nodes[nid].update(attrs)

    while i < len(toks):
        t = toks[i]
        if t == "{":
            depth += 1
            i += 1
        elif t == "}":
            depth -= 1
            i += 1
        elif t == ";" or t == ",":
            i += 1
        elif t.lower() in ("strict", "digraph", "graph", "subgraph") and (i + 1 < len(toks)) and toks[i + 1] != "[":
            i += 1                                     # a (sub)graph header: its name, then "{"
            while i < len(toks) and toks[i] != "{":
                i += 1
        elif t.lower() in ("node", "edge", "graph") and i + 1 < len(toks) and toks[i + 1] == "[":
            attrs, i = attr_list(i + 1)
            if t.lower() == "node":
                node_defaults.update({k: v for k, v in attrs.items() if k in ("fillcolor", "shape", "style")})
            elif t.lower() == "graph" and depth <= 1:
                g.attrs.update(attrs)
        elif i + 1 < len(toks) and toks[i + 1] == "=":   # rankdir=LR; label="..."
            if depth <= 1:
                g.attrs[_unquote(t)] = _unquote(toks[i + 2]) if i + 2 < len(toks) else ""
            i += 3
        else:                                           # a node, or an edge chain a -> b -> c
            chain = [_unquote(t)]
            i += 1
            while i + 1 < len(toks) and toks[i] in ("->", "--"):
                chain.append(_unquote(toks[i + 1]))
                i += 2
            attrs, i = attr_list(i)
            if len(chain) == 1:
                add_node(chain[0], attrs)
            else:
                for nid in chain:
                    add_node(nid)
                g.edges += [(a, b, attrs) for a, b in zip(chain, chain[1:])]
    return g


def layout(g: DotGraph, sweeps: int = 4) -> dict:
    """(rank, position within the rank) of every node: longest path from the inputs (each input just above
    its first reader), then barycentre sweeps."""
    ids = list(g.nodes)
    succ = {n: [] for n in ids}
    pred = {n: [] for n in ids}
    state: dict = {}
    for a, b, attrs in g.edges:                       # edges that do not constrain the layout stay out
        if attrs.get("constraint", "true") != "false" and a != b:
            succ[a].append(b)
    order: list = []                                  # depth-first post-order; edges back up the stack are dropped
    for root in ids:
        if root in state:
            continue
        stack = [(root, iter(succ[root]))]
        state[root] = 1
        while stack:
            n, it = stack[-1]
            nxt = next(it, None)
            if nxt is None:
                state[n] = 2
                order.append(n)
                stack.pop()
            elif state.get(nxt) is None:
                state[nxt] = 1
                stack.append((nxt, iter(succ[nxt])))
            elif state[nxt] == 1:
                succ[n] = [m for m in succ[n] if m != nxt]
    for a in ids:
        for b in succ[a]:
            pred[b].append(a)
    rank = {}
    for n in reversed(order):                         # topological order
        rank[n] = max((rank[p] + 1 for p in pred[n]), default=0)
    for n in ids:                                     # an input (a weight) sits just above its first reader
        if not pred[n] and succ[n]:
            rank[n] = min(rank[m] for m in succ[n]) - 1
    ranks: dict[int, list] = {}
    for n in ids:
        ranks.setdefault(rank[n], []).append(n)
    pos = {n: float(k) for r in ranks.values() for k, n in enumerate(r)}
    for s in range(sweeps):
        seq = sorted(ranks) if s % 2 == 0 else sorted(ranks, reverse=True)
        for r in seq:
            nbrs = pred if s % 2 == 0 else succ
            key = {n: (sum(pos[m] for m in nbrs[n]) / len(nbrs[n]) if nbrs[n] else pos[n]) for n in ranks[r]}
            ranks[r].sort(key=lambda n: key[n])
            for k, n in enumerate(ranks[r]):
                pos[n] = float(k)
    return {n: (rank[n], ranks[rank[n]].index(n) - (len(ranks[rank[n]]) - 1) / 2) for n in ids}


def _color(c: str | None, default: str = "#ffffff"):
    from matplotlib.colors import to_rgba
    try:
        return to_rgba(c or default)
    except ValueError:
        return to_rgba(default)


def draw(dot_text: str, max_width_in: float = 14.0, max_height_in: float = 40.0):
    """A matplotlib figure of the graph (boxes and straight arrows)."""
    import matplotlib.pyplot as plt
    from matplotlib.patches import FancyArrowPatch, FancyBboxPatch
    g = parse(dot_text)
    lr = g.attrs.get("rankdir", "TB").upper() in ("LR", "RL")
    where = layout(g)
    labels = {n: a.get("label", n) for n, a in g.nodes.items()}
    longest = max((max(len(s) for s in lab.split("\n")) for lab in labels.values()), default=4)
    tallest = max((lab.count("\n") + 1 for lab in labels.values()), default=1)
    bw, bh = 0.058 * longest + 0.2, 0.14 * tallest + 0.12      # box size in inches at 7 pt
    gap_x, gap_y = bw + 0.25, bh + 0.45
    if lr:
        gap_x, gap_y = bw + 0.35, bh + 0.25
    xy = {}
    for n, (r, k) in where.items():
        xy[n] = (r * gap_x, -k * gap_y) if lr else (k * gap_x, -r * gap_y)
    xs = [p[0] for p in xy.values()] or [0.0]
    ys = [p[1] for p in xy.values()] or [0.0]
    w_in, h_in = max(xs) - min(xs) + bw + 0.2, max(ys) - min(ys) + bh + 0.2
    scale = min(1.0, max_width_in / w_in, max_height_in / h_in)    # a big graph: smaller, with smaller text
    fig, ax = plt.subplots(figsize=(w_in * scale, h_in * scale))
    pt = max(3.0, 7 * scale)
    for n, (x, y) in xy.items():
        a = g.nodes[n]
        ellipse = a.get("shape") == "ellipse"
        filled = "filled" in a.get("style", "filled")
        ax.add_patch(FancyBboxPatch((x - bw / 2, y - bh / 2), bw, bh,
                                    boxstyle="round,pad=0,rounding_size=%.2f" % (bh / 2 if ellipse else 0.06),
                                    facecolor=_color(a.get("fillcolor")) if filled else "white",
                                    edgecolor="#555555", linewidth=0.8,
                                    linestyle="--" if "dashed" in a.get("style", "") else "-", zorder=2))
        ax.text(x, y, labels[n], ha="center", va="center", fontsize=pt, zorder=3)
    for a, b, attrs in g.edges:
        (x0, y0), (x1, y1) = xy[a], xy[b]
        style = attrs.get("style", "")
        span = abs(where[a][0] - where[b][0])
        bend = 0.25 if attrs.get("constraint") == "false" else 0.12 if span > 1 else 0.0   # long edges bow out
        arrow = FancyArrowPatch((x0, y0), (x1, y1), arrowstyle="-|>", mutation_scale=8, linewidth=0.7,
                                color=_color(attrs.get("color"), "#666666"), shrinkA=0, shrinkB=0,
                                linestyle="--" if style == "dashed" else ":" if style == "dotted" else "-",
                                connectionstyle=f"arc3,rad={bend}", zorder=1)   # under the boxes
        arrow.set_patchA(None)
        _clip_to_boxes(arrow, (x0, y0), (x1, y1), bw, bh)
        ax.add_patch(arrow)
        if attrs.get("label"):
            ax.text((x0 + x1) / 2, (y0 + y1) / 2, attrs["label"], fontsize=pt - 1, color="#444444",
                    ha="left", va="bottom")
    ax.set_xlim(min(xs) - bw / 2 - 0.1, max(xs) + bw / 2 + 0.1)
    ax.set_ylim(min(ys) - bh / 2 - 0.1, max(ys) + bh / 2 + 0.1)
    ax.set_aspect("equal")
    ax.axis("off")
    fig.subplots_adjust(0, 0, 1, 1)
    return fig


def _clip_to_boxes(arrow, p0, p1, bw, bh) -> None:
    """Start and end the arrow at the edges of the two boxes, not at their centres."""
    import math
    (x0, y0), (x1, y1) = p0, p1
    dx, dy = x1 - x0, y1 - y0
    if dx == 0 and dy == 0:
        return
    t = min(bw / 2 / abs(dx) if dx else math.inf, bh / 2 / abs(dy) if dy else math.inf)
    arrow.set_positions((x0 + t * dx, y0 + t * dy), (x1 - t * dx, y1 - t * dy))


def svg(dot_text: str) -> str:
    """The static drawing as inline SVG markup, scaled to the page's width."""
    import matplotlib.pyplot as plt
    fig = draw(dot_text)
    buf = io.StringIO()
    fig.savefig(buf, format="svg", facecolor="white")
    plt.close(fig)
    text = buf.getvalue()
    text = text[text.index("<svg"):]
    return re.sub(r'<svg([^>]*?) width="[^"]*" height="[^"]*"', r"<svg\1 style='max-width:100%;height:auto'",
                  text, count=1)


def message(dot_text: str) -> str:
    """The one line said where Graphviz's ``dot`` is missing."""
    from ..hints import hint
    return (f"Graphviz's `dot` program is not installed, so this is a simplified drawing; install graphviz "
            f"({hint('dot')}) for the real one (the DOT text has {dot_text.count('->')} edges).")


def html(dot_text: str, max_height: int = 640) -> str:
    """The message and the static drawing, as HTML (a failed drawing still leaves the message)."""
    head = f"<p><b>{_html.escape(message(dot_text))}</b></p>"
    try:
        pic = svg(dot_text)
    except Exception as e:       # the message is what matters; say why there is no picture
        return head + f"<p>(no drawing either: {_html.escape(type(e).__name__)}: {_html.escape(str(e))})</p>"
    return (head + f"<div style='max-width:100%;max-height:{max_height}px;overflow:auto;border:1px solid #ddd'>"
            f"{pic}</div>")


class StaticGraph(str):
    """What :func:`llmlab.ggml.graphviz.render` returns without ``dot``: the one-line message (a ``str``,
    printable anywhere), which Jupyter shows with the static drawing under it."""

    def __new__(cls, dot_text: str):
        obj = super().__new__(cls, message(dot_text))
        obj.source = dot_text
        return obj

    def _repr_html_(self) -> str:
        return html(self.source)
