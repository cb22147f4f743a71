"""llmlab: how llama.cpp runs a language model, rebuilt layer by layer in Python."""
__version__ = "0.1.0"
# the llama-cpp-python whose llama.cpp llmlab is checked against, bit for bit (the oracle); written only here:
# pyproject.toml and environment.yml pin it, and tests/test_llamacpp_worker.py checks that they agree
LLAMA_CPP_PYTHON = "0.3.36"


class LLMLabError(Exception):
    """An error meant for the user: the CLI prints its message, not a traceback."""


def _guard_numba_environment() -> None:
    """Before any module loads numba: a NUMBA_NUM_THREADS numba would refuse while loading is set aside."""
    from .config import guard_numba_threads
    guard_numba_threads()


_guard_numba_environment()
