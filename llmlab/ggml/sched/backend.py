"""Backends behind one small interface, as ggml_backend_i / ggml_backend_device_i.

- ``name``, ``buffer_type`` (where its tensors live), ``supports_op(node)``,
  ``supports_buft(buft)``, ``offload_op(node)`` (would it like to take an op whose
  weights sit in host memory?), ``compute(nodes)`` (ggml_backend_graph_compute).
- ``CPUBackend``: the real one. Before its plain op switch it asks its registered
  extra buffer types ("plug-ins": llama.cpp's REPACK, AMX, KleidiAI, SpacemiT IME)
  whether they take the node (``ggml_cpu_extra_compute_forward``).
- ``AccelBackend``: a simulated accelerator. It runs the same NumPy code but owns a
  separate buffer type, so every input living elsewhere must be copied in, and
  only the ops in ``supported_ops`` run there.
"""
from __future__ import annotations

from typing import Iterable

import numpy as np

from ..cpu.ops import COMPUTE
from ..executor import run_nodes
from ..ops import VIEW_OPS
from ..tensor import Tensor

ALL_OPS = frozenset(COMPUTE)     # every op the CPU backend computes (its op table's keys)


class ExtraBufferType:
    """A CPU plug-in (ggml's extra buffer type): claims some weights at load time and the ops that use them."""
    name = "extra"

    def supports_op(self, node: Tensor) -> bool:
        raise NotImplementedError

    def compute(self, node: Tensor) -> None:
        raise NotImplementedError


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

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.name})"


class CPUBackend(Backend):
    name = "CPU"
    buffer_type = "CPU"

    def __init__(self, n_threads: int = 2, extra: list[ExtraBufferType] | None = None, cpu=None):
        self.n_threads = n_threads
        self.cpu = cpu
        self.extra: list[ExtraBufferType] = list(extra or [])
        self.plugin_log: list[tuple[str, str]] = []     # (node name, plug-in) for nodes a plug-in computed

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
