"""An rpc-server's device as a scheduler backend (ggml-rpc.cpp's ``ggml_backend_rpc_*`` buffer, tensor and graph
functions): where weights, KV cache and a graph's tensors live in the server's memory, and how a split becomes
one GRAPH_COMPUTE. What goes over the wire, and the connection that carries it, is :mod:`llmlab.ggml.rpc`.

:class:`RPCBackend` puts a server's device behind llmlab's backend interface, so the scheduler
(``llmlab.ggml.sched``) splits graphs across it like any accelerator.
"""
from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np

from .defs import GGML_MAX_NAME, GGML_MAX_SRC
from .rpc import (_CONNECTIONS, GGML_TENSOR_FLAG_COMPUTE, HASH_THRESHOLD, RPC_TENSOR, SUPPORTED_OPS,
                  RPCError, connect, op_record)
from .sched.backend import Backend
from .tensor import Tensor

_DEVICES: dict[tuple[str, int], "RPCBackend"] = {}


def device(endpoint: str, index: int = 0) -> "RPCBackend":
    """The backend of device ``index`` of the server at ``endpoint``, one per device and connection, so that the
    weights it holds serve every context on it (llama.cpp's buffer types are per endpoint and device too)."""
    b = _DEVICES.get((endpoint, index))
    if b is None or b.conn.sock is None or b.conn is not _CONNECTIONS.get(endpoint):
        b = _DEVICES[(endpoint, index)] = RPCBackend(endpoint, index)
    return b


def devices(endpoint: str) -> list["RPCBackend"]:
    """Every device of the server at ``endpoint`` (what llama.cpp's ``--rpc`` adds)."""
    return [device(endpoint, i) for i in range(connect(endpoint).n_devices)]


def server_profile(cpu=None):
    """The arithmetic of a CPU rpc-server built for this machine: the CPU profile's kernels without CPU_REPACK.
    The server allocates every buffer from its device's default buffer type (rpc_server::alloc_buffer), so no
    weight is repacked there, while llama.cpp's local CPU run repacks q4_0/q4_K/iq4_nl/q8_0 weights: a
    prompt's products of those types round differently through RPC than on the local CPU, in llama.cpp as here."""
    import dataclasses

    from .cpu import profiles
    p = profiles.resolve(cpu)
    return p if not p.repack_types else dataclasses.replace(p, name=f"{p.name}-norepack", repack_types=frozenset())


def _fnv1a(b):
    h = np.uint64(0xcbf29ce484222325)
    p = np.uint64(0x100000001b3)
    for x in b:
        h = (h ^ np.uint64(x)) * p
    return h


_fnv = None


def fnv_hash(data: np.ndarray) -> int:
    """FNV-1a 64 of the bytes (ggml-rpc's fnv_hash, the key of rpc-server's weight cache), compiled on first use:
    it walks every byte of each weight over 10 MiB."""
    global _fnv
    if _fnv is None:
        from numba import njit
        _fnv = njit(_fnv1a)
    return int(_fnv(np.ascontiguousarray(data).view(np.uint8).reshape(-1)))


@dataclass
class _Buffer:
    handle: int
    base: int
    size: int


class RPCBackend(Backend):
    """Device ``device`` of the rpc-server at ``endpoint`` as a scheduler backend (ggml_backend_rpc_init).

    Its buffer type is ``RPC<device>[endpoint]``, as llama.cpp names it. Weights and KV cache placed on it are
    uploaded once (:meth:`load`); each graph gets one compute buffer for everything its splits on this device
    make or receive (:meth:`alloc_graph`, as ggml_gallocr); a split is sent as one GRAPH_COMPUTE, and nothing
    comes back by itself: the scheduler reads (GET_TENSOR) what a later split copies, the context the logits."""

    def __init__(self, endpoint: str, device: int = 0, timeout: float | None = None):
        self.endpoint = endpoint
        self.device = device
        self.conn = connect(endpoint, timeout)
        if device >= self.conn.n_devices:
            raise RPCError(f"rpc-server {endpoint} has {self.conn.n_devices} device(s); there is no device {device}")
        self.name = self.buffer_type = f"RPC{device}[{endpoint}]"
        self.alignment = self.conn.get_alignment(device)
        self.max_size = self.conn.get_max_size(device)
        self.where: dict[object, tuple[int, int]] = {}      # tensor key -> (remote buffer handle, address)
        self.keep: dict[int, Tensor] = {}                   # persistent tensors, kept alive so their id() stays theirs
        self.buffers: list[_Buffer] = []                    # weights and KV cache
        self.compute_buf: _Buffer | None = None
        self._graph_key = None
        self._alloc_sizes: dict[tuple, int] = {}
        self._last_uid = None                               # the split the server holds as its stored graph
        self._uses: dict = {}                               # tensor key -> readers in the graph (ggml's use_counts)
        self.split_log: list[dict] = []                     # per split run: nodes, bytes out/in, round trips

    def supports_op(self, node: Tensor) -> bool:
        return node.op in SUPPORTED_OPS

    def memory(self) -> tuple[int, int]:
        return self.conn.get_device_memory(self.device)

    # ---- where tensors live on the server
    @staticmethod
    def key(t: Tensor):
        """A tensor's identity across the scheduler's per-run node clones (``Tensor.reading`` keeps ``id``)."""
        return ("n", t.id) if t.op != "NONE" and t.id >= 0 else ("t", id(t))

    def _align(self, n: int) -> int:
        return (n + self.alignment - 1) // self.alignment * self.alignment

    def _alloc(self, size: int) -> _Buffer:
        if size > self.max_size:
            raise RPCError(f"{self.name}: a buffer of {size} bytes exceeds the device's maximum of {self.max_size}")
        handle, got = self.conn.alloc_buffer(self.device, size)
        return _Buffer(handle, self.conn.buffer_get_base(handle, got), got)

    def alloc_size(self, t: Tensor) -> int:
        """ggml_backend_rpc_buffer_type_get_alloc_size: the server is asked (once per shape and op) only for
        quantized tensors whose rows are not a multiple of 512 (CUDA pads them) and for ops whose size may
        grow (ggml_op_alloc_size_may_expand); never less than ggml_nbytes."""
        ask = (t.type.is_quantized and t.ne[0] % 512 != 0 and t.view_src is None) or \
            t.op in ("MUL_MAT", "FLASH_ATTN_EXT")
        if not ask:
            return t.nbytes()
        op, params = op_record(t)
        k = (t.type.id, op, tuple(params), t.ne, t.nb)
        if k not in self._alloc_sizes:
            self._alloc_sizes[k] = self.conn.get_alloc_size(self.device, self.record(t),
                                                            [self.record(x) for x in t.src])
        return max(self._alloc_sizes[k], t.nbytes())

    @staticmethod
    def needs_init(t: Tensor) -> bool:
        """ggml_backend_rpc_buffer_init_tensor calls the server only where CUDA pads: the same rule."""
        return t.type.is_quantized and t.ne[0] % 512 != 0 and t.view_src is None

    def address(self, t: Tensor) -> tuple[int, int] | None:
        """(buffer handle, remote data address) of ``t``: a view's is its root's plus the offset."""
        if t.view_src is not None:
            r = self.where.get(self.key(t.view_src))
            return None if r is None else (r[0], r[1] + t.view_offs)
        return self.where.get(self.key(t))

    def record(self, t: Tensor, ids: dict | None = None, use_count: int = 0) -> bytes:
        """serialize_tensor: ``t`` as an rpc_tensor record (ids: tensor key -> the id sent for it)."""
        def rid(x):
            if x is None:
                return 0
            k = self.key(x)
            if ids is None:
                return id(x)
            return ids.setdefault(k, len(ids) + 1)
        loc = self.address(t) or (0, 0)
        op, params = op_record(t)
        for v in t.ne + t.nb:
            if v >= 1 << 32:
                raise RPCError(f"{t.name}: ne/nb {v} does not fit the RPC protocol's 32-bit fields")
        src = [rid(s) for s in t.src] + [0] * (GGML_MAX_SRC - len(t.src))
        flags = t.flags | (GGML_TENSOR_FLAG_COMPUTE if t.op != "NONE" else 0)
        name = t.name.encode("utf-8")[:GGML_MAX_NAME - 1]
        return RPC_TENSOR.pack(rid(t), t.type.id, loc[0], *t.ne, *t.nb, op, *params, flags, *src,
                               rid(t.view_src), t.view_offs if t.view_src is not None else 0, loc[1], name, use_count)

    # ---- the scheduler's hooks
    def load(self, tensors: list[Tensor], weights: set[int]) -> None:
        """Upload the weights placed here (once per device; SET_TENSOR_HASH first above 10 MiB, as llama.cpp)
        and allocate and clear the KV cache placed here."""
        new = [t for t in tensors if id(t) not in self.keep]
        for group, is_weight in (([t for t in new if id(t) in weights], True),
                                 ([t for t in new if id(t) not in weights], False)):
            if not group:
                continue
            offs, total = [], 0
            for t in group:
                offs.append(total)
                total = self._align(total + self.alloc_size(t))
            buf = self._alloc(max(total, self.alignment))
            self.buffers.append(buf)
            if not is_weight:
                self.conn.buffer_clear(buf.handle, 0)      # llama_kv_cache clears its buffers
            for t, o in zip(group, offs):
                self.where[self.key(t)] = (buf.handle, buf.base + o)
                self.keep[id(t)] = t
                if self.needs_init(t):
                    self.conn.init_tensor(self.record(t))
                if is_weight:
                    self._upload(t, self.record(t), hashed=True)

    def _upload(self, t: Tensor, rec: bytes, hashed: bool = False) -> None:
        raw = np.ndarray((t.nbytes(),), np.uint8, t.root().data, t.view_offs)
        cache_flag = 0
        if hashed and raw.nbytes > HASH_THRESHOLD:
            if self.conn.set_tensor_hash(rec, fnv_hash(raw)):
                return
            cache_flag = 1
        self.conn.set_tensor(rec, raw, 0, cache_flag)

    def alloc_graph(self, sch, b: int) -> None:
        """ggml_gallocr for this device: one compute buffer holding every tensor its splits make or receive."""
        if self._graph_key is sch:
            return
        if self.compute_buf is not None:           # the last graph's tensors go
            for k in [k for k, (h, _) in self.where.items() if h == self.compute_buf.handle]:
                del self.where[k]
        need: list[Tensor] = [c for (_, cb), c in sch.copies.items() if cb == b]
        for s in sch.splits:
            if s.backend != b:
                continue
            for n in sch.split_nodes(s):
                if n.view_src is None and n.op != "NONE" and self.key(n) not in self.where:
                    need.append(n)
        offs, total = [], 0
        for t in need:
            offs.append(total)
            total = self._align(total + self.alloc_size(t))
        if self.compute_buf is None or self.compute_buf.size < total:
            if self.compute_buf is not None:
                self.conn.free_buffer(self.compute_buf.handle)    # the server drops its stored graphs too
                self._last_uid = None
            self.compute_buf = self._alloc(max(total, self.alignment))
        for t, o in zip(need, offs):
            self.where[self.key(t)] = (self.compute_buf.handle, self.compute_buf.base + o)
        # use counts over the whole graph, as a split's graph view shares the full graph's (ggml-cpu fuses
        # RMS_NORM + MUL only where the norm has a single reader)
        self._uses = {}
        for n in sch.graph.nodes:
            for s in n.src:
                self._uses[self.key(s)] = self._uses.get(self.key(s), 0) + 1
        self._graph_key = sch

    def set_tensor(self, t: Tensor, raw: np.ndarray) -> None:
        """A split input copied in (ggml_backend_tensor_copy's set half)."""
        if self.address(t) is None:
            raise RPCError(f"{self.name}: no remote memory for {t.name}")
        self.conn.set_tensor(self.record(t), raw)

    def cpy_tensor(self, src_backend: Backend, src: Tensor, dst: Tensor) -> bool:
        """ggml_backend_rpc_buffer_cpy_tensor: between two devices of the same server, COPY_TENSOR copies there."""
        if not isinstance(src_backend, RPCBackend) or src_backend.conn is not self.conn:
            return False
        if src_backend.address(src) is None or self.address(dst) is None:
            return False
        return self.conn.copy_tensor(src_backend.record(src), self.record(dst))

    def get_tensor(self, t: Tensor) -> np.ndarray:
        """A tensor computed here, read back (ggml_backend_tensor_get)."""
        if self.address(t) is None:
            raise RPCError(f"{self.name}: {t.name} has no remote memory")
        return self.conn.get_tensor(self.record(t), t.nbytes())

    def compute(self, nodes, capture=None, replace=None, callback=None) -> dict:
        """One split: its nodes and every tensor they reach, as one GRAPH_COMPUTE; then the outputs back."""
        if replace or callback:
            raise RPCError(f"{self.name}: replace and callback hooks need the nodes in local memory; "
                           "run without an RPC device")
        nodes = list(nodes)
        t0 = time.perf_counter()
        # ggml_backend_rpc_graph_compute: the split this device ran last, again (a reused graph: same nodes, same
        # addresses, new inputs already sent) is GRAPH_RECOMPUTE of the server's stored graph
        uid = (id(self._graph_key), self.key(nodes[0]), len(nodes)) if nodes else None
        if uid is not None and uid == self._last_uid:
            self.conn.graph_recompute(self.device)
            return self._finish(nodes, 0, capture, t0)
        self._last_uid = uid
        ids: dict = {}
        recs: list[bytes] = []
        seen: set = set()
        uses = self._uses

        def add(t: Tensor) -> None:                     # add_tensor: sources first, each tensor once
            k = self.key(t)
            if k in seen:
                return
            seen.add(k)
            for s in t.src:
                add(s)
            if t.view_src is not None:
                add(t.view_src)
            if self.address(t) is None:
                raise RPCError(f"{self.name}: {t.name} ({t.op}) is not in this device's memory")
            recs.append(self.record(t, ids, uses.get(k, 0)))
        for n in nodes:
            add(n)
        node_ids = [ids[self.key(n)] for n in nodes]
        self.conn.graph_compute(self.device, node_ids, recs)
        return self._finish(nodes, len(recs), capture, t0)

    def _finish(self, nodes, n_records: int, capture, t0: float) -> dict:
        got = {}
        for n in nodes:      # nothing comes back by itself: the scheduler and the context read what they need
            if capture is not None and n.name in capture:
                t = n.reading(n.src)                 # the node over the bytes read back, for its numpy view
                t.view_src, t.view_offs, t.data = None, 0, self.get_tensor(n)
                got[n.name] = t.numpy()
        log = self.conn.traffic.log[self.conn.split_mark:]     # its input copies, the graph, its captures
        self.conn.split_mark = len(self.conn.traffic.log)
        self.split_log.append(dict(nodes=len(nodes), records=n_records, phase=self.conn.traffic.phase,
                                   messages=len(log), bytes_out=sum(r[1] for r in log),
                                   bytes_in=sum(r[2] for r in log), round_trips=sum(r[3] for r in log),
                                   seconds=time.perf_counter() - t0))
        return got

    def close(self) -> None:
        """Free this device's buffers on the server (FREE_BUFFER)."""
        if self.conn.sock is None:
            return
        for b in self.buffers + ([self.compute_buf] if self.compute_buf else []):
            self.conn.free_buffer(b.handle)
        self.buffers, self.compute_buf, self.where, self.keep = [], None, {}, {}
        self._graph_key = self._last_uid = None

