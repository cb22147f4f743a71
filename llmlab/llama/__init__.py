"""A model bound to the graph builders: ``Model`` (weights, hparams) and ``Context`` (decode);
``sampling`` (the sampler chain) and ``chat`` (chat templates) work on their outputs."""
from .batch import Batch
from .context import Context
from .hparams import HParams
from .model import Model, load_hparams

__all__ = ["Batch", "Context", "HParams", "Model", "load_hparams"]
