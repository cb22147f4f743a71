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
