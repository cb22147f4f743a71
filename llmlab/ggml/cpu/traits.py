"""ggml-cpu's extra buffer types (traits.h: ``ggml::cpu::extra_buffer_type``, ``tensor_traits``).

A plug-in of the CPU backend claims some weights at load time (REPACK re-lays them out; AMX,
KleidiAI and SpacemiT IME do the same for their units) and computes the ops that read them:
``ggml_cpu_extra_compute_forward`` asks each registered one before the plain op switch.
"""
from __future__ import annotations

from ..tensor import Tensor


class ExtraBufferType:
    """A CPU plug-in (ggml's extra buffer type): claims some weights at load time and the ops that use them."""
    name = "extra"

    def supports_op(self, node: Tensor) -> bool:
        raise NotImplementedError

    def compute(self, node: Tensor) -> None:
        raise NotImplementedError
