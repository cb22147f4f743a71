"""llama_context in small: KV store, micro-batches, one graph per micro-batch, logits out.

``decode(batch)`` splits the batch into micro-batches of ``n_ubatch`` tokens,
finds room in the KV cache, builds the architecture's graph for that micro-batch,
fills its inputs (tokens, positions, masks, output ids), runs it (on the CPU
backend, or through a scheduler) and keeps the logits of the requested tokens.

The KV store here is deliberately simple (contiguous cells, one sequence id per
cell); ``llmlab.kv_cache`` is the full cell manager.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from .. import LLMLabError
from ..graph import get_builder
from ..graph.executor import compute as compute_graph
from ..graph.llm_graph import KVView
from ..graph.tensor import Tensor
from ..types import ggml_type
from .model import Model


@dataclass
class Batch:
    """llama_batch: tokens with their positions, sequence ids and whether their logits are wanted."""
    tokens: np.ndarray
    pos: np.ndarray
    seq_id: np.ndarray
    logits: np.ndarray

    @classmethod
    def from_tokens(cls, tokens, pos0: int = 0, seq_id: int = 0, all_logits: bool = True) -> "Batch":
        t = np.asarray(tokens, dtype=np.int32).reshape(-1)
        n = len(t)
        want = np.ones(n, bool) if all_logits else np.arange(n) == n - 1
        return cls(t, np.arange(pos0, pos0 + n, dtype=np.int32), np.full(n, seq_id, np.int32), want)

    def __len__(self) -> int:
        return len(self.tokens)


class SimpleKV:
    """Contiguous K and V per layer (f16 by default), V stored transposed unless flash attention."""

    def __init__(self, model: Model, n_ctx: int, type_k="f16", type_v="f16", v_trans: bool = True):
        hp = model.hparams
        self.size = n_ctx
        self.v_trans = v_trans
        self.pos = np.full(n_ctx, -1, np.int32)         # -1: empty cell
        self.seq = np.full(n_ctx, -1, np.int32)
        self.head = 0
        tk, tv = ggml_type(type_k), ggml_type(type_v)
        self.k_l, self.v_l = [], []
        for il in range(hp.n_layer):
            k = Tensor(tk, (hp.n_embd_k_gqa, n_ctx), name=f"cache_k_l{il}")
            v = Tensor(tv, (n_ctx, hp.n_embd_v_gqa) if v_trans else (hp.n_embd_v_gqa, n_ctx), name=f"cache_v_l{il}")
            k.data = np.zeros(k.nbytes(), np.uint8)
            v.data = np.zeros(v.nbytes(), np.uint8)
            k.backend = v.backend = "CPU"
            self.k_l.append(k)
            self.v_l.append(v)

    def nbytes(self) -> int:
        return sum(t.nbytes() for t in self.k_l + self.v_l)

    def find_slot(self, n: int) -> int:
        if self.head + n > self.size:
            raise LLMLabError(f"context is full: {self.head} cells used, {n} more needed, n_ctx={self.size}")
        return self.head

    def clear(self) -> None:
        self.pos[:] = -1
        self.seq[:] = -1
        self.head = 0

    def seq_rm(self, seq_id: int, p0: int = 0, p1: int | None = None) -> None:
        hit = (self.seq == seq_id) & (self.pos >= p0) & ((self.pos < p1) if p1 is not None else True)
        self.pos[hit] = -1
        self.seq[hit] = -1
        used = np.nonzero(self.pos >= 0)[0]
        self.head = int(used[-1]) + 1 if len(used) else 0


KV_PAD = 32      # cells read per step are a multiple of this (so the f16 products run in whole 16-lane steps)
CTX_PAD = 256


class Context:
    """Per-session state over a shared Model: KV cache, batch sizes, logits, optional scheduler."""

    def __init__(self, model: Model, n_ctx: int = 512, n_batch: int = 512, n_ubatch: int = 512,
                 flash_attn: bool = False, type_k: str = "f16", type_v: str = "f16", sched=None):
        if n_ctx <= 0 or n_ubatch <= 0 or n_batch <= 0:
            raise ValueError("n_ctx, n_batch and n_ubatch must be positive")
        self.model = model
        n_ctx = -(-n_ctx // CTX_PAD) * CTX_PAD          # llama.cpp pads the context (llama_kv_cache::get_padding)
        self.n_ctx, self.n_batch, self.n_ubatch = n_ctx, n_batch, min(n_ubatch, n_batch)
        self.flash_attn = flash_attn
        self.kv = SimpleKV(model, n_ctx, type_k, type_v, v_trans=not flash_attn)
        self.builder = get_builder(model.arch)
        self.sched = sched
        self.last_graph = None            # the LLMGraph of the last micro-batch (for inspection)
        self.captured: dict[str, np.ndarray] = {}

    # ---- masks (llm_graph_input_attn_kv::set_input)
    def _mask(self, batch: Batch, sl: slice, n_kv: int, swa: int) -> np.ndarray:
        kv = self.kv
        cpos, cseq = kv.pos[:n_kv], kv.seq[:n_kv]
        qpos, qseq = batch.pos[sl][:, None], batch.seq_id[sl][:, None]
        ok = (cpos[None, :] >= 0) & (cseq[None, :] == qseq) & (cpos[None, :] <= qpos)
        if swa:
            ok &= (qpos - cpos[None, :]) < swa
        return np.where(ok, np.float32(0), np.float32(-np.inf)).astype(np.float32)

    def decode(self, batch: Batch, capture=None, replace=None, callback=None) -> np.ndarray:
        """Run the batch; returns logits [n_wanted, n_vocab] for the tokens whose ``logits`` flag is set."""
        n = len(batch)
        if n == 0:
            raise ValueError("decode: empty batch")
        if n > self.n_batch:
            raise ValueError(f"decode: batch of {n} tokens exceeds n_batch={self.n_batch}")
        hp = self.model.hparams
        if batch.tokens.min() < 0 or batch.tokens.max() >= hp.n_vocab:
            raise ValueError(f"decode: token id out of range 0..{hp.n_vocab - 1}")
        out = []
        self.captured = {}
        for s in range(0, n, self.n_ubatch):
            sl = slice(s, min(n, s + self.n_ubatch))
            out.append(self._decode_ubatch(batch, sl, capture, replace, callback))
        return np.concatenate(out, 0)

    def _decode_ubatch(self, batch: Batch, sl: slice, capture, replace, callback) -> np.ndarray:
        kv, hp = self.kv, self.model.hparams
        n_tokens = sl.stop - sl.start
        head = kv.find_slot(n_tokens)
        kv.pos[head:head + n_tokens] = batch.pos[sl]
        kv.seq[head:head + n_tokens] = batch.seq_id[sl]
        kv.head = head + n_tokens
        n_kv = min(kv.size, -(-kv.head // KV_PAD) * KV_PAD)
        out_ids = np.nonzero(batch.logits[sl])[0].astype(np.int32)
        if len(out_ids) == 0:
            out_ids = np.array([n_tokens - 1], np.int32)   # the graph needs one output row; it is dropped below
            keep = False
        else:
            keep = True
        view = KVView(kv.k_l, kv.v_l, head, n_kv, kv.size, kv.v_trans)
        g = self.builder(self.model, n_tokens, len(out_ids), view, flash_attn=self.flash_attn)
        inp = g.inputs
        inp["inp_tokens"].set_data(batch.tokens[sl])
        inp["inp_pos"].set_data(batch.pos[sl])
        inp["inp_out_ids"].set_data(out_ids)
        inp["kq_mask"].set_data(self._mask(batch, sl, n_kv, 0))
        if "kq_mask_swa" in inp:
            inp["kq_mask_swa"].set_data(self._mask(batch, sl, n_kv, hp.n_swa))
        self.last_graph = g
        if self.sched is not None:
            got = self.sched.compute(g, capture=capture, replace=replace, callback=callback)
        else:
            got = compute_graph(g.gf, capture=capture, replace=replace, callback=callback)
        self.captured.update(got)
        logits = g.t_logits.numpy().reshape(len(out_ids), hp.n_vocab)
        return logits if keep else logits[:0]

    def build_graph(self, n_tokens: int, n_outputs: int | None = None, n_kv: int | None = None):
        """The graph a micro-batch of ``n_tokens`` would run (nothing is computed, inputs are left empty)."""
        n_kv = n_kv or min(self.kv.size, -(-(self.kv.head + n_tokens) // KV_PAD) * KV_PAD)
        view = KVView(self.kv.k_l, self.kv.v_l, self.kv.head, n_kv, self.kv.size, self.kv.v_trans)
        return self.builder(self.model, n_tokens, n_outputs or n_tokens, view, flash_attn=self.flash_attn)

    def clear(self) -> None:
        self.kv.clear()
