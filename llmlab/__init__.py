"""llmlab: how llama.cpp runs a language model, rebuilt layer by layer in Python."""
__version__ = "0.1.0"


class LLMLabError(Exception):
    """An error meant for the user: the CLI prints its message, not a traceback."""
