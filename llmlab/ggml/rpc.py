"""The client side of ggml's RPC backend (ggml-rpc.cpp, protocol 7.0.0 as vendored by llama-cpp-python 0.3.36).

llama.cpp's ``rpc-server`` (``make rpc-server``) runs a ggml backend on a remote machine. The client keeps
one TCP connection per server; every message is ``| cmd (1 byte) | size (8 bytes) | payload |`` and the
commands that answer send ``| size (8 bytes) | payload |`` back. Tensors travel as ``rpc_tensor``
records (296 bytes: the pointer as id, type, remote buffer, ne, nb, op, op_params, flags, sources,
view source and offset, remote data address, name, use count), and a graph as the records of all its
nodes and their sources. The server runs ggml's own kernels, so a graph made of llama.cpp's ops and
op_params computes llama.cpp's bits.

The server is untrusted input: every reply has a size known before it is read and is checked against
it, every number in it is range-checked, each reply must arrive whole within a deadline
(``LLMLAB_RPC_TIMEOUT``, however slowly it drips), and any failure is one :class:`RPCError`
(an ``LLMLabError``: the CLI prints ``error: ...``). There is no authentication: a server must only
listen on a network you trust (rpc-server binds 127.0.0.1 unless told ``-H``).

This module is the wire (the messages and the records they carry) and :class:`RPCConnection`, the
socket that carries them; :class:`Traffic` counts bytes and round trips per command, per split. A server's
device as a scheduler backend, :class:`RPCBackend`, is :mod:`llmlab.ggml.rpc_backend`.
"""
from __future__ import annotations

import ipaddress
import socket
import struct
import time
from dataclasses import dataclass, field

import numpy as np

from .. import LLMLabError, config
from .defs import GGML_GLU_OP, GGML_MAX_OP_PARAMS, GGML_MAX_SRC, GGML_OP, GGML_OPS, GGML_UNARY_OP
from .tensor import Tensor

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
    # mixture of experts and MLA (ggml_mul_mat_id, ggml_argsort, ggml_sigmoid, ggml_sum_rows, ggml_clamp_impl, ...)
    "MUL_MAT_ID": ("MUL_MAT_ID", lambda p: []),
    "ARGSORT": ("ARGSORT", lambda p: [p["order"]]),
    "SIGMOID": ("UNARY", lambda p: [GGML_UNARY_OP["SIGMOID"]]),
    "SUM_ROWS": ("SUM_ROWS", lambda p: []),
    "CLAMP": ("CLAMP", lambda p: [_f(p["min"]), _f(p["max"])]),
    "DIV": ("DIV", lambda p: []),
    "CONCAT": ("CONCAT", lambda p: [p["dim"]]),
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
    """HOST:PORT as ggml's parse_endpoint reads it (split at the first ':'), with the port checked; also
    ``[IPv6]:PORT``. A host name must be one a resolver could look up (labels of 1 to 63 characters)."""
    bad = f"bad RPC endpoint {endpoint!r}"
    if endpoint.startswith("["):
        host, sep, port = endpoint[1:].partition("]:")
        try:
            ipaddress.IPv6Address(host)
        except ValueError:
            raise RPCError(f"{bad}: expected [IPv6 address]:PORT") from None
    else:
        host, sep, port = endpoint.partition(":")
    if not sep or not host or not port.isascii() or not port.isdigit() or not 0 < int(port) < 65536:
        raise RPCError(f"{bad}: expected HOST:PORT")
    if not endpoint.startswith("["):
        if len(host) > 253 or any(not 0 < len(x) <= 63 for x in host.rstrip(".").split(".")):
            raise RPCError(f"{bad}: a host name's labels (between dots) must have 1 to 63 characters")
        try:
            host.encode("idna")
        except UnicodeError as e:
            raise RPCError(f"{bad}: the host is not a valid name ({e})") from None
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
        except (OSError, UnicodeError) as e:       # (a host name the resolver's idna codec refuses)
            raise RPCError(f"cannot connect to rpc-server {endpoint}: {getattr(e, 'strerror', None) or e}") from None
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.version = self.hello()
        self.n_devices = self.device_count()

    # ---- framing: a request and its reply, within one deadline
    def _wait(self, deadline: float) -> None:
        """Let the socket wait at most until ``deadline`` (time.monotonic()): a server that drips its reply a byte at
        a time cannot hold the client longer than the timeout, whatever each recv takes."""
        left = deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError
        self.sock.settimeout(left)

    def _late(self, cmd: str, got: int, n: int) -> str:
        if not got:
            busy = " (it serves one client at a time: is another one connected?)" if cmd == "HELLO" else ""
            return f"no reply from rpc-server {self.endpoint} within {self.timeout:g} s ({cmd}){busy}"
        return (f"rpc-server {self.endpoint} did not finish its reply to {cmd} within {self.timeout:g} s "
                f"({got} of {n} bytes came; LLMLAB_RPC_TIMEOUT sets the limit)")

    def _send(self, cmd: str, payload: bytes | memoryview, deadline: float) -> int:
        head = struct.pack("<BQ", CMD[cmd], len(payload))
        try:
            for part in (head, payload):
                self._wait(deadline)
                self.sock.sendall(part)
        except (socket.timeout, TimeoutError):
            self._fail(f"rpc-server {self.endpoint} stopped reading {cmd} (not all of it was taken within "
                       f"{self.timeout:g} s, LLMLAB_RPC_TIMEOUT)")
        except OSError as e:
            self._fail(f"connection to rpc-server {self.endpoint} dropped while sending {cmd} ({e.strerror or e})")
        return len(head) + len(payload)

    def _recv_exact(self, n: int, cmd: str, deadline: float, into: memoryview | None = None,
                    before: int = 0) -> bytes | memoryview:
        """``n`` bytes of ``cmd``'s reply (``before``: how many of it came already, for the message)."""
        buf = into if into is not None else memoryview(bytearray(n))
        got = 0
        try:
            while got < n:
                self._wait(deadline)
                k = self.sock.recv_into(buf[got:], n - got)
                if k == 0:
                    self._fail(f"rpc-server {self.endpoint} closed the connection during {cmd} (it refuses a request "
                               f"it finds invalid, or it crashed)")
                got += k
        except (socket.timeout, TimeoutError):
            self._fail(self._late(cmd, before + got, before + n))
        except OSError as e:
            self._fail(f"connection to rpc-server {self.endpoint} dropped during {cmd} ({e.strerror or e})")
        return buf

    def _reply(self, cmd: str, size: int, deadline: float, into: memoryview | None = None) -> memoryview:
        """A reply whose size the request fixed: anything else is a lying server, refused before reading it."""
        (n,) = struct.unpack("<Q", self._recv_exact(8, cmd, deadline))
        if n != size:
            self._fail(f"rpc-server {self.endpoint} answered {cmd} with {n} bytes, expected {size}")
        return self._recv_exact(size, cmd, deadline, into, before=8)

    def _fail(self, msg: str):
        self.close()
        raise RPCError(msg)

    def call(self, cmd: str, payload: bytes = b"", reply: int | None = None, into: memoryview | None = None):
        """Send one command; with ``reply`` (its size) wait for the answer: a round trip. The request and the
        whole reply share one deadline, the timeout from now."""
        if self.sock is None:
            raise RPCError(f"connection to rpc-server {self.endpoint} is closed")
        deadline = time.monotonic() + self.timeout
        out = self._send(cmd, payload, deadline)
        if reply is None:
            self.traffic.add(cmd, out, 0, False)
            return None
        got = self._reply(cmd, reply, deadline, into)
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


def connect(endpoint: str, timeout: float | None = None) -> RPCConnection:
    """The connection to ``endpoint`` (get_dispatcher: one per endpoint, made on first use, remade once closed)."""
    c = _CONNECTIONS.get(endpoint)
    if c is None or c.sock is None:
        c = _CONNECTIONS[endpoint] = RPCConnection(endpoint, timeout)
    return c


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
