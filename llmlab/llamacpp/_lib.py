"""llama-cpp-python, imported on first use: llmlab imports without it."""
from __future__ import annotations

from .. import LLAMA_CPP_PYTHON, LLMLabError


def llama_cpp():
    """The ``llama_cpp`` module, or a clear error saying how to install it."""
    try:
        import llama_cpp
    except ImportError as e:
        raise LLMLabError(f"this needs llama-cpp-python (pip install llama-cpp-python=={LLAMA_CPP_PYTHON})") from e
    return llama_cpp
