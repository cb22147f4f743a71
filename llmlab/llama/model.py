"""The read-only model: hyperparameters and weights bound by GGUF tensor name (zero-copy).

Weights live in a ``no_alloc`` ggml context: each descriptor's bytes are a view
of the file's mmap, exactly like llama.cpp with mmap on. Which tensors an
architecture needs, under which names and with which shapes, is its spec's
tensor table (``llmlab.llama.arch``); every one is checked against the shape
``load_tensors`` expects, so a wrong file fails here with the tensor's name,
not deep inside a matmul.
"""
from __future__ import annotations

from pathlib import Path

from .. import LLMLabError
from ..ggml.gguf import GGUFFile, Metadata
from ..ggml.context import GGMLContext
from ..ggml.tensor import Tensor
from .arch import get_arch
from .arch.spec import ArchSpec, TensorSpec
from .hparams import HParams, load_hparams
from .validate import validate_model


class LayerWeights:
    """One layer's weights (``llama_layer``): one attribute per row of the architecture's layer table
    (``L.wq``, ``L.attn_norm``, ...); an optional tensor the file does not have is None."""

    def __init__(self, **tensors: Tensor | None):
        self.__dict__.update(tensors)

    def __repr__(self) -> str:
        have = [k for k, v in vars(self).items() if v is not None]
        return f"LayerWeights({', '.join(have)})"


class Model:
    """llama_model: hparams, weights bound by name, shared by any number of contexts."""

    def __init__(self, path: str | Path, cpu=None):
        from ..ggml.cpu import profiles
        self.path = Path(path)
        # the CPU whose llama.cpp build to reproduce (which weights REPACK takes, lane counts):
        # a profile, its name, or None/"auto" for this machine's; contexts default to it
        self.cpu = profiles.resolve(cpu)
        self.gguf = GGUFFile(self.path)
        self._info = {t.name: t for t in self.gguf.tensors}
        emb = self._info.get("token_embd.weight")
        n_vocab = emb.shape[1] if emb is not None and len(emb.shape) >= 2 else None
        self.hparams: HParams = load_hparams(Metadata.of(self.gguf), n_vocab=n_vocab)
        self.arch = self.hparams.arch
        self.spec: ArchSpec = get_arch(self.arch)
        self.ctx = GGMLContext(no_alloc=True, name="weights")
        self.weights: dict[str, Tensor] = {}
        for ts in self.spec.model_tensors:
            setattr(self, ts.attr, self._create(ts))
        if self.output is None:   # tied LM head: a second descriptor over the same bytes (TENSOR_DUPLICATED), placed on its own
            self.output = self.ctx.new(Tensor(self.tok_embd.type, self.tok_embd.ne, name="token_embd.weight",
                                              data=self.tok_embd.data))
            self.output.backend = "CPU"
        self.layers = [LayerWeights(**{ts.attr: self._create(ts, il) for ts in self.spec.layer_tensors})
                       for il in range(self.hparams.n_layer)]
        validate_model(self)   # before any compute: layout, hparams, unused tensors, weight types (llama.validate)

    def _create(self, ts: TensorSpec, il: int | None = None) -> Tensor | None:
        """create_tensor: bind one row of the spec's table (None for an absent optional tensor)."""
        name = ts.gguf_name(il)
        if not ts.present(self.hparams, il) or ts.optional and name not in self._info:
            return None
        return self._bind(name, ts.shape(self.hparams))

    def _bind(self, name: str, ne: tuple[int, ...]) -> Tensor:
        info = self._info.get(name)
        if info is None:
            raise LLMLabError(f"{self.path.name}: missing tensor {name!r} (expected shape {list(ne)}) for {self.hparams.arch}")
        shape = tuple(int(x) for x in info.shape)
        if shape + (1,) * (4 - len(shape)) != tuple(ne) + (1,) * (4 - len(ne)):
            raise LLMLabError(f"{self.path.name}: tensor {name!r} has shape {list(shape)}, expected {list(ne)}")
        t = Tensor(info.type, shape, name=name, data=info.data)
        if t.nbytes() != info.data.nbytes:
            raise LLMLabError(f"{self.path.name}: tensor {name!r} has {info.data.nbytes} bytes, expected {t.nbytes()}")
        t.backend = "CPU"
        self.weights[name] = self.ctx.new(t)
        return t

    def unused_tensors(self) -> list[str]:
        """Tensors of the file that no row of the architecture's table binds (llama.cpp refuses such a file:
        "wrong number of tensors")."""
        return [name for name in self._info if name not in self.weights]

    def tensor(self, name: str) -> Tensor:
        try:
            return self.weights[name]
        except KeyError:
            raise LLMLabError(f"model has no tensor {name!r}") from None

    def n_params(self) -> int:
        return sum(t.nelements() for t in self.weights.values())

    def __repr__(self) -> str:
        hp = self.hparams
        return (f"Model({self.path.name}: {hp.arch}, {hp.n_layer} layers, n_embd {hp.n_embd}, "
                f"{hp.n_head}/{hp.n_head_kv} heads of {hp.n_embd_head_k}, vocab {hp.n_vocab})")
