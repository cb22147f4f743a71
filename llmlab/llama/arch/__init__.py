"""The architectures llmlab can run, by ``general.architecture`` (llama.cpp's ``llm_arch``)."""
from __future__ import annotations

BUILDERS: dict = {}


def register_builder(arch: str):
    def deco(cls):
        BUILDERS[arch] = cls
        return cls
    return deco


def get_builder(arch: str):
    from . import gemma3, llama  # noqa: F401  (they register themselves)
    try:
        return BUILDERS[arch]
    except KeyError:
        raise ValueError(f"no graph builder for architecture {arch!r} (known: {', '.join(sorted(BUILDERS))})") from None
