"""Pictures of llama.cpp's captured graph and of a node-by-node diff (notebooks 03, 06, 08).

- :func:`diff_table`: llmlab's node beside llama.cpp's, for one layer or all, with the error;
- :func:`capture_dot`: Graphviz DOT of llama.cpp's nodes of one layer, coloured by op or by match;
- :func:`layer_errors` / :func:`plot_error_profile`: how the error grows along the depth of a model.
"""
from __future__ import annotations

import html as _html
import math

import numpy as np
from typing import Mapping, Sequence

from ..llamacpp.diff import DiffReport, NodeDiff
from .html import HTML

MATCH_COLORS = {"ok": "#b8e186", "off": "#fdae61", "mismatch": "#f46d43", "missing": "#d73027", "view": "#f0f0f0"}
OP_COLORS = {
    "MUL_MAT": "#f4a582", "GET_ROWS": "#fddbc7", "ADD": "#d1e5f0", "MUL": "#92c5de", "SCALE": "#c6dbef",
    "RMS_NORM": "#b8e186", "ROPE": "#fee08b", "SOFT_MAX": "#d9a0d9", "FLASH_ATTN_EXT": "#c994c7",
    "SWIGLU": "#80cdc1", "GEGLU": "#80cdc1", "CONT": "#e0e0e0", "SET_ROWS": "#e0e0e0",
}


def status(d: NodeDiff, tol: float) -> str:
    """ok (matched, within tolerance), off (matched, error above it), mismatch (op/shape), missing."""
    if not d.present:
        return "missing"
    if not d.matched:
        return "mismatch"
    if d.max_rel_err is not None and not d.max_rel_err <= tol:
        return "off"
    return "ok"


def _layer(name: str) -> int | None:
    head, _, tail = name.split(" ")[0].rpartition("-")
    return int(tail) if head and tail.isdigit() else None


def diff_table(report: DiffReport, layer: int | None = None) -> HTML:
    """llmlab's node and llama.cpp's side by side (name, op, shape each), error and status, coloured by status."""
    esc = lambda x: _html.escape(str(x))   # noqa: E731
    head = ["name", "llmlab op", "llmlab shape", "llama.cpp op", "llama.cpp shape", "max abs err", "max rel err", ""]
    rows = []
    for d in report.nodes:
        if layer is not None and _layer(d.name) != layer:
            continue
        st = status(d, report.tol)
        cells = [d.name, d.op or "-", d.shape or "-", d.llama_cpp_op, d.llama_cpp_shape,
                 "-" if d.max_abs_err is None else f"{d.max_abs_err:.3g}",
                 "-" if d.max_rel_err is None else f"{d.max_rel_err:.3g}", st]
        tds = "".join(f"<td style='font-family:monospace;text-align:left'>{esc(c)}</td>" for c in cells)
        rows.append(f"<tr style='background:{MATCH_COLORS[st]}'>{tds}</tr>")
    ths = "".join(f"<th style='text-align:left'>{esc(h)}</th>" for h in head)
    return HTML(f"<table><thead><tr>{ths}</tr></thead><tbody>{''.join(rows)}</tbody></table>")


def capture_dot(capture, layer: int, report: DiffReport | None = None, show_views: bool = False,
                show_sources: bool = True) -> str:
    """DOT text of llama.cpp's captured nodes of one layer, in execution order.

    Compute nodes are boxes labelled ``label / op / shape``; with a
    ``report`` they are coloured by match status (green ok, orange error above
    tolerance, red missing or mismatched), else by op. Weights and inputs the
    layer reads appear as grey ellipses.
    """
    idx = [n.index for n in capture.nodes if n.layer == layer]
    if not idx:
        raise ValueError(f"no captured nodes for layer {layer}")
    span = capture.nodes[min(idx): max(idx) + 1]     # the layer's nodes and the layer-less ones among them ("norm")
    nodes = [n for n in span if show_views or not n.is_view]
    by_report: dict[int, str] = {}
    if report is not None:
        # the report lists compute nodes in capture order: pair them up by (label, occurrence)
        seen: dict[str, int] = {}
        occ: dict[tuple[str, int], NodeDiff] = {}
        for d in report.nodes:
            k = seen.get(d.name, 0)
            seen[d.name] = k + 1
            occ[(d.name, k)] = d
        seen.clear()
        for n in capture.compute_nodes():
            k = seen.get(n.label, 0)
            seen[n.label] = k + 1
            if (n.label, k) in occ:
                by_report[n.index] = status(occ[(n.label, k)], report.tol)
    emitted: set[str] = set()
    lines = ["digraph llama_cpp {", '  rankdir=TB; node [fontname="monospace", fontsize=9];']
    # a tensor's name can repeat (Qcur-0 three times): edges go to the latest node of that name computed so far
    latest: dict[str, str] = {}
    alias: dict[str, str] = {}      # hidden views stand for the node they view
    shown = {n.index for n in nodes}
    for n in span:
        if n.index not in shown:
            src = alias.get(n.src[0], n.src[0]) if n.src else n.name
            alias[n.name] = latest.get(src, src) if src in latest else src
            continue
        nid = f"n{n.index}"
        shape = "x".join(str(x) for x in _trim(n.ne))
        if n.is_view:
            color = MATCH_COLORS["view"]
        elif report is not None:
            color = MATCH_COLORS.get(by_report.get(n.index, "missing"))
        else:
            color = OP_COLORS.get(n.op_desc, "#ffffff")
        label = f"{n.label}\\n{n.op_desc} {n.type} [{shape}]".replace('"', "'")
        lines.append(f'  {nid} [shape=box, style="filled,rounded", fillcolor="{color}", label="{label}"];')
        for s in n.src:
            s = alias.get(s, s)
            if s in latest.values():
                lines.append(f"  {s} -> {nid};")
            elif s in latest:
                lines.append(f"  {latest[s]} -> {nid};")
            elif show_sources:
                sid = "s" + "".join(c if c.isalnum() else "_" for c in s)
                if sid not in emitted:
                    lines.append(f'  {sid} [shape=ellipse, style=filled, fillcolor="#eeeeee", label="{s}"];')
                    emitted.add(sid)
                lines.append(f"  {sid} -> {nid} [color=\"#999999\"];")
        latest[n.name] = nid
        alias.pop(n.name, None)
    lines.append("}")
    return "\n".join(lines)


def _trim(ne):
    ne = list(ne)
    while len(ne) > 1 and ne[-1] == 1:
        ne.pop()
    return ne


def layer_errors(report: DiffReport, base: str = "l_out") -> list[tuple[int, float]]:
    """``(layer, max_rel_err)`` of the node ``<base>-<layer>`` (the layer's output by default), in layer order."""
    out = {}
    for d in report.nodes:
        il = _layer(d.name)
        if il is not None and d.name == f"{base}-{il}" and d.max_rel_err is not None:
            out[il] = d.max_rel_err
    return sorted(out.items())


def plot_error_profile(reports: Mapping[str, DiffReport] | Sequence[tuple[str, DiffReport]], base: str = "l_out",
                       ax=None, title: str | None = None):
    """The relative error of each layer's output along the depth, one line per report (log scale)."""
    import matplotlib.pyplot as plt
    items = list(reports.items()) if isinstance(reports, Mapping) else list(reports)
    if ax is None:
        fig, ax = plt.subplots(figsize=(7, 3.6))
    for label, rep in items:
        pts = [(il, e) for il, e in layer_errors(rep, base) if math.isfinite(e)]
        if pts:
            xs, ys = zip(*pts)
            ax.plot(xs, [max(y, 1e-12) for y in ys], marker="o", ms=3, label=label)
    ax.set_yscale("log")
    ax.set_xlabel("layer")
    ax.set_ylabel(f"max rel err of {base}-<layer>")
    if items:
        ax.axhline(items[0][1].tol, color="grey", ls="--", lw=1, label="divergence tolerance")
    ax.legend(fontsize=8)
    ax.set_title(title or "error along the depth (llmlab vs llama.cpp)", fontsize=10)
    return ax.figure


def first_error(report: DiffReport, above: float = 0.0) -> NodeDiff | None:
    """The first node, in llama.cpp's order, whose max_rel_err exceeds ``above`` (0: any difference at all):
    where error enters the graph."""
    return next((d for d in report.nodes if d.max_rel_err is not None and d.max_rel_err > above), None)


def plot_node_errors(reports: Mapping[str, DiffReport] | Sequence[tuple[str, DiffReport]], ax=None,
                     title: str | None = None, floor: float = 1e-9, mark_op: str = "MUL_MAT"):
    """Every compared node's relative error in execution order (log scale, 0 drawn at ``floor``), layers
    marked along the x axis, ``mark_op`` nodes as dots: shows which kind of node lets error in or makes it jump."""
    import matplotlib.pyplot as plt
    items = list(reports.items()) if isinstance(reports, Mapping) else list(reports)
    if ax is None:
        fig, ax = plt.subplots(figsize=(10, 3.4))
    for label, rep in items:
        pts = [(i, d) for i, d in enumerate(rep.nodes) if d.max_rel_err is not None and math.isfinite(d.max_rel_err)]
        if not pts:
            continue
        xs = [i for i, _ in pts]
        ys = [max(d.max_rel_err, floor) for _, d in pts]
        line, = ax.step(xs, ys, where="post", lw=1, label=label)
        mx = [(i, max(d.max_rel_err, floor)) for i, d in pts if d.op == mark_op]
        if mx:
            ax.plot(*zip(*mx), ".", ms=3, color=line.get_color())
    if items:
        nodes = items[0][1].nodes
        starts, seen = [], set()
        for i, d in enumerate(nodes):
            il = _layer(d.name)
            if il is not None and il not in seen:
                seen.add(il)
                starts.append((i, il))
        step = max(1, len(starts) // 10)
        ax.set_xticks([i for i, _ in starts[::step]])
        ax.set_xticklabels([str(il) for _, il in starts[::step]])
        ax.axhline(items[0][1].tol, color="grey", ls="--", lw=1)
    ax.set_yscale("log")
    ax.set_xlabel("node, in llama.cpp's order (ticks: first node of a layer)")
    ax.set_ylabel("max rel err")
    ax.legend(fontsize=8)
    ax.set_title(title or f"every node's error (dots: {mark_op}; {floor:g} = identical)", fontsize=10)
    return ax.figure


# ---- notebook 03: llmlab against llama.cpp, several arithmetic paths ------------------------------------------

def error_reports(runs: Mapping[str, tuple], modes: Mapping[str, object], output: str = "last"):
    """For each model ``name -> (path, tokens)``: llama.cpp's capture of one decode, and for each
    ``mode -> dispatch`` (None: llmlab as it is) the diff of llmlab's nodes against it. Returns
    ``(reports, captures)`` with ``reports[(name, mode)]`` and ``captures[name]``."""
    from ..llamacpp import capture, diff, llmlab_nodes
    reports, caps = {}, {}
    for name, (path, toks) in runs.items():
        caps[name] = cap = capture(path, toks, flash_attn=False, output=output)
        for mode, disp in modes.items():
            mine = llmlab_nodes(path, toks, flash_attn=False, output=output, dispatch=disp)
            reports[(name, mode)] = diff(mine, cap)
    return reports, caps


SUMMARY_HEADERS = ["model", "path", "nodes matched", "first node > 1e-3", "first layer ≠ 0", "l_out-0", "mid layer",
                   "last layer", "logits"]


def summary_rows(reports: Mapping[tuple, DiffReport]) -> list[list]:
    """One row per (model, path): nodes matched, where it first diverges, the error of the first, a
    middle and the last layer's output, and of the logits (``result_output``)."""
    rows = []
    for (name, mode), rep in reports.items():
        errs = dict(layer_errors(rep))
        out = next(d for d in rep.nodes if d.name == "result_output")
        first = next((il for il, e in sorted(errs.items()) if e > 0), None)
        rows.append([name, mode, f"{rep.matched}/{rep.total}", rep.first_divergence or "none",
                     "-" if first is None else first, f"{errs[0]:.1e}", f"{errs[max(errs) // 2]:.1e}",
                     f"{errs[max(errs)]:.1e}", f"{out.max_rel_err:.1e}"])
    return rows


FIRST_ERROR_HEADERS = ["model", "path", "first node ≠ llama.cpp", "first node > 1e-5"]


def first_error_rows(reports: Mapping[tuple, DiffReport]) -> list[list]:
    """One row per (model, path): the first node that differs at all, and the first above 1e-5."""
    rows = []
    for (name, mode), rep in reports.items():
        e0, e5 = first_error(rep), first_error(rep, above=1e-5)
        rows.append([name, mode] + [f"{d.name} ({d.op}, {d.max_rel_err:.1e})" if d else "none" for d in (e0, e5)])
    return rows


def logits_line(name: str, mine, theirs) -> str:
    """Top-1 token, cosine and max |difference| of two last-position logit vectors, in one line."""
    a, b = np.asarray(mine, np.float64), np.asarray(theirs, np.float64)
    cos = float(a @ b / np.linalg.norm(a) / np.linalg.norm(b))
    return (f"{name:8} last position: top-1 llmlab {int(a.argmax())} / llama.cpp {int(b.argmax())}, cosine {cos:.6f}, "
            f"max |diff| {np.abs(a - b).max():.3g} (logit range {b.min():.1f} .. {b.max():.1f})")
