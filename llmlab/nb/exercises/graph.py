"""Checkers of notebook 06_cgraph_and_scheduler: the scheduler's splits, a MUL_MAT's FLOPs, a SET_TENSOR's bytes."""
from __future__ import annotations

from .verdict import Verdict, needs_answer


def _splits_of(ctx, n_gpu_layers: int, n_tokens: int = 8):
    from ...ggml.sched import AccelBackend, CPUBackend, Scheduler
    sch = Scheduler([AccelBackend(), CPUBackend()], n_gpu_layers=n_gpu_layers).schedule(ctx.build_graph(n_tokens))
    return [r["backend"] for r in sch.summary()], sch


@needs_answer("answer")
def check_splits(ctx, n_gpu_layers: int, answer, n_tokens: int = 8) -> Verdict:
    """The backend of each split, in order, when the scheduler places ``ctx``'s graph for ``n_gpu_layers``."""
    want, _ = _splits_of(ctx, n_gpu_layers, n_tokens)
    got = [str(a).upper() for a in answer]
    if got == want:
        return Verdict.correct(f"{len(want)} splits: {' -> '.join(want)}")
    if got and got[0] != want[0]:
        return Verdict.not_yet(f"{got}", "where does token_embd live? the embedding lookup follows its weight")
    if len(got) > len(want):
        return Verdict.not_yet(f"{got}", "llama.cpp offloads the last n_gpu_layers layers, the output layer "
                               "included: does the run ever come back to the CPU?")
    return Verdict.not_yet(f"{got}", "a split ends wherever the backend changes, and two neighbouring splits "
                           "never share a backend")


@needs_answer("answer")
def check_first_offloaded(n_layer: int, n_gpu_layers: int, answer) -> Verdict:
    """The first block whose weights ``load_tensors`` puts on the device (llama.cpp's i_gpu_start)."""
    from ...ggml.sched.placement import layer_devices
    slots = layer_devices(n_layer, n_gpu_layers, [1.0])
    want = next((il for il in range(n_layer) if slots[il] is not None), None)
    if answer == want:
        return Verdict.correct(f"blocks {want}-{n_layer - 1} and the output layer on the device")
    if answer == n_layer - n_gpu_layers:
        return Verdict.not_yet(f"{answer}", "the output layer is a layer slot too, the last one")
    if isinstance(answer, int) and answer < n_layer // 2 and n_gpu_layers < n_layer // 2:
        return Verdict.not_yet(f"{answer}", "load_tensors offloads from the end of the model, not from its start")
    return Verdict.not_yet(f"{answer}", "count n_gpu_layers slots back from the last slot (the output layer)")


@needs_answer("answer")
def check_mul_mat_flops(graph, name: str, answer: int) -> Verdict:
    """FLOPs of the MUL_MAT node ``name``: 2 x rows of the weight x its row length x tokens."""
    node = next(t for t in graph.gf.nodes if t.name == name and t.op == "MUL_MAT")
    a, b = node.src
    want = 2 * a.ne[0] * a.ne[1] * b.ne[1] * b.ne[2] * b.ne[3]
    if answer == want:
        return Verdict.correct(f"{want:,} FLOPs")
    hint = ("count a multiply-add as 2 FLOPs" if answer * 2 == want else
            "one multiply-add per weight per token: rows x columns x tokens, times 2")
    return Verdict.not_yet(f"{answer:,}", hint)


@needs_answer("answer")
def check_set_tensor_bytes(n_embd: int, answer: int) -> Verdict:
    """Bytes of the SET_TENSOR message carrying one token's row of ``n_embd`` f32 to an rpc-server: the header,
    the rpc_tensor record, the cache flag, the offset, the data (ggml-rpc.cpp's set_tensor request)."""
    from ...ggml.rpc import RPC_TENSOR
    header, flag_offset, data = 1 + 8, 1 + 8, 4 * n_embd
    want = header + RPC_TENSOR.size + flag_offset + data
    if answer == want:
        return Verdict.correct(f"{want:,} bytes, of which {data:,} are the activations")
    if answer == want - header:
        return Verdict.not_yet(f"{answer:,}", "the message starts with a header: 1 byte of command, 8 of payload size")
    if answer == want - flag_offset:
        return Verdict.not_yet(f"{answer:,}", "after the record come a cache flag (1 byte) and an offset (8 bytes)")
    if answer in (want - data + n_embd, want - data + 2 * n_embd):
        return Verdict.not_yet(f"{answer:,}", "the row is f32: 4 bytes per value")
    return Verdict.not_yet(f"{answer:,}", f"add up 9 (header) + {RPC_TENSOR.size} (record) + 9 (flag, offset) "
                           "+ the data")


@needs_answer("answer")
def check_moe_decode_bytes(model, answer, il: int | None = None) -> Verdict:
    """Bytes one decode step reads from one MoE layer's expert tensors (``ffn_{gate,up,down}_exps``):
    MUL_MAT_ID touches only the ``n_expert_used`` chosen experts' slices, each 1/n_expert of a tensor."""
    hp = model.hparams
    il = next(i for i, L in enumerate(model.layers) if getattr(L, "ffn_up_exps", None) is not None) if il is None else il
    L = model.layers[il]
    total = sum(t.nbytes() for t in (L.ffn_gate_exps, L.ffn_up_exps, L.ffn_down_exps))
    want = total // hp.n_expert * hp.n_expert_used
    try:
        got = int(answer)
    except (TypeError, ValueError):
        return Verdict.not_yet(repr(answer), "a number of bytes")
    if got == want:
        return Verdict.correct(f"{want:,} of the layer's {total:,} expert bytes ({hp.n_expert_used} of {hp.n_expert} experts)")
    if got == total:
        return Verdict.not_yet(f"{got:,} bytes", "that is every expert: MUL_MAT_ID reads only the chosen ones")
    if got == total // hp.n_expert:
        return Verdict.not_yet(f"{got:,} bytes", f"one expert's share; a token goes through {hp.n_expert_used}")
    return Verdict.not_yet(f"{got:,} bytes", "the three expert tensors' bytes / n_expert x n_expert_used")


@needs_answer("my_spec")
def check_added_arch(my_spec, path, builtin, tokens=(1, 5, 9, 13, 17, 21)) -> Verdict:
    """A learner's spec of an architecture (``my_spec``, registered under the built-in's name for the run):
    the model at ``path`` must give the built-in spec's logits bit for bit; else the first node that differs."""
    import numpy as np

    from ...llama import Batch, Context, Model
    from ...llama.arch import ARCHS, register_arch

    def run(spec):
        saved = ARCHS.get(spec.name)
        register_arch(spec)
        try:
            ctx = Context(Model(path), n_ctx=64)
            seen = []
            out = ctx.decode(Batch.from_tokens(list(tokens), logits="all"),
                             callback=lambda t: seen.append((t.name, t.numpy()) if t.view_src is None else None))
            return out, [s for s in seen if s is not None]
        finally:
            if saved is not None:
                register_arch(saved)

    if getattr(my_spec, "name", None) != builtin.name:
        return Verdict.not_yet(f"name {getattr(my_spec, 'name', None)!r}",
                               f"the spec's name is the file's general.architecture: {builtin.name!r}")
    try:
        got, ours = run(my_spec)
    except Exception as e:   # the learner's spec: report, do not crash the notebook
        return Verdict.not_yet(f"your spec raised {type(e).__name__}: {e}")
    want, theirs = run(builtin)
    if np.array_equal(got, want):
        return Verdict.correct(f"bit for bit the built-in {builtin.name}'s logits ({len(tokens)} positions, "
                               f"{len(theirs)} nodes)")
    names = {}
    for name, v in ours:
        names.setdefault(name, []).append(v)
    for name, v in theirs:
        mine = names.get(name)
        if not mine:
            return Verdict.not_yet(f"no node {name!r}", "the built-in graph has it; which step of qwen3.cpp makes it?")
        m = mine.pop(0)
        if m.shape != v.shape or not np.array_equal(m, v):
            return Verdict.not_yet(f"node {name!r} differs", "the first node whose values are not the built-in's")
    return Verdict.not_yet("logits differ", "compare the graphs node by node")
