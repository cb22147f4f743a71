"""llama_context in small: the KV cache, micro-batches, one graph per micro-batch, logits out.

``decode(batch)`` validates the batch and cuts it into micro-batches of
``n_ubatch`` tokens (``llmlab.llama.batch``), finds cells for all of them first
(``KVCache.prepare``: a batch that does not fit changes nothing), then, per
micro-batch: places it in the cache, builds the architecture's graph, fills the
graph's inputs (tokens, positions, the cells to write, the KQ masks, the output
rows), runs it (on its CPU backend, or through a scheduler: llama.cpp's
context always hands its graph to ``ggml_backend_sched``) and keeps the
logits of the tokens that asked for them, in batch order.

The K/V data live in the cache's arrays; the graph sees them as ggml tensors
over the same bytes and writes new rows with SET_ROWS, as llama.cpp does.
"""
from __future__ import annotations

import time

import numpy as np

from .batch import Batch, BatchAllocator, UBatch, split_one
from .arch import get_builder
from ..ggml.cpu import profiles
from ..ggml.cpu.fast import threads as fast_threads
from ..ggml.cpu.threadpool import Governor, governor
from ..ggml.sched.backend import CPUBackend
from .graph import KVView
from ..ggml.tensor import Tensor
from .kv_cache import padded_n_ctx
from .kv_cache_iswa import make_kv_cache
from .memory import Memory
from .model import Model
from .validate import check_kv_memory


def _as_tensor(arr: np.ndarray, type_, n_embd: int, name: str) -> Tensor:
    """A cache array (one row per cell) as a ggml tensor [n_embd, n_cells] over the same bytes."""
    t = Tensor(type_, (n_embd, arr.shape[0]), name=name, data=arr.reshape(-1).view(np.uint8))
    t.backend = "CPU"
    return t


_OUT0 = np.zeros(1, np.int32)        # the output row of a one-token micro-batch that wants its logits


def _input_arrays(g) -> dict[str, np.ndarray]:
    """The graph's inputs as flat arrays over their bytes (a KQ mask: 2-D, ``(n_tokens, n_kv)``), made
    once per graph (its inputs' bytes allocated then) and made again if a tensor's bytes were replaced."""
    kept = getattr(g, "_input_arrays", None)
    if kept is not None and all(t.root().data is d for t, d in kept[1]):
        return kept[0]
    arrays, roots = {}, []
    for name, t in g.inputs.items():
        if t.view_src is None and t.data is None:
            t.data = np.zeros(t.nbytes(), np.uint8)
        a = t.array()
        arrays[name] = a.reshape(-1, a.shape[-1]) if name.startswith("kq_mask") else a.reshape(-1)
        roots.append((t, t.root().data))
    g._input_arrays = (arrays, roots)
    return arrays


def device_scheduler(devices, n_layer: int, n_gpu_layers: int | None, tensor_split, cpu, kernels: str):
    """The scheduler of ``Context(devices=...)``: the devices in order, then this CPU, with llama.cpp's
    ``n_gpu_layers`` (None: every layer and the output) and ``tensor_split`` (None: by each device's free
    memory, as llama.cpp). A device is a backend, or "HOST:PORT" for every device of that rpc-server."""
    from ..ggml import rpc_backend
    from ..ggml.sched import Scheduler
    backends = []
    for d in devices:
        backends += rpc_backend.devices(d) if isinstance(d, str) else [d]
    if tensor_split is None:
        free = [b.memory()[0] if hasattr(b, "memory") else 1 for b in backends]
        tensor_split = free if sum(free) > 0 else [1] * len(backends)
    ngl = n_layer + 1 if n_gpu_layers is None or n_gpu_layers < 0 else n_gpu_layers
    return Scheduler(backends + [CPUBackend(cpu=cpu, kernels=kernels)], n_gpu_layers=ngl,
                     tensor_split=list(tensor_split))


class Context:
    """Per-session state over a shared Model: KV cache, batch sizes, logits, optional scheduler."""

    def __init__(self, model: Model, n_ctx: int = 512, n_batch: int = 512, n_ubatch: int = 512,
                 flash_attn: bool = False, type_k: str = "f16", type_v: str = "f16", n_seq_max: int = 1,
                 sched=None, graph_reuse: bool = True, kernels: str = "fast", cpu=None, devices=None,
                 n_gpu_layers: int | None = None, tensor_split: list[float] | None = None):
        for name, v in (("n_ctx", n_ctx), ("n_batch", n_batch), ("n_ubatch", n_ubatch), ("n_seq_max", n_seq_max)):
            if isinstance(v, (bool, np.bool_)) or not isinstance(v, (int, np.integer)):
                raise ValueError(f"{name} must be an integer, not {v!r}")
        if n_ctx <= 0 or n_ubatch <= 0 or n_batch <= 0:
            raise ValueError("n_ctx, n_batch and n_ubatch must be positive")
        hp = model.hparams
        check_kv_memory(hp, n_ctx, type_k, type_v)     # before allocating: a clear error, not a MemoryError
        self.model = model
        # whose arithmetic: a profile, its name, "auto"; by default the model's (llmlab.ggml.cpu.profiles)
        self.cpu = profiles.resolve(cpu if cpu is not None else getattr(model, "cpu", None))
        self.n_ctx = padded_n_ctx(n_ctx)
        self.n_batch, self.n_ubatch = n_batch, min(n_ubatch, n_batch)
        self.n_seq_max = n_seq_max
        self.flash_attn = flash_attn
        swa_layers = [il for il in range(hp.n_layer) if hp.is_swa(il)]
        if model.spec.make_memory is not None:     # the architecture's own memory (deepseek2: the MLA cache)
            self.kv: Memory = model.spec.make_memory(hp, self.n_ctx, type_k, type_v, n_seq_max, self.n_ubatch)
        else:
            self.kv = make_kv_cache(self.n_ctx, hp.n_layer, hp.n_embd_k_gqa, hp.n_embd_v_gqa, swa_layers=swa_layers,
                                    n_swa=hp.n_swa, type_k=type_k, type_v=type_v, n_seq_max=n_seq_max,
                                    n_ubatch=self.n_ubatch)
        self.k_l, self.v_l = [], []
        for il in range(hp.n_layer):
            c = self.kv.layer_cache(il)
            self.k_l.append(_as_tensor(c.k(il, c.size), c.type_k, hp.n_embd_k_gqa, f"cache_k_l{il}"))
            self.v_l.append(_as_tensor(c.v(il, c.size), c.type_v, hp.n_embd_v_gqa, f"cache_v_l{il}")
                            if getattr(c, "has_v", True) else None)     # an MLA cache has no V tensor
        self._swa = [hp.is_swa(il) for il in range(hp.n_layer)]      # which layers slide a window
        self._first = {w: self._swa.index(w) for w in set(self._swa)}  # the first layer of each kind
        # the layer whose cache gives the cells to write and the KQ mask: global layers, then the window's
        self._mask_layers = (("", self._first.get(False, 0)), ("_swa", self._first.get(True)))
        self.builder = get_builder(model.arch)
        self.sched = sched
        self.last_graph = None            # the LLMGraph of the last micro-batch (for inspection)
        self.graph_reuse = graph_reuse    # keep the last graph of each kind and run it again when the shapes repeat
        self._reuse: dict[str, tuple] = {}    # "token" (one-token steps) or "batch" -> (shapes, graph)
        self.n_built = self.n_reused = 0
        self.captured: dict[str, np.ndarray] = {}
        # without a scheduler the graphs run on this CPU backend, on its kernel set ("fast": numba, "reference":
        # NumPy), each graph's plan kept while the graph is reused
        self.backend = CPUBackend(cpu=self.cpu, kernels=kernels)
        self.threadpool: Governor | None = None    # the thread count of each step (made on first use)
        if devices:
            if sched is not None:
                raise ValueError("give either devices or sched, not both")
            self.sched = device_scheduler(devices, hp.n_layer, n_gpu_layers, tensor_split, self.cpu, kernels)
        if graph_reuse and self.sched is None and kernels == "fast":
            self.reserve()

    def reserve(self) -> None:
        """Build and plan now the graph of a one-token step on this empty cache (llama_context's
        graph_reserve, which builds the worst-case graphs when the context is made). A decode step after a
        prompt shorter than the cache's 256-cell padding has the same shapes and reuses it, so the first
        token's step does not pay for building and binding ~650 nodes (tens of ms in Python)."""
        n_kv, swa = self._n_kv()
        g = self.builder(self.model, 1, 1, KVView(self.k_l, self.v_l, n_kv, swa), flash_attn=self.flash_attn)
        for t in g.inputs.values():               # the inputs' bytes, filled by each step (in place)
            if t.view_src is None and t.data is None:
                t.data = np.zeros(t.nbytes(), np.uint8)
        self._reuse["token"] = ((1, 1, tuple(n_kv)), g)
        self.backend.plan(g.gf)

    def _n_kv(self) -> tuple[list[int], list[bool]]:
        """The cells each layer's attention looks at now, and which layers slide a window."""
        kv, swa = self.kv, self._swa
        if len(self._first) > 1:                                   # one cache per kind of layer (global, SWA):
            per = {w: kv.n_kv(il) for w, il in self._first.items()}    # asked once each
            return [per[w] for w in swa], list(swa)
        return [kv.n_kv(0)] * len(swa), list(swa)

    # ---- one micro-batch: place it, build its graph, fill the inputs
    def _graph(self, ub: UBatch, placement):
        kv = self.kv
        kv.apply_ubatch(placement, ub)
        n_kv, swa = self._n_kv()
        out_ids = np.flatnonzero(ub.output).astype(np.int32) if ub.n_tokens > 1 else _OUT0[:int(ub.output[0])]
        key = (ub.n_tokens, len(out_ids), tuple(n_kv))
        kind = "token" if ub.n_tokens == 1 else "batch"
        kept = self._reuse.get(kind)
        if kept is not None and kept[0] == key:
            g = kept[1]                  # same shapes as before: only the inputs change (llama.cpp's can_reuse)
            self.n_reused += 1
        else:
            g = self.builder(self.model, ub.n_tokens, len(out_ids), KVView(self.k_l, self.v_l, n_kv, swa),
                             flash_attn=self.flash_attn)
            if self.graph_reuse:
                self._reuse[kind] = (key, g)
            self.n_built += 1
        inp = _input_arrays(g)          # the inputs' bytes as arrays, written in place (no set_data per step)
        inp["inp_tokens"][:] = ub.tokens
        inp["inp_pos"][:] = ub.pos
        inp["inp_out_ids"][:] = out_ids
        # one k_idxs and one KQ mask for the global layers, another pair for the sliding-window ones
        for sfx, il in self._mask_layers:
            if "kq_mask" + sfx in inp:
                inp["k_idxs" + sfx][:] = kv.k_idxs(placement, il)
                kv.kq_mask(ub, n_kv[il], il=il, out=inp["kq_mask" + sfx])
        return g

    def _ubatches(self, batch: Batch) -> list[UBatch]:
        n = len(batch)
        if n == 0:
            raise ValueError("decode: empty batch")
        if n > self.n_batch:
            raise ValueError(f"decode: batch of {n} tokens exceeds n_batch={self.n_batch}")
        alloc = BatchAllocator(batch, n_vocab=self.model.hparams.n_vocab, n_seq_max=self.n_seq_max, memory=self.kv)
        return alloc.split_all(self.n_ubatch)

    def graph_for(self, batch: Batch):
        """Place the batch's first micro-batch and return its graph with inputs set, without running it."""
        ub = self._ubatches(batch)[0]
        return self._graph(ub, self.kv.prepare([ub])[0])

    def decode(self, batch: Batch, capture=None, replace=None, callback=None, dispatch=None) -> np.ndarray:
        """Run the batch; returns logits [n_outputs, n_vocab] for the tokens whose ``logits`` flag is set,
        in batch order. ``capture``, ``replace``, ``callback`` and ``dispatch`` are the executor's hooks
        (``llmlab.ggml.cpu.executor``); ``dispatch`` needs the CPU backend (no scheduler)."""
        if dispatch is not None and self.sched is not None:
            raise ValueError("decode: dispatch replaces kernels on the plain path; this context runs a scheduler")
        one = split_one(batch, n_vocab=self.model.hparams.n_vocab, n_seq_max=self.n_seq_max,
                        memory=self.kv) if len(batch) == 1 else None     # a decode step: checked on scalars
        ubs = [one] if one is not None else self._ubatches(batch)
        slots = self.kv.prepare(ubs)                # raises ContextFullError and leaves the cache as it was
        state = self.kv.state()
        try:
            return self._decode(ubs, slots, capture, replace, callback, dispatch)
        except BaseException:                       # as llama_decode: a failed batch leaves the cache as it was
            self.kv.restore(state)
            self._reuse.clear()
            raise

    def _decode(self, ubs, slots, capture, replace, callback, dispatch) -> np.ndarray:
        self.captured = {}
        rows, order = [], []
        for ub, slot in zip(ubs, slots):
            wanted = bool(ub.output[0]) if ub.n_tokens == 1 else ub.output.any()
            if not wanted:      # a micro-batch without outputs: its last row is computed and dropped (the K/V
                ub.output = np.zeros_like(ub.output)   # of every row are the same bits whichever rows are output)
                ub.output[-1] = True
            g = self._graph(ub, slot)
            self.last_graph = g
            if self.sched is not None:
                got = self.sched.compute(g, capture=capture, replace=replace, callback=callback)
            else:
                got = self._compute(g.gf, ub.n_tokens, capture=capture, replace=replace, callback=callback,
                                    dispatch=dispatch)
            self.captured.update(got)
            if not wanted:
                continue
            out_ids = np.flatnonzero(ub.output) if ub.n_tokens > 1 else _OUT0
            if self.sched is not None:     # from the backend that computed them (another machine, for RPC)
                logits = np.array(self.sched.get_tensor(g.t_logits).view(np.float32))   # a copy: its buffer is reused
            else:
                logits = g.t_logits.array().copy()       # a copy: the plan writes the next step's there
            rows.append(logits.reshape(len(out_ids), -1))
            order.append(ub.batch_idxs[out_ids])
        if not rows:
            return np.zeros((0, self.model.hparams.n_vocab), np.float32)
        if len(rows) == 1 and (len(order[0]) == 1 or np.all(order[0][1:] > order[0][:-1])):
            return rows[0]                  # one micro-batch in batch order (a decode step): copied once
        logits = np.concatenate(rows, 0)
        return logits[np.argsort(np.concatenate(order), kind="stable")]

    def _compute(self, gf, n_tokens: int, **hooks) -> dict:
        """llama_graph_compute: set the CPU backend's thread count for this step, then run the graph.
        llama.cpp takes n_threads for one token and n_threads_batch for more; llmlab's governor
        (``llmlab.ggml.cpu.threadpool``) chooses among all threads, half and one from the measured step
        times, so that on a busy machine a step does not wait in every parallel region for a thread the
        OS has not scheduled. The bits do not depend on the count."""
        n_max = fast_threads()
        self.threadpool = governor(n_max)
        kind = "token" if n_tokens == 1 else "batch"
        n = self.threadpool.choose(kind)
        self.backend.set_n_threads(n)
        t0 = time.perf_counter()
        try:
            return self.backend.graph_compute(gf, **hooks)
        finally:
            self.threadpool.record(kind, n, time.perf_counter() - t0)
            self.backend.set_n_threads(n_max)

    @property
    def kernels(self) -> str:
        return self.backend.kernels

    def build_graph(self, n_tokens: int):
        """The graph a fresh micro-batch of ``n_tokens`` (sequence 0, all outputs) would run; nothing is
        computed and the cache is left as it was."""
        state = self.kv.state()
        try:
            pos0 = self.kv.seq_pos_max(0) + 1
            return self.graph_for(Batch.from_tokens([0] * n_tokens, pos0=pos0, logits="all"))
        finally:
            self.kv.restore(state)

    def clear(self) -> None:
        self.kv.clear()
