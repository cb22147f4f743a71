"""What a graph computes: node counts and FLOPs per op (mul_mat's share, measured on the real graph)."""
from __future__ import annotations

from collections import defaultdict

from .cgraph import CGraph
from .ops import VIEW_OPS
from .tensor import Tensor

ELEMENTWISE_COST = {"SOFT_MAX": 5, "RMS_NORM": 3, "NORM": 5, "ROPE": 6, "SILU": 4, "GELU": 8, "SWIGLU": 5,
                    "GEGLU": 9, "ADD": 1, "MUL": 1, "SCALE": 1}


def flops(t: Tensor) -> int:
    """Floating-point operations of one node (multiply-add = 2)."""
    if t.op == "MUL_MAT":
        a = t.src[0]
        return 2 * a.ne[0] * t.nelements()
    if t.op == "FLASH_ATTN_EXT":
        q, k, v = t.src[:3]
        return 2 * q.ne[1] * q.ne[2] * k.ne[1] * (q.ne[0] + v.ne[0])
    return ELEMENTWISE_COST.get(t.op, 0) * t.nelements()


def op_table(graph: CGraph) -> list[dict]:
    """One row per op: node count, FLOPs, share of all FLOPs, bytes written (sorted by FLOPs)."""
    g = getattr(graph, "gf", graph)
    count, fl, out = defaultdict(int), defaultdict(int), defaultdict(int)
    for n in g.nodes:
        count[n.op] += 1
        fl[n.op] += flops(n)
        if n.op not in VIEW_OPS:
            out[n.op] += n.nbytes()
    total = sum(fl.values()) or 1
    rows = [dict(op=op, nodes=count[op], flops=fl[op], share=fl[op] / total, bytes_out=out[op]) for op in count]
    rows.sort(key=lambda r: (-r["flops"], -r["nodes"]))
    return rows


def format_table(rows: list[dict], cols: list[str] | None = None) -> str:
    """Plain-text table of dict rows (for printing in notebooks and the CLI)."""
    if not rows:
        return "(empty)"
    cols = cols or list(rows[0])

    def fmt(v):
        if isinstance(v, float):
            return f"{100 * v:.2f}%" if v <= 1 else f"{v:.3g}"
        if isinstance(v, int) and v >= 10_000:
            return f"{v:,}"
        return str(v)
    cells = [[fmt(r[c]) for c in cols] for r in rows]
    w = [max(len(c), *(len(x[i]) for x in cells)) for i, c in enumerate(cols)]
    lines = ["  ".join(c.ljust(w[i]) for i, c in enumerate(cols)), "  ".join("-" * x for x in w)]
    lines += ["  ".join(x[i].ljust(w[i]) for i in range(len(cols))) for x in cells]
    return "\n".join(lines)
