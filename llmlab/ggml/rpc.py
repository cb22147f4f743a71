"""The client side of ggml's RPC backend (ggml-rpc.cpp, protocol 7.0.0 as vendored by llama-cpp-python 0.3.36).

llama.cpp's ``rpc-server`` (``make rpc-server``) runs a ggml backend on a remote machine. The client keeps
one TCP connection per server; every message is ``| cmd (1 byte) | size (8 bytes) | payload |`` and the
commands that answer send ``| size (8 bytes) | payload |`` back. Tensors travel as ``rpc_tensor``
records (296 bytes: the pointer as id, type, remote buffer, ne, nb, op, op_params, flags, sources,
view source and offset, remote data address, name, use count), and a graph as the records of all its
nodes and their sources. The server runs ggml's own kernels, so a graph made of llama.cpp's ops and
op_params computes llama.cpp's bits.

The server is untrusted input: every reply has a size known before it is read and is checked against
it, every number in it is range-checked, sockets time out, and any failure is one :class:`RPCError`
(an ``LLMLabError``: the CLI prints ``error: ...``). There is no authentication: a server must only
listen on a network you trust (rpc-server binds 127.0.0.1 unless told ``-H``).

:class:`RPCBackend` puts a server's device behind llmlab's backend interface, so the scheduler
(``llmlab.ggml.sched``) splits graphs across it like any accelerator; :class:`Traffic` counts bytes
and round trips per command, per split.
"""
from __future__ import annotations

import socket
import struct
import time
from dataclasses import dataclass, field

import numpy as np

from .. import LLMLabError, config
from .sched.backend import Backend
from .tensor import GGML_MAX_SRC, Tensor
from .defs import GGML_GLU_OP, GGML_MAX_NAME, GGML_MAX_OP_PARAMS, GGML_OP, GGML_OPS, GGML_UNARY_OP  # ggml.h: one home

# ---- ggml-rpc.h / ggml.h of the vendored llama.cpp
RPC_PROTO_MAJOR_VERSION, RPC_PROTO_MINOR_VERSION, RPC_PROTO_PATCH_VERSION = 7, 0, 0
RPC_CONN_CAPS_SIZE = 24                  # transport.h: zeros = plain TCP (no RDMA upgrade)
GGML_TENSOR_FLAG_COMPUTE = 16            # ggml_visit_parents_graph sets it on every node; ggml-cpu skips nodes without it
HASH_THRESHOLD = 10 * 1024 * 1024        # weights above this try SET_TENSOR_HASH first (rpc-server -c keeps a cache)
GGML_PREC_F32 = 10

# enum rpc_cmd
RPC_CMDS = ("ALLOC_BUFFER", "GET_ALIGNMENT", "GET_MAX_SIZE", "BUFFER_GET_BASE", "FREE_BUFFER", "BUFFER_CLEAR",
            "SET_TENSOR", "SET_TENSOR_HASH", "GET_TENSOR", "COPY_TENSOR", "GRAPH_COMPUTE", "GET_DEVICE_MEMORY",
            "INIT_TENSOR", "GET_ALLOC_SIZE", "HELLO", "DEVICE_COUNT", "GRAPH_RECOMPUTE", "MEMSET_TENSOR", "NONE")
CMD = {name: i for i, name in enumerate(RPC_CMDS)}
assert CMD["HELLO"] == 14                # "RPC_CMD_HELLO must be always 14"

# struct rpc_tensor (#pragma pack(1)): note ne and nb are uint32 in this version
RPC_TENSOR = struct.Struct("<QIQ4I4II16iI10QQQQ64si")
assert RPC_TENSOR.size == 296
RPC_TENSOR_FIELDS = (("id", "Q", 1), ("type", "I", 1), ("buffer", "Q", 1), ("ne", "I", 4), ("nb", "I", 4),
                     ("op", "I", 1), ("op_params", "i", 16), ("flags", "i", 1), ("src", "Q", 10),
                     ("view_src", "Q", 1), ("view_offs", "Q", 1), ("data", "Q", 1), ("name", "64s", 1),
                     ("use_count", "i", 1))

def _f(x: float) -> int:
    """A float32's bits as the int32 ggml stores in op_params."""
    return struct.unpack("<i", struct.pack("<f", float(x)))[0]


def _i64(x: int) -> list[int]:
    """A size_t (the view offset) as two int32 words."""
    return list(struct.unpack("<2i", struct.pack("<Q", int(x))))


# llmlab op -> (ggml_op, op_params as ggml.c's constructor writes them): one row per op llmlab builds
OPS: dict[str, tuple[str, object]] = {
    "NONE": ("NONE", lambda p: []),
    "ADD": ("ADD", lambda p: []),
    "MUL": ("MUL", lambda p: []),
    "SCALE": ("SCALE", lambda p: [_f(p["scale"]), _f(p.get("bias", 0.0))]),              # ggml_scale_impl: {s, b}
    "MUL_MAT": ("MUL_MAT", lambda p: []),
    "GET_ROWS": ("GET_ROWS", lambda p: []),
    "RMS_NORM": ("RMS_NORM", lambda p: [_f(p["eps"])]),
    "NORM": ("NORM", lambda p: [_f(p["eps"])]),
    "ROPE": ("ROPE", lambda p: [0, p["n_dims"], p["mode"], 0, p["n_ctx_orig"]] + [_f(p[k]) for k in (   # ggml_rope_impl
        "freq_base", "freq_scale", "ext_factor", "attn_factor", "beta_fast", "beta_slow")] + [0, 0, 0, 0, 0]),
    "SOFT_MAX": ("SOFT_MAX", lambda p: [_f(p["scale"]), _f(p["max_bias"])]),
    "SILU": ("UNARY", lambda p: [GGML_UNARY_OP["SILU"]]),
    "GELU": ("UNARY", lambda p: [GGML_UNARY_OP["GELU"]]),
    "SWIGLU": ("GLU", lambda p: [GGML_GLU_OP["SWIGLU"], int(p.get("swapped", False))]),
    "GEGLU": ("GLU", lambda p: [GGML_GLU_OP["GEGLU"], int(p.get("swapped", False))]),
    "VIEW": ("VIEW", lambda p: _i64(p["offset"])),                                       # ggml_view_impl: size_t offset
    "RESHAPE": ("RESHAPE", lambda p: []),
    "PERMUTE": ("PERMUTE", lambda p: list(p["axes"])),
    "TRANSPOSE": ("TRANSPOSE", lambda p: []),
    "CONT": ("CONT", lambda p: []),
    "CPY": ("CPY", lambda p: []),
    "SET_ROWS": ("SET_ROWS", lambda p: []),
    # llama-graph.cpp's build_attn_mha asks for f32 precision (op_params[3]); ggml-cpu computes the same either way
    "FLASH_ATTN_EXT": ("FLASH_ATTN_EXT", lambda p: [_f(p["scale"]), _f(p["max_bias"]), _f(p["logit_softcap"]),
                                                    GGML_PREC_F32]),
}
SUPPORTED_OPS = frozenset(OPS)


def op_record(t: Tensor) -> tuple[int, list[int]]:
    """(ggml_op, the 16 int32 op_params) of a llmlab node."""
    row = OPS.get(t.op)
    if row is None:
        raise RPCError(f"op {t.op} (node {t.name}) has no ggml-rpc encoding")
    op, params = row
    words = params(t.op_params)
    return GGML_OP[op], words + [0] * (GGML_MAX_OP_PARAMS // 4 - len(words))


class RPCError(LLMLabError):
    """A refused, dropped, slow, mismatched or lying server: one line for the user."""


@dataclass
class Traffic:
    """What went over one connection: per command, messages, bytes out (header included) and in, round trips
    (commands the client waited on); ``log`` keeps one row per message, labelled with ``phase`` (set it, e.g.
    to "prompt" or "token 3", before a decode) for a breakdown by step. A backend's ``split_log`` has one row
    per split it computed: the messages since the connection's previous split (that split's inputs
    going up and the outputs earlier splits left there coming down) and its GRAPH_COMPUTE."""
    calls: dict[str, int] = field(default_factory=dict)
    bytes_out: dict[str, int] = field(default_factory=dict)
    bytes_in: dict[str, int] = field(default_factory=dict)
    round_trips: int = 0
    log: list[tuple[str, int, int, bool, str]] = field(default_factory=list)   # (cmd, out, in, waited, phase)
    phase: str = ""

    def add(self, cmd: str, out: int, got: int, waited: bool) -> None:
        self.calls[cmd] = self.calls.get(cmd, 0) + 1
        self.bytes_out[cmd] = self.bytes_out.get(cmd, 0) + out
        self.bytes_in[cmd] = self.bytes_in.get(cmd, 0) + got
        self.round_trips += waited
        self.log.append((cmd, out, got, waited, self.phase))

    def rows(self, phase: str | None = None) -> list[dict]:
        """One dict per command (optionally only the messages of one phase): calls, bytes out, bytes in, round trips."""
        agg: dict[str, dict] = {}
        for cmd, out, got, waited, ph in self.log:
            if phase is not None and ph != phase:
                continue
            r = agg.setdefault(cmd, dict(command=cmd, calls=0, bytes_out=0, bytes_in=0, round_trips=0))
            r["calls"] += 1
            r["bytes_out"] += out
            r["bytes_in"] += got
            r["round_trips"] += waited
        return list(agg.values())


def parse_endpoint(endpoint: str) -> tuple[str, int]:
    """HOST:PORT as ggml's parse_endpoint reads it (split at the first ':'), with the port checked."""
    host, sep, port = endpoint.partition(":")
    if not sep or not host or not port.isascii() or not port.isdigit() or not 0 < int(port) < 65536:
        raise RPCError(f"bad RPC endpoint {endpoint!r}: expected HOST:PORT")
    return host, int(port)


class RPCConnection:
    """One socket to one rpc-server, after HELLO (ggml's rpc_dispatcher, synchronously). The server serves one
    client at a time, so every device of the endpoint shares this connection (``connect`` keeps one per endpoint)."""

    def __init__(self, endpoint: str, timeout: float | None = None, connect_timeout: float = 10.0):
        self.endpoint = endpoint
        self.host, self.port = parse_endpoint(endpoint)
        self.timeout = config.rpc_timeout() if timeout is None else timeout
        self.traffic = Traffic()
        self.split_mark = 0          # the traffic log's length after the last split computed over this connection
        self.sock: socket.socket | None = None
        try:
            self.sock = socket.create_connection((self.host, self.port), timeout=connect_timeout)
        except ConnectionRefusedError:
            raise RPCError(f"cannot connect to rpc-server {endpoint}: connection refused (is rpc-server running "
                           f"there?)") from None
        except (socket.timeout, TimeoutError):
            raise RPCError(f"cannot connect to rpc-server {endpoint}: no answer within {connect_timeout:g} s") from None
        except OSError as e:
            raise RPCError(f"cannot connect to rpc-server {endpoint}: {e.strerror or e}") from None
        self.sock.settimeout(self.timeout)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.version = self.hello()
        self.n_devices = self.device_count()

    # ---- framing
    def _send(self, cmd: str, payload: bytes | memoryview) -> int:
        head = struct.pack("<BQ", CMD[cmd], len(payload))
        try:
            self.sock.sendall(head)
            self.sock.sendall(payload)
        except (socket.timeout, TimeoutError):
            self._fail(f"rpc-server {self.endpoint} stopped reading ({cmd}, {self.timeout:g} s)")
        except OSError as e:
            self._fail(f"connection to rpc-server {self.endpoint} dropped while sending {cmd} ({e.strerror or e})")
        return len(head) + len(payload)

    def _recv_exact(self, n: int, cmd: str, into: memoryview | None = None) -> bytes | memoryview:
        buf = into if into is not None else memoryview(bytearray(n))
        got = 0
        try:
            while got < n:
                k = self.sock.recv_into(buf[got:], n - got)
                if k == 0:
                    self._fail(f"rpc-server {self.endpoint} closed the connection during {cmd} (it refuses a request "
                               f"it finds invalid, or it crashed)")
                got += k
        except (socket.timeout, TimeoutError):
            busy = " (it serves one client at a time: is another one connected?)" if cmd == "HELLO" else ""
            self._fail(f"no reply from rpc-server {self.endpoint} within {self.timeout:g} s ({cmd}){busy}")
        except OSError as e:
            self._fail(f"connection to rpc-server {self.endpoint} dropped during {cmd} ({e.strerror or e})")
        return buf

    def _reply(self, cmd: str, size: int, into: memoryview | None = None) -> memoryview:
        """A reply whose size the request fixed: anything else is a lying server, refused before reading it."""
        (n,) = struct.unpack("<Q", self._recv_exact(8, cmd))
        if n != size:
            self._fail(f"rpc-server {self.endpoint} answered {cmd} with {n} bytes, expected {size}")
        return self._recv_exact(size, cmd, into)

    def _fail(self, msg: str):
        self.close()
        raise RPCError(msg)

    def call(self, cmd: str, payload: bytes = b"", reply: int | None = None, into: memoryview | None = None):
        """Send one command; with ``reply`` (its size) wait for the answer: a round trip."""
        if self.sock is None:
            raise RPCError(f"connection to rpc-server {self.endpoint} is closed")
        out = self._send(cmd, payload)
        if reply is None:
            self.traffic.add(cmd, out, 0, False)
            return None
        got = self._reply(cmd, reply, into)
        self.traffic.add(cmd, out, 8 + reply, True)
        return got

    def close(self) -> None:
        if self.sock is not None:
            try:
                self.sock.close()
            finally:
                self.sock = None

    # ---- the commands (ggml-rpc.cpp's client functions)
    def hello(self) -> tuple[int, int, int]:
        r = self.call("HELLO", bytes(RPC_CONN_CAPS_SIZE), 4 + RPC_CONN_CAPS_SIZE)
        major, minor, patch = r[0], r[1], r[2]
        if major != RPC_PROTO_MAJOR_VERSION or minor > RPC_PROTO_MINOR_VERSION:
            self._fail(f"rpc-server {self.endpoint} speaks RPC protocol {major}.{minor}.{patch}; this client speaks "
                       f"{RPC_PROTO_MAJOR_VERSION}.{RPC_PROTO_MINOR_VERSION}.{RPC_PROTO_PATCH_VERSION} (llama.cpp of "
                       f"llama-cpp-python 0.3.36: build it with make rpc-server)")
        return major, minor, patch

    def device_count(self) -> int:
        (n,) = struct.unpack("<I", self.call("DEVICE_COUNT", b"", 4))
        if not 1 <= n <= 256:
            self._fail(f"rpc-server {self.endpoint} reports {n} devices")
        return n

    def _u64(self, cmd: str, payload: bytes) -> int:
        return struct.unpack("<Q", self.call(cmd, payload, 8))[0]

    def get_alignment(self, device: int) -> int:
        a = self._u64("GET_ALIGNMENT", struct.pack("<I", device))
        if a == 0 or a & (a - 1) or a > 1 << 20:
            self._fail(f"rpc-server {self.endpoint} reports an alignment of {a}")
        return a

    def get_max_size(self, device: int) -> int:
        m = self._u64("GET_MAX_SIZE", struct.pack("<I", device))
        if m == 0:
            self._fail(f"rpc-server {self.endpoint} reports a maximum buffer size of 0")
        return m

    def get_device_memory(self, device: int) -> tuple[int, int]:
        free, total = struct.unpack("<QQ", self.call("GET_DEVICE_MEMORY", struct.pack("<I", device), 16))
        if free > total or total >= 1 << 62:
            self._fail(f"rpc-server {self.endpoint} reports {free} bytes free of {total}")
        return free, total

    def alloc_buffer(self, device: int, size: int) -> tuple[int, int]:
        """(remote buffer handle, its size); the base address follows with BUFFER_GET_BASE."""
        ptr, got = struct.unpack("<QQ", self.call("ALLOC_BUFFER", struct.pack("<IQ", device, size), 16))
        if ptr == 0:
            raise RPCError(f"rpc-server {self.endpoint} could not allocate {size} bytes on device {device}")
        if got < size or got > size + (1 << 30):
            self._fail(f"rpc-server {self.endpoint} allocated {got} bytes for a request of {size}")
        return ptr, got

    def buffer_get_base(self, buffer: int, size: int) -> int:
        base = self._u64("BUFFER_GET_BASE", struct.pack("<Q", buffer))
        if base == 0 or base + size >= 1 << 64:
            self._fail(f"rpc-server {self.endpoint} gave base address {base:#x} for a buffer of {size} bytes")
        return base

    def buffer_clear(self, buffer: int, value: int = 0) -> None:
        self.call("BUFFER_CLEAR", struct.pack("<QB", buffer, value))

    def free_buffer(self, buffer: int) -> None:
        self.call("FREE_BUFFER", struct.pack("<Q", buffer))

    def set_tensor(self, rec: bytes, data: np.ndarray, offset: int = 0, cache_flag: int = 0) -> None:
        self.call("SET_TENSOR", b"".join((rec, struct.pack("<BQ", cache_flag, offset), memoryview(data).cast("B"))))

    def set_tensor_hash(self, rec: bytes, h: int, offset: int = 0) -> bool:
        r = self.call("SET_TENSOR_HASH", rec + struct.pack("<QQ", offset, h), 1)[0]
        if r > 1:
            self._fail(f"rpc-server {self.endpoint} answered SET_TENSOR_HASH with {r}")
        return bool(r)

    def get_tensor(self, rec: bytes, size: int, offset: int = 0) -> np.ndarray:
        out = np.empty(size, np.uint8)
        self.call("GET_TENSOR", rec + struct.pack("<QQ", offset, size), size, memoryview(out))
        return out

    def copy_tensor(self, src: bytes, dst: bytes) -> bool:
        r = self.call("COPY_TENSOR", src + dst, 1)[0]
        if r > 1:
            self._fail(f"rpc-server {self.endpoint} answered COPY_TENSOR with {r}")
        return bool(r)

    def init_tensor(self, rec: bytes) -> None:
        self.call("INIT_TENSOR", rec)

    def get_alloc_size(self, device: int, rec: bytes, srcs: list[bytes]) -> int:
        srcs = list(srcs) + [bytes(RPC_TENSOR.size)] * (GGML_MAX_SRC - len(srcs))
        n = self._u64("GET_ALLOC_SIZE", struct.pack("<I", device) + rec + b"".join(srcs))
        if n >= 1 << 48:
            self._fail(f"rpc-server {self.endpoint} wants {n} bytes for one tensor")
        return n

    def graph_recompute(self, device: int) -> None:
        self.call("GRAPH_RECOMPUTE", struct.pack("<I", device))

    def graph_compute(self, device: int, node_ids: list[int], records: list[bytes]) -> None:
        payload = b"".join([struct.pack("<II", device, len(node_ids)), struct.pack(f"<{len(node_ids)}Q", *node_ids),
                            struct.pack("<I", len(records))] + records)
        self.call("GRAPH_COMPUTE", payload)


_CONNECTIONS: dict[str, RPCConnection] = {}
_DEVICES: dict[tuple[str, int], "RPCBackend"] = {}


def connect(endpoint: str, timeout: float | None = None) -> RPCConnection:
    """The connection to ``endpoint`` (get_dispatcher: one per endpoint, made on first use, remade once closed)."""
    c = _CONNECTIONS.get(endpoint)
    if c is None or c.sock is None:
        c = _CONNECTIONS[endpoint] = RPCConnection(endpoint, timeout)
    return c


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


def decode_record(raw: bytes) -> dict:
    """One rpc_tensor record, field by field (for looking at what goes over the wire)."""
    vals = RPC_TENSOR.unpack(raw)
    out, i = {}, 0
    for name, _, n in RPC_TENSOR_FIELDS:
        out[name] = vals[i] if n == 1 else list(vals[i:i + n])
        i += n
    out["name"] = out["name"].rstrip(b"\0").decode("utf-8", "replace")
    out["op_name"] = GGML_OPS[out["op"]] if out["op"] < len(GGML_OPS) else "?"
    return out


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

