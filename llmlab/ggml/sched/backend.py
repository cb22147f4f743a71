"""Backends behind one small interface, as ggml_backend_i / ggml_backend_device_i.

- ``name``, ``buffer_type`` (where its tensors live), ``supports_op(node)``,
  ``supports_buft(buft)``, ``offload_op(node)`` (would it like to take an op whose
  weights sit in host memory?), ``compute(nodes)`` (ggml_backend_graph_compute).
- ``CPUBackend``: the real one, on its kernel set (``fast`` or ``reference``) and CPU profile.
  Before its plain op switch it asks its registered
  extra buffer types (``llmlab.ggml.cpu.traits``: llama.cpp's REPACK, AMX, KleidiAI, SpacemiT IME)
  whether they take the node (``ggml_cpu_extra_compute_forward``).
- ``AccelBackend``: a simulated accelerator. It runs the same NumPy code but owns a
  separate buffer type, so every input living elsewhere must be copied in, and
  only the ops in ``supported_ops`` run there.
- ``llmlab.ggml.rpc_backend.RPCBackend``: a device of llama.cpp's rpc-server, a real memory of its own: it fills
  the memory hooks (``load``, ``alloc_graph``, ``get_tensor``, ``set_tensor``) that host backends leave
  as plain NumPy.
"""
from __future__ import annotations

from typing import Iterable

import numpy as np

from ..cgraph import CGraph
from ..cpu.cplan import CPlan, graph_plan
from ..cpu.executor import compute, run_nodes
from ..cpu.ops import COMPUTE
from ..cpu.fast import use_threads
from ..cpu.traits import ExtraBufferType
from ..ops import VIEW_OPS
from ..tensor import Tensor

ALL_OPS = frozenset(COMPUTE)     # every op the CPU backend computes (its op table's keys)
KERNELS = ("fast", "reference")  # the CPU backend's kernel sets


class Backend:
    name = "backend"
    buffer_type = "host"
    cpu = None            # the CPU profile its NumPy kernels reproduce (None: this machine's)

    def supports_op(self, node: Tensor) -> bool:
        return True

    def supports_buft(self, buft: str) -> bool:
        return buft == self.buffer_type

    def offload_op(self, node: Tensor) -> bool:
        return False

    def dispatch(self, node: Tensor) -> bool:
        return False

    def compute(self, nodes: Iterable[Tensor], capture=None, replace=None, callback=None) -> dict:
        return run_nodes(nodes, capture, replace, callback, self.dispatch, self.cpu)

    # memory: host backends share the process's NumPy arrays, so these are plain array operations; a backend
    # with memory of its own (llmlab.ggml.rpc_backend.RPCBackend) overrides them
    def load(self, tensors: list[Tensor], weights: set[int]) -> None:
        """The weights (ids in ``weights``) and KV cache placed on this backend's buffer type, once per model
        (llama_model_load_tensors's buffers): already in place here."""

    def alloc_graph(self, sch, b: int) -> None:
        """Memory for what this backend (index ``b``) computes or receives in ``sch`` (ggml_gallocr): the
        executor allocates as it goes."""

    def get_tensor(self, t: Tensor) -> np.ndarray:
        """``t``'s bytes (ggml_backend_tensor_get)."""
        return np.ndarray((t.nbytes(),), np.uint8, t.root().data, t.view_offs)

    def cpy_tensor(self, src_backend: "Backend", src: Tensor, dst: Tensor) -> bool:
        """Copy ``src`` (on ``src_backend``) into ``dst`` here without going through the host, if this backend
        can (ggml_backend_buffer_copy_tensor); False: the scheduler gets and sets instead."""
        return False

    def set_tensor(self, t: Tensor, raw: np.ndarray) -> None:
        """Fill ``t`` (a copy the scheduler made for a split input) with ``raw`` (ggml_backend_tensor_set)."""
        t.data = raw.copy()

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.name})"


class CPUBackend(Backend):
    """ggml-cpu's backend. ``kernels``: the kernel set a whole graph runs on (:meth:`graph_compute`):
    "fast", the compiled plan (numba twins), or "reference", the NumPy ops; the same bits either way.
    ``cpu``: the profile whose arithmetic both reproduce. The scheduler's splits (:meth:`compute`) run
    node by node through the references, so that copies and plug-ins see every node."""
    name = "CPU"
    buffer_type = "CPU"

    def __init__(self, n_threads: int = 2, extra: list[ExtraBufferType] | None = None, cpu=None,
                 kernels: str = "fast"):
        if kernels not in KERNELS:
            raise ValueError(f"kernels must be one of {', '.join(KERNELS)}, not {kernels!r}")
        self.n_threads = n_threads
        self.cpu = cpu
        self.kernels = kernels
        self.extra: list[ExtraBufferType] = list(extra or [])
        self.plugin_log: list[tuple[str, str]] = []     # (node name, plug-in) for nodes a plug-in computed
        self._plans: list[tuple[CGraph, CPlan]] = []   # the last two graphs' plans (a context keeps a one-token
                                                        # graph and a batch graph), kept while they are reused

    def plan(self, graph: CGraph) -> CPlan:
        """The graph bound to this backend's kernels and its arena (ggml_graph_plan), once per graph."""
        for g, p in self._plans:
            if g is graph:
                return p
        self._plans = self._plans[-1:]      # the plan this one replaces goes first: its arena and cache
        p = graph_plan(graph.nodes, cpu=self.cpu, fast=self.kernels == "fast")   # tiles are not held beside
        self._plans.append((graph, p))                                           # the new ones (peak memory)
        return p

    def graph_compute(self, graph: CGraph, capture=None, replace=None, callback=None, dispatch=None) -> dict:
        """Run a whole graph (ggml_backend_cpu_graph_compute) with the executor's hooks: through its plan, or,
        when a plug-in or ``dispatch`` (``fn(node) -> bool``, asked after the plug-ins) may take nodes, node
        by node through the reference executor."""
        if dispatch is None and not self.extra:
            return self.plan(graph).compute(capture, replace, callback)
        first = self.dispatch if dispatch is None else (lambda node: self.dispatch(node) or dispatch(node))
        return compute(graph, capture, replace, callback, first, self.cpu)

    def set_n_threads(self, n: int) -> None:
        """ggml_backend_cpu_set_n_threads: the threads the next graph runs on (the fast kernels' numba
        threads; the reference ops are NumPy's)."""
        self.n_threads = n
        use_threads(n)

    def register_extra(self, plugin: ExtraBufferType) -> None:
        self.extra.append(plugin)

    def dispatch(self, node: Tensor) -> bool:
        for p in self.extra:                             # plug-ins first, the plain switch as fallback
            if p.supports_op(node):
                p.compute(node)
                self.plugin_log.append((node.name, p.name))
                return True
        return False


class AccelBackend(Backend):
    """A simulated device: same kernels, separate memory, a configurable set of supported ops."""
    buffer_type = "ACCEL"

    def __init__(self, name: str = "ACCEL", supported_ops: Iterable[str] | None = None,
                 offload_min_batch: int | None = 32, cpu=None):
        self.name = name
        self.cpu = cpu
        self.buffer_type = name
        self.supported_ops = frozenset(supported_ops) | VIEW_OPS if supported_ops is not None else ALL_OPS
        self.offload_min_batch = offload_min_batch

    def supports_op(self, node: Tensor) -> bool:
        return node.op in self.supported_ops

    def offload_op(self, node: Tensor) -> bool:
        """Like ggml-cuda: take ops on host weights when the batch is large enough (never GET_ROWS)."""
        if self.offload_min_batch is None or node.op == "GET_ROWS":
            return False
        return node.ne[1] >= self.offload_min_batch


# ggml_backend_i (ggml-backend-impl.h) and ggml_backend_device_i: each member, and what plays its part here
INTERFACE = [
    ("ggml_backend_i", "get_name", "name"),
    ("ggml_backend_i", "graph_compute", "compute(nodes)"),
    ("ggml_backend_i", "set_tensor_async, get_tensor_async, cpy_tensor_async", "set_tensor, get_tensor"),
    ("ggml_backend_i", "synchronize", "(none: compute returns when done)"),
    ("ggml_backend_i", "event_record, event_wait", "(none: splits run one after another)"),
    ("ggml_backend_device_i", "supports_op", "supports_op(node)"),
    ("ggml_backend_device_i", "offload_op", "offload_op(node)"),
    ("ggml_backend_device_i", "get_buffer_type", "buffer_type, supports_buft(buft)"),
    ("ggml_backend_device_i", "get_memory", "(none)"),
]

# llama.cpp's backends and what each accelerates (the walkthrough article's table)
PLATFORMS = [
    ("x86 CPU", "ggml-cpu/arch/x86/", "MUL_MAT", "AVX2 / AVX-512 SIMD, quantized kernels"),
    ("ARM CPU", "ggml-cpu/arch/arm/", "MUL_MAT", "NEON / SVE vector instructions"),
    ("RISC-V CPU (SpacemiT)", "ggml-cpu/spacemit/", "MUL_MAT, NORM, RMS_NORM", "IME matrix extension (q4_0/q4_1/q4_K), RVV"),
    ("NVIDIA GPU", "ggml-cuda/ (61 .cu files)", "MUL_MAT, FLASH_ATTN, ROPE, SOFT_MAX, ... (almost every op)",
     "CUDA kernels, tensor cores, cuBLAS"),
    ("Apple GPU", "ggml-metal/", "MUL_MAT, FLASH_ATTN, ...", "Metal shaders"),
    ("Intel GPU", "ggml-sycl/", "MUL_MAT, ...", "SYCL / oneAPI"),
    ("Huawei NPU", "ggml-cann/", "MUL_MAT, ...", "CANN operator library"),
    ("any GPU", "ggml-vulkan/", "MUL_MAT, ...", "Vulkan compute shaders"),
]

_MEMBER_METHOD = {"get_name": "name", "graph_compute": "compute", "supports_op": "supports_op",
                  "offload_op": "offload_op", "get_buffer_type": "buffer_type",
                  "set_tensor_async, get_tensor_async, cpy_tensor_async": "set_tensor"}


def interface_rows(backends) -> list[list[str]]:
    """One row per interface member: the C member, its llmlab counterpart, and for each backend
    whether it fills the member in itself ("own"), keeps the base class's version ("inherited") or
    has no counterpart ("-")."""
    rows = []
    for struct, member, here in INTERFACE:
        attr = _MEMBER_METHOD.get(member)
        row = [f"{struct}.{member}", here]
        for b in backends:
            if attr is None:
                row.append("-")
            else:
                own = getattr(type(b), attr, None) is not getattr(Backend, attr, None) or attr in vars(b)
                row.append("own" if own else "inherited")
        rows.append(row)
    return rows
