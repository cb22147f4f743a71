"""A model bound to the graph builders: ``Model`` (weights, hparams) and ``Context`` (decode)."""
from .context import Batch, Context
from .hparams import HParams, load_hparams
from .model import Model

__all__ = ["Batch", "Context", "HParams", "Model", "load_hparams"]
