"""ggml_backend_sched in Python: backends, n_gpu_layers placement, the five split passes, CPU threads."""
from .backend import ALL_OPS, AccelBackend, Backend, CPUBackend
from .scheduler import Schedule, Scheduler, Split

__all__ = ["ALL_OPS", "AccelBackend", "Backend", "CPUBackend", "Schedule", "Scheduler", "Split"]
