"""The ``llama_decode`` call chain of llama.cpp, drawn, with llmlab's counterpart of each step.

Every entry names a function and the file it lives in, in the llama.cpp that llama-cpp-python 0.3.36
vendors; ``tests/test_callchain.py`` checks each name against that source where it is unpacked, and each
llmlab counterpart against llmlab itself.
"""
from __future__ import annotations

import html as _html
import shutil
from dataclasses import dataclass

from .html import HTML


@dataclass(frozen=True)
class Step:
    key: str
    parent: str | None
    function: str          # as it appears in the file
    file: str              # path inside llama.cpp
    does: str
    llmlab: str = ""       # "module:attribute" of llmlab's counterpart, or ""


DECODE_CHAIN: tuple[Step, ...] = (
    Step("api", None, "llama_decode", "src/llama-context.cpp", "public C API: one batch of tokens",
         "llmlab.llama.context:Context.decode"),
    Step("decode", "api", "llama_context::decode", "src/llama-context.cpp",
         "no memory (an encoder-only model)? encode() instead; validate the batch"),
    Step("encode", "decode", "llama_context::encode", "src/llama-context.cpp",
         "encoder pass; keeps its output for cross-attention"),
    Step("balloc", "decode", "balloc->init", "src/llama-context.cpp", "check tokens, positions, sequence ids",
         "llmlab.llama.batch:BatchAllocator"),
    Step("ubatch", "decode", "memory->init_batch", "src/llama-context.cpp",
         "split into micro-batches and find KV slots for all of them", "llmlab.llama.context:Context._ubatches"),
    Step("process", "decode", "llama_context::process_ubatch", "src/llama-context.cpp", "one micro-batch",
         "llmlab.llama.context:Context._decode"),
    Step("apply", "process", "mctx->apply()", "src/llama-context.cpp", "write the slot choice into the KV cache",
         "llmlab.llama.context:Context._graph"),
    Step("reuse", "process", "can_reuse", "src/llama-context.cpp", "same shapes as last step? keep the graph",
         "llmlab.llama.context:Context._graph"),
    Step("build", "process", "llama_model::build_graph", "src/llama-model.cpp", "the architecture's graph builder",
         "llmlab.llama.context:Context._graph"),
    Step("alloc", "process", "ggml_backend_sched_alloc_graph", "ggml/src/ggml-backend.cpp",
         "assign each node a backend, cut splits, allocate"),
    Step("split", "alloc", "ggml_backend_sched_split_graph", "ggml/src/ggml-backend.cpp",
         "backend per node from supports_op and weight buffers", "llmlab.ggml.sched.scheduler:Scheduler.split_graph"),
    Step("inputs", "process", "set_inputs", "src/llama-context.cpp", "tokens, positions, KQ mask into input tensors"),
    Step("gcompute", "process", "llama_context::graph_compute", "src/llama-context.cpp", "thread count, then run",
         "llmlab.llama.context:Context._compute"),
    Step("sched", "gcompute", "ggml_backend_sched_graph_compute_async", "ggml/src/ggml-backend.cpp", "run all splits",
         "llmlab.ggml.sched.scheduler:Scheduler.compute"),
    Step("splits", "sched", "ggml_backend_sched_compute_splits", "ggml/src/ggml-backend.cpp",
         "per split: copy inputs across backends, then compute"),
    Step("bcompute", "splits", "ggml_backend_graph_compute_async", "ggml/src/ggml-backend.cpp",
         "the backend's graph_compute"),
    Step("cuda", "bcompute", "ggml_backend_cuda_graph_compute", "ggml/src/ggml-cuda/ggml-cuda.cu",
         "CUDA: capture or replay a CUDA graph"),
    Step("cudafwd", "cuda", "ggml_cuda_compute_forward", "ggml/src/ggml-cuda/ggml-cuda.cu", "switch on the op"),
    Step("cudamm", "cudafwd", "ggml_cuda_mul_mat", "ggml/src/ggml-cuda/ggml-cuda.cu",
         "MMVF, MMF, MMVQ, MMQ or cuBLAS (notebook 07)", "llmlab.cuda_sim.launch:mul_mat_kernel"),
    Step("cpu", "bcompute", "ggml_backend_cpu_graph_compute", "ggml/src/ggml-cpu/ggml-cpu.cpp",
         "CPU: plan the work buffer, then compute", "llmlab.ggml.sched.backend:CPUBackend.graph_compute"),
    Step("cputhread", "cpu", "ggml_graph_compute_thread", "ggml/src/ggml-cpu/ggml-cpu.c",
         "every thread walks all nodes, barrier after each"),
    Step("cpufwd", "cputhread", "ggml_compute_forward", "ggml/src/ggml-cpu/ggml-cpu.c", "one node"),
    Step("extra", "cpufwd", "ggml_cpu_extra_compute_forward", "ggml/src/ggml-cpu/traits.cpp",
         "plug-ins first: repack, AMX, KleidiAI, SpacemiT IME"),
    Step("ops", "cpufwd", "ggml_compute_forward_mul_mat", "ggml/src/ggml-cpu/ggml-cpu.c",
         "else the standard kernel of the op (notebook 06)"),
    Step("logits", "decode", "extract logits", "src/llama-context.cpp", "copy the output rows back, in batch order"),
)

COLORS = {"src/": "#e8f1f8", "ggml/src/ggml-backend.cpp": "#fde2a7", "ggml/src/ggml-cuda/": "#d5f0c8",
          "ggml/src/ggml-cpu/": "#f6d5cf"}


def _color(file: str) -> str:
    return next(c for prefix, c in sorted(COLORS.items(), key=lambda kv: -len(kv[0])) if file.startswith(prefix))


def subtree(root: str = "api", cut=(), steps=DECODE_CHAIN) -> tuple[Step, ...]:
    """The steps under ``root`` (itself included), without the children of the keys in ``cut``."""
    keep = {root}
    for s in steps:                              # parents come before their children in DECODE_CHAIN
        if s.parent in keep and s.parent not in cut:
            keep.add(s.key)
    return tuple(s for s in steps if s.key in keep)


def chain_dot(steps=DECODE_CHAIN, rankdir: str = "TB") -> str:
    """Graphviz source: one box per step (function, file, what it does, llmlab's counterpart)."""
    keys = {s.key for s in steps}
    lines = ['digraph decode {', f'rankdir={rankdir}; bgcolor="transparent"; nodesep=0.15; ranksep=0.3;',
             'node [shape=box, style="rounded,filled", fontname="Helvetica", fontsize=11, color="#555577"];',
             'edge [color="#555555"];']
    for s in steps:
        label = f"<<b>{_html.escape(s.function)}</b><br/><font point-size='9'>{_html.escape(s.file)}</font>" \
                f"<br/>{_html.escape(s.does)}"
        if s.llmlab:
            label += f"<br/><font point-size='9' color='#225522'>llmlab: {_html.escape(s.llmlab.split(':')[1])}</font>"
        lines.append(f'{s.key} [label={label}>, fillcolor="{_color(s.file)}"];')
    for s in steps:
        if s.parent in keys:
            style = ' [style=dashed, label=" no memory", fontsize=9]' if s.key == "encode" else ""
            lines.append(f"{s.parent} -> {s.key}{style};")
    lines.append("}")
    return "\n".join(lines)


def chain_graph(root: str = "api", cut=(), rankdir: str = "TB") -> HTML:
    """The chain under ``root`` as inline SVG (without Graphviz's ``dot``: an indented list)."""
    steps = subtree(root, cut)
    if shutil.which("dot") is None:
        depth = {}
        rows = []
        for s in steps:
            depth[s.key] = depth[s.parent] + 1 if s.parent in depth else 0
            rows.append(f"{'&nbsp;' * 4 * depth[s.key]}<b>{_html.escape(s.function)}</b> "
                        f"<small>{_html.escape(s.file)}</small>: {_html.escape(s.does)}")
        return HTML("<div>" + "<br>".join(rows) + "</div>")
    import graphviz
    svg = graphviz.Source(chain_dot(steps, rankdir)).pipe(format="svg").decode()
    svg = svg[svg.index("<svg"):]
    svg = svg.replace("<svg ", "<svg style='max-width:100%;height:auto' ", 1)
    return HTML(f"<div style='max-width:100%;overflow-x:auto'>{svg}</div>")
