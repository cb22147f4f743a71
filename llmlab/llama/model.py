"""The read-only model: hyperparameters and weights bound by GGUF tensor name (zero-copy).

Weights live in a ``no_alloc`` ggml context: each descriptor's bytes are a view
of the file's mmap, exactly like llama.cpp with mmap on. Every tensor the
architecture needs is checked against the shape ``load_tensors`` expects, so a
wrong file fails here with the tensor's name, not deep inside a matmul.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from .. import LLMLabError
from ..ggml.gguf import GGUFFile
from ..ggml.context import GGMLContext
from ..ggml.tensor import Tensor
from .hparams import HParams, load_hparams


@dataclass
class LayerWeights:
    attn_norm: Tensor
    wq: Tensor
    wk: Tensor
    wv: Tensor
    wo: Tensor
    ffn_norm: Tensor
    ffn_gate: Tensor
    ffn_up: Tensor
    ffn_down: Tensor
    attn_q_norm: Tensor | None = None
    attn_k_norm: Tensor | None = None
    attn_post_norm: Tensor | None = None
    ffn_post_norm: Tensor | None = None


def _layer_spec(hp: HParams):
    """(field, GGUF suffix, expected ne) per layer, as create_tensor() calls in load_tensors."""
    e, hk, hv = hp.n_embd, hp.n_embd_head_k, hp.n_embd_head_v
    spec = [
        ("attn_norm", "attn_norm", (e,)),
        ("wq", "attn_q", (e, hk * hp.n_head)),
        ("wk", "attn_k", (e, hp.n_embd_k_gqa)),
        ("wv", "attn_v", (e, hp.n_embd_v_gqa)),
        ("wo", "attn_output", (hv * hp.n_head, e)),
        ("ffn_norm", "ffn_norm", (e,)),
        ("ffn_gate", "ffn_gate", (e, hp.n_ff)),
        ("ffn_up", "ffn_up", (e, hp.n_ff)),
        ("ffn_down", "ffn_down", (hp.n_ff, e)),
    ]
    if hp.arch == "gemma3":
        spec += [
            ("attn_q_norm", "attn_q_norm", (hk,)),
            ("attn_k_norm", "attn_k_norm", (hk,)),
            ("attn_post_norm", "post_attention_norm", (e,)),
            ("ffn_post_norm", "post_ffw_norm", (e,)),
        ]
    return spec


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
        self.hparams: HParams = load_hparams(self.gguf.kv, n_vocab=emb.shape[1] if emb is not None else None)
        self.arch = self.hparams.arch
        self.ctx = GGMLContext(no_alloc=True, name="weights")
        self.weights: dict[str, Tensor] = {}
        hp = self.hparams
        self.tok_embd = self._bind("token_embd.weight", (hp.n_embd, hp.n_vocab))
        self.output_norm = self._bind("output_norm.weight", (hp.n_embd,))
        if "output.weight" in self._info:
            self.output = self._bind("output.weight", (hp.n_embd, hp.n_vocab))
        else:   # tied LM head: a second descriptor over the same bytes (TENSOR_DUPLICATED), placed on its own
            self.output = self.ctx.new(Tensor(self.tok_embd.type, self.tok_embd.ne, name="token_embd.weight",
                                              data=self.tok_embd.data))
            self.output.backend = "CPU"
        self.layers = [LayerWeights(**{f: self._bind(f"blk.{il}.{suffix}.weight", ne)
                                       for f, suffix, ne in _layer_spec(hp)})
                       for il in range(hp.n_layer)]

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
