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
from .hparams import HParams
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


# ---- llama_model::load_hparams
def _get(kv: dict, key: str, default=None, required=True):
    if key in kv:
        return kv[key]
    if required and default is None:
        raise LLMLabError(f"GGUF metadata is missing {key!r}")
    return default


def _scalar(v, key: str) -> int:
    if isinstance(v, (list, tuple)) or hasattr(v, "__len__") and not isinstance(v, str):
        vals = set(int(x) for x in v)
        if len(vals) != 1:
            raise LLMLabError(f"{key}: per-layer values {sorted(vals)} are not supported")
        return vals.pop()
    return int(v)


def load_hparams(kv: dict, n_vocab: int | None = None) -> HParams:
    """llama_model::load_hparams: the keys every architecture shares, then what its spec adds (the facts
    llama.cpp hard-codes for it, its own branch of the function)."""
    kv = Metadata.of(kv)   # every key read below is type- and range-checked (llmlab.ggml.gguf.meta)
    arch = kv.get("general.architecture")
    if arch is None:
        raise LLMLabError("GGUF metadata has no general.architecture")
    spec = get_arch(arch)
    a = arch + "."
    n_embd = int(_get(kv, a + "embedding_length"))
    n_head = _scalar(_get(kv, a + "attention.head_count"), a + "attention.head_count")
    n_head_kv = _scalar(kv.get(a + "attention.head_count_kv", n_head), a + "attention.head_count_kv")
    if n_head <= 0 or n_head_kv <= 0 or n_head % n_head_kv:
        raise LLMLabError(f"{arch}: head_count {n_head} is not a multiple of head_count_kv {n_head_kv}")
    head_k = int(kv.get(a + "attention.key_length", n_embd // n_head))
    head_v = int(kv.get(a + "attention.value_length", n_embd // n_head))
    if n_vocab is None:
        n_vocab = int(kv.get(a + "vocab_size", 0)) or len(kv.get("tokenizer.ggml.tokens", []))
    hp = HParams(
        arch=arch, n_vocab=n_vocab,
        n_ctx_train=int(_get(kv, a + "context_length")),
        n_embd=n_embd, n_layer=int(_get(kv, a + "block_count")),
        n_ff=_scalar(_get(kv, a + "feed_forward_length"), a + "feed_forward_length"),
        n_head=n_head, n_head_kv=n_head_kv, n_embd_head_k=head_k, n_embd_head_v=head_v,
        n_rot=int(kv.get(a + "rope.dimension_count", head_k)),
        f_norm_rms_eps=float(_get(kv, a + "attention.layer_norm_rms_epsilon")),
        rope_freq_base=float(kv.get(a + "rope.freq_base", 10000.0)),
        rope_freq_scale=1.0 / float(kv.get(a + "rope.scaling.factor", 1.0) or 1.0),
        n_swa=int(kv.get(a + "attention.sliding_window", 0)),
    )
    hp.rope_freq_base_swa = hp.rope_freq_base
    hp.n_expert = int(kv.get(a + "expert_count", 0))
    hp.n_expert_used = _scalar(kv.get(a + "expert_used_count", 0), a + "expert_used_count")
    hp.n_ff_exp = _scalar(kv.get(a + "expert_feed_forward_length", 0), a + "expert_feed_forward_length")
    if hp.n_expert_used > hp.n_expert or (hp.n_expert > 0) != (hp.n_expert_used > 0):
        raise LLMLabError(f"{arch}: expert_used_count {hp.n_expert_used} does not fit expert_count {hp.n_expert}")
    for name, value in spec.hparams.items():       # the facts llama.cpp hard-codes for the architecture
        setattr(hp, name, value)
    if spec.load_hparams is not None:              # the architecture's own branch of load_hparams
        spec.load_hparams(hp, kv)
    return hp
