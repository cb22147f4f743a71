"""The architectures llmlab can run, by ``general.architecture`` (llama.cpp's ``llm_arch``).

One module per architecture holds all of it (hparams, tensors, graph builder, tiny recipe) in an
:class:`~llmlab.llama.arch.spec.ArchSpec`; one line below registers it.
"""
from __future__ import annotations

from .spec import ArchSpec

ARCHS: dict[str, ArchSpec] = {}


def register_arch(spec: ArchSpec) -> ArchSpec:
    """Add (or replace) an architecture; the built-in ones are registered when this package is imported."""
    ARCHS[spec.name] = spec
    return spec


def get_arch(arch: str) -> ArchSpec:
    try:
        return ARCHS[arch]
    except KeyError:
        from ... import LLMLabError
        raise LLMLabError(f"architecture {arch!r} is not supported (known: {', '.join(sorted(ARCHS))})") from None


def get_builder(arch: str) -> type:
    """The graph builder (``llm_build_*``) of an architecture."""
    return get_arch(arch).builder


from . import deepseek2, gemma3, llama, qwen2, qwen3, qwen3moe  # noqa: E402  (the built-in architectures)

register_arch(llama.SPEC)
register_arch(gemma3.SPEC)
register_arch(qwen2.SPEC)
register_arch(qwen3.SPEC)
register_arch(qwen3moe.SPEC)
register_arch(deepseek2.SPEC)
