"""Where notebook 06 imports the executor from; it is ggml-cpu's graph_compute (``llmlab.ggml.cpu.executor``)."""
from .cpu.executor import Hooks, compute, run_nodes

__all__ = ["Hooks", "compute", "run_nodes"]
