"""One launch of ``mul_mat_vec_q``, every thread of the grid at once.

The kernel, in four steps (mmvq.cu):

1. each thread ``tid = 32 * warp + lane`` of a CUDA block walks the K loop: weight block
   ``kbx = tid / (qi/vdr) + it * blocks_per_iter`` of each of its ``rows_per_block`` rows, word ``kqs = vdr * (tid % (qi/vdr))``
   inside it, and adds ``vec_dot(...)`` for every activation column into a register ``tmp[j][i]``;
2. warps 1..nwarps-1 write their registers to shared memory (``nwarps - 1`` slots: warp 0 keeps its own);
   after ``__syncthreads`` they exit and warp 0 adds the slots, lane by lane;
3. a butterfly of ``__shfl_xor_sync`` (offsets 16, 8, 4, 2, 1) sums the 32 lanes;
4. lane ``i`` writes row ``row0 + i`` (after the optional fused bias and gate/GLU epilogue).

:func:`simulate` runs this with numpy arrays indexed ``(block, column, row, warp, lane)``: one numpy
operation plays one instruction for the whole grid, and every intermediate is kept in a :class:`Launch`.
Float arithmetic is float32 and in the kernel's order.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from . import _ggml as G
from .dp4a import Memory
from .launch import WARP_SIZE, arch_of, launch_params
from .q8_1 import QK8_1, quantize_q8_1
from .vecdotq import Q8_1_SIZE, cuda_type

F32 = np.float32
USES_S = ("q4_0", "q4_1", "q5_0", "q5_1")     # types whose offset or min term the kernel takes from q8_1's s


def silu(x):
    """``ggml_cuda_op_silu_single``: x / (1 + exp(-x))."""
    with np.errstate(over="ignore"):
        return x / (F32(1) + np.exp(-x))


def gelu(x):
    """``ggml_cuda_op_gelu_single``: the tanh approximation."""
    return F32(0.5) * x * (F32(1) + np.tanh(F32(0.7978845608028654) * x * (F32(1) + F32(0.044715) * x * x)))


GLU_OPS = {"swiglu": silu, "geglu": gelu, "mul": lambda g: g}


@dataclass
class Launch:
    """Everything one simulated launch did. Arrays of the grid are indexed (block, column, row, warp, lane)."""
    params: dict
    kbx: np.ndarray          # (iters, nwarps, 32): weight block each thread reads per trip (may be >= blocks_per_row: idle)
    kqs: np.ndarray          # (nwarps, 32): its first word inside the block
    active: np.ndarray       # (iters, nwarps, 32): kbx < blocks_per_row
    ints: np.ndarray         # (iters, blocks, cols, rows, nwarps, 32, n): the dp4a accumulators of each vec_dot call (0 if idle)
    partial: np.ndarray      # (blocks, cols, rows, nwarps, 32): float32 registers tmp[j][i] after the K loop
    shared: np.ndarray       # (blocks, nwarps-1, cols, rows, 32): tmp_shared as warps 1.. wrote it
    warp0: np.ndarray        # (blocks, cols, rows, 32): warp 0's registers after adding the shared slots
    shuffle: list            # [(offset, (blocks, cols, rows, 32))]: warp 0 after each butterfly step
    dst: np.ndarray          # (cols, nrows) float32: what lane i wrote for row0 + i
    gate: "Launch | None" = None
    reads: list | None = field(default=None, repr=False)   # per trip: the Read records of that trip

    def thread_reads(self, block: int, warp: int, lane: int, column: int = 0, row: int = 0) -> list[tuple[int, str, int, int]]:
        """(trip, memory, byte address, bytes) of every load one thread made (for ``column`` and ``row`` of its block)."""
        if self.reads is None:
            raise ValueError("simulate(..., keep_reads=True) keeps the reads")
        out = []
        for it, reads in enumerate(self.reads):
            if not self.active[it, warp, lane]:
                continue
            for r in reads:
                a = np.broadcast_to(r.addr, self.partial.shape)[block, column, row, warp, lane]
                out.append((it, r.memory, int(a), r.nbytes))
        return out


def _rows(w_rows, t, nrows_padded) -> tuple[np.ndarray, int, int]:
    w = np.asarray(w_rows)
    if w.dtype != np.uint8 or w.ndim != 2:
        raise ValueError("w_rows: raw quantized rows, a uint8 array (nrows, row_bytes)")
    nrows, row_bytes = w.shape
    if row_bytes % t.bs:
        raise ValueError(f"{t.name}: rows of {row_bytes} bytes are not whole {t.bs}-byte blocks")
    pad = np.zeros((nrows_padded - nrows, row_bytes), np.uint8)     # a block's rows past the end: read, never written
    return np.concatenate([w, pad]), nrows, row_bytes // t.bs * t.qk


def _k_loop(t, p, vx: Memory, vy: Memory, stride_col_y: int, fast_fp16: bool, log):
    """Step 1 for all threads: returns (tmp, ints per trip, reads per trip)."""
    nb, ncols, rows, nwarps = p["grid"][0], p["ncols_dst"], p["rows_per_block"], p["nwarps"]
    tid = np.arange(nwarps * WARP_SIZE).reshape(nwarps, WARP_SIZE)
    kqs = t.vdr * (tid % t.threads_per_block)
    row = (rows * np.arange(nb)[:, None, None, None, None] + np.arange(rows)[None, None, :, None, None])
    col = np.arange(ncols)[None, :, None, None, None]
    tmp = np.zeros((nb, ncols, rows, nwarps, WARP_SIZE), F32)
    ints, reads = [], []
    for it in range(p["iters"]):
        kbx = tid // t.threads_per_block + it * p["blocks_per_iter"]
        active = kbx < p["blocks_per_row"]
        kbx_c = np.minimum(kbx, p["blocks_per_row"] - 1)         # idle threads: computed on a valid block, then dropped
        acc, start = [], len(log) if log is not None else 0
        v = t.vec_dot(vx, vy, row * p["blocks_per_row"] + kbx_c, col * stride_col_y + kbx_c * (t.qk // QK8_1), kqs,
                      fast_fp16=fast_fp16, ints=acc)
        tmp = np.where(active, tmp + v, tmp)
        ints.append(np.where(active[..., None], np.stack([np.broadcast_to(i, tmp.shape) for i in acc], -1), 0).astype(np.int32))
        if log is not None:
            reads.append(log[start:])
    return tmp, np.stack(ints), reads


def simulate(w_rows, type_name, x, ncols_dst: int = 1, arch="generic", *, gate_rows=None, glu: str = "swiglu",
             x_bias=None, gate_bias=None, keep_reads: bool = False) -> Launch:
    """Simulate one ``mul_mat_vec_q`` launch: ``w_rows`` uint8 (nrows, row_bytes), ``x`` float32 (K,) or (ncols_dst, K).

    ``gate_rows`` (same type and shape) turns on the fused FFN epilogue of llama.cpp (one column only):
    ``(W x + x_bias) * glu(G x + gate_bias)`` with ``glu`` one of swiglu, geglu, mul.
    """
    t, a = cuda_type(type_name), arch_of(arch)
    x = np.atleast_2d(np.asarray(x, F32))
    if x.ndim != 2 or x.shape[0] != ncols_dst:
        raise ValueError(f"x must be (K,) for one column or (ncols_dst, K); got {x.shape} with ncols_dst = {ncols_dst}")
    nrows = np.asarray(w_rows).shape[0]
    p = launch_params(t.name, nrows, x.shape[1], ncols_dst, a)
    nrows_padded = p["grid"][0] * p["rows_per_block"]
    w, nrows, k = _rows(w_rows, t, nrows_padded)
    if k != x.shape[1]:
        raise ValueError(f"weights have K = {k}, x has {x.shape[1]}")
    if gate_rows is not None and ncols_dst != 1:
        raise ValueError("llama.cpp fuses the gate only for a single column")

    log = [] if keep_reads else None
    yq = quantize_q8_1(x)
    vy = Memory(yq, "q8_1", log)
    tmp, ints, reads = _k_loop(t, p, Memory(w, "weights", log), vy, yq.shape[1] // Q8_1_SIZE, a.fast_fp16, log)
    launch = _reduce(p, tmp, ints, reads, nrows)
    if gate_rows is not None:
        g, _, _ = _rows(gate_rows, t, nrows_padded)
        glog = [] if keep_reads else None
        gtmp, gints, greads = _k_loop(t, p, Memory(g, "gate", glog), Memory(yq, "q8_1", glog),
                                      yq.shape[1] // Q8_1_SIZE, a.fast_fp16, glog)
        launch.gate = _reduce(p, gtmp, gints, greads, nrows)
        up, gate = launch.dst, launch.gate.dst
        if x_bias is not None:
            up = up + np.asarray(x_bias, F32)
        if gate_bias is not None:
            gate = gate + np.asarray(gate_bias, F32)
        launch.dst = (up * GLU_OPS[glu](gate)).astype(F32)
    elif x_bias is not None:
        launch.dst = (launch.dst + np.asarray(x_bias, F32)).astype(F32)
    return launch


def _reduce(p, tmp, ints, reads, nrows) -> Launch:
    """Steps 2-4: shared memory across warps, the warp shuffle, the write by lane i."""
    nwarps, rows = p["nwarps"], p["rows_per_block"]
    shared = np.moveaxis(tmp[:, :, :, 1:, :], 3, 1)              # warps 1.. -> tmp_shared[warp-1][j][i][lane]
    warp0 = tmp[:, :, :, 0, :]
    for slot in range(nwarps - 1):                               # tmp[j][i] += tmp_shared[l][j][i][lane], l = 0, 1, ..
        warp0 = warp0 + shared[:, slot]
    shuffle, v = [], warp0
    for offset in (16, 8, 4, 2, 1):
        v = v + v[..., np.arange(WARP_SIZE) ^ offset]             # x += __shfl_xor_sync(x, offset)
        shuffle.append((offset, v))
    lane = np.arange(rows)                                       # lane i writes row row0 + i
    dst = v[:, :, lane, lane]                                    # (blocks, cols, rows)
    dst = np.moveaxis(dst, 1, 0).reshape(p["ncols_dst"], -1)[:, :nrows]
    tid = np.arange(nwarps * WARP_SIZE).reshape(nwarps, WARP_SIZE)
    t = cuda_type(p["type"])
    kbx = np.stack([tid // t.threads_per_block + it * p["blocks_per_iter"] for it in range(p["iters"])])
    return Launch(p, kbx, t.vdr * (tid % t.threads_per_block), kbx < p["blocks_per_row"], ints, tmp, shared,
                  warp0, shuffle, dst.astype(F32), reads=reads if reads else None)


def mul_mat_vec_q(w_rows, type_name, x, ncols_dst: int = 1, arch="generic") -> np.ndarray:
    """``W @ x`` the way ggml-cuda's MMVQ computes it: float32 (nrows,) for a 1-D x, else (ncols_dst, nrows)."""
    out = simulate(w_rows, type_name, x, ncols_dst, arch).dst
    return out[0] if np.ndim(x) == 1 else out


# ---------------------------------------------------------------- the reference


def zero_code_values(w_rows, type_name) -> np.ndarray:
    """What each weight decodes to with its code set to 0: the block's offset (q4_0: -8d, q4_1: m, q4_K: -dmin*m)."""
    t = cuda_type(type_name)
    blocks = np.array(np.asarray(w_rows, np.uint8)).reshape(-1).view(G.ggml_type(t.name).layout)
    for name in blocks.dtype.names:
        if name.startswith("q"):                                 # qs, qh, ql: the codes; d, m, dmin, scales stay
            blocks[name] = 0
    return G.dequantize(blocks.view(np.uint8), t.name).reshape(np.shape(w_rows)[0], -1)


def reference(w_rows, type_name, x, *, kernel_s: bool = True) -> np.ndarray:
    """``dequantize(W) @ dequantize(quantize_q8_1(x))`` in float64, (ncols, nrows).

    ``kernel_s``: where the kernel takes a block's offset term from q8_1's ``s`` (the float sum of the
    inputs) instead of ``d * sum(q)``, do the same, so only float32 rounding separates it from the kernel.
    """
    t = cuda_type(type_name)
    x = np.atleast_2d(np.asarray(x, F32))
    k = x.shape[1]
    w = G.dequantize(np.asarray(w_rows, np.uint8), t.name).reshape(-1, k).astype(np.float64)
    yq = quantize_q8_1(x)
    blocks = yq.reshape(-1).view(G.BLOCK_Q8_1).reshape(len(x), -1)[:, : k // QK8_1]
    y = G.dequantize(blocks.view(np.uint8), "q8_1").reshape(len(x), k).astype(np.float64)
    out = y @ w.T
    if kernel_s and t.name in USES_S:
        offset = zero_code_values(w_rows, t.name).reshape(len(w), -1, QK8_1)[..., 0].astype(np.float64)
        s = blocks["s"].astype(np.float64)
        d_sum_q = blocks["d"].astype(np.float64) * blocks["qs"].sum(-1)
        out += (s - d_sum_q) @ offset.T
    return out
