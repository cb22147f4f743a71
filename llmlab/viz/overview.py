"""Notebook 00's pictures: the pipeline map and the arithmetic intensity of prefill and decode."""
from __future__ import annotations

import html as _html
import shutil

import numpy as np

from .html import HTML, table

STAGES = [  # (node id, label, notebook)
    ("gguf", "GGUF file\nweights + vocabulary", "01"),
    ("text", "prompt text", ""),
    ("tok", "tokenizer\ntext → ids", "02"),
    ("emb", "embedding\nGET_ROWS", "03"),
    ("layers", "N layers\nnorm · attention · FFN", "03 04 05 06"),
    ("kv", "KV cache", "04"),
    ("head", "output norm\nLM head → logits", "08"),
    ("sample", "sampling\nlogits → id", "08"),
    ("detok", "detokenize\nid → text", "02"),
    ("out", "generated text", ""),
]


def pipeline_dot() -> str:
    """Graphviz source of the pipeline: the forward pass left to right, the decode loop dashed."""
    lines = ['digraph pipeline {', 'rankdir=LR; bgcolor="transparent"; nodesep=0.25; ranksep=0.3;',
             'node [shape=box, style="rounded,filled", fontname="Helvetica", fontsize=12, fillcolor="#e8f1f8", color="#555577"];',
             'edge [color="#555555", fontname="Helvetica", fontsize=10];']
    for nid, label, nbs in STAGES:
        extra = f"\\n[{nbs}]" if nbs else ""
        fill = "#fde2a7" if nid == "gguf" else "#d5f0c8" if nid in ("text", "out") else "#e8f1f8"
        lines.append(f'{nid} [label="{label.replace(chr(10), chr(92) + "n")}{extra}", fillcolor="{fill}"];')
    lines += ['text -> tok -> emb -> layers -> head -> sample -> detok -> out;',
              'gguf -> tok [style=dotted, label="vocab"]; gguf -> emb [style=dotted]; gguf -> layers [style=dotted, label="weights"];',
              'layers -> kv [dir=both, label="K, V"];',
              'sample -> emb [style=dashed, color="#cc4444", fontcolor="#cc4444", '
              'label="decode: the new id is the next input", constraint=false];',
              '{rank=same; gguf; text}', '}']
    return "\n".join(lines)


def pipeline_graph() -> HTML:
    """The pipeline as inline SVG scaled to the notebook's width (without Graphviz's ``dot``: a
    one-line message, a simplified static drawing and the Graphviz source)."""
    return dot_html(pipeline_dot())


def dot_html(src: str) -> HTML:
    """Graphviz source as inline SVG scaled to the notebook's width (the simplified drawing without ``dot``)."""
    if shutil.which("dot") is None:
        from ..ggml import graphviz_fallback
        return HTML(graphviz_fallback.html(src) + "<details><summary>Graphviz source</summary><pre>"
                    + _html.escape(src) + "</pre></details>")
    import graphviz
    svg = graphviz.Source(src).pipe(format="svg").decode()
    svg = svg[svg.index("<svg"):]
    svg = svg.replace("<svg ", "<svg style='max-width:100%;height:auto' ", 1)
    return HTML(f"<div style='max-width:100%;overflow-x:auto'>{svg}</div>")


def model_numbers(path) -> dict:
    """Parameters and weight bytes of a GGUF model (the tied LM head counted once, as it is read once)."""
    from ..ggml.gguf import GGUFFile
    with GGUFFile(path) as f:
        params = sum(int(np.prod(t.shape)) for t in f.tensors)
        nbytes = sum(t.nbytes for t in f.tensors)
        name = f.path.name
    return {"name": name, "params": params, "bytes": nbytes, "bits_per_weight": 8 * nbytes / params}


def intensity_rows(path, batches=(1, 8, 64, 512), bandwidth_gb_s: float = 50.0, peak_gflop_s: float = 500.0):
    m = model_numbers(path)
    ridge = peak_gflop_s / bandwidth_gb_s
    rows = []
    for b in batches:
        flops = 2 * m["params"] * b
        intensity = flops / m["bytes"]
        t_mem = m["bytes"] / (bandwidth_gb_s * 1e9)
        t_cpu = flops / (peak_gflop_s * 1e9)
        rows.append({"batch": b, "flops": flops, "intensity": intensity, "t_mem": t_mem, "t_cpu": t_cpu,
                     "bound": "memory" if intensity < ridge else "compute", "tok_s": b / max(t_mem, t_cpu)})
    return m, ridge, rows


def intensity_table(path, batches=(1, 8, 64, 512), bandwidth_gb_s: float = 50.0, peak_gflop_s: float = 500.0) -> HTML:
    """One row per batch size: FLOPs, FLOP per weight byte, the time memory and arithmetic each
    need at least, which one limits, and the tokens/s that limit allows."""
    m, ridge, rows = intensity_rows(path, batches, bandwidth_gb_s, peak_gflop_s)
    head = (f"<p><b>{_html.escape(m['name'])}</b>: {m['params'] / 1e6:.1f} M weights in {m['bytes'] / 1e6:.1f} MB "
            f"({m['bits_per_weight']:.2f} bits each). Assumed machine: {bandwidth_gb_s:g} GB/s memory, "
            f"{peak_gflop_s:g} GFLOP/s peak, so the ridge point is {ridge:.0f} FLOP/byte.</p>")
    body = table(["tokens in the batch", "GFLOP per batch", "FLOP per weight byte", "memory time (ms)",
                  "arithmetic time (ms)", "limited by", "tokens/s at best"],
                 [[r["batch"] if r["batch"] > 1 else "1 (decode)", f"{r['flops'] / 1e9:.2f}", f"{r['intensity']:.1f}",
                   f"{1e3 * r['t_mem']:.2f}", f"{1e3 * r['t_cpu']:.2f}", r["bound"], f"{r['tok_s']:,.0f}"] for r in rows])
    return HTML(head + body.markup)
