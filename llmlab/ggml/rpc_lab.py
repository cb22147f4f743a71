"""llama.cpp's rpc-server on this machine, for the notebook and the tests: start and stop local servers, and
read what went over the wire (notebook 06's last section).

``make rpc-server`` builds the server (tools/rpc/build_server.sh) into the cache; :func:`binary` finds it
without building. :class:`LocalServer` starts one on a free port of 127.0.0.1 only (the server has no
authentication: see :mod:`llmlab.ggml.rpc`) and stops it on :meth:`LocalServer.stop`, at exit, or when the
Python process that started it dies. The rest turns :class:`llmlab.ggml.rpc.Traffic` logs into tables:
bytes per command for one phase (the weights' upload against one token), round trips per split, a
latency model of one decode step, and one ``rpc_tensor`` record byte by byte.
"""
from __future__ import annotations

import atexit
import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from . import rpc, rpc_backend

BUILD_SCRIPT = Path(__file__).resolve().parents[2] / "tools" / "rpc" / "build_server.sh"
BUILD_HINT = "make rpc-server"


def binary(cache: Path | None = None) -> Path | None:
    """The rpc-server built for this CPU (``make rpc-server``), or None: asks tools/rpc/build_server.sh with
    RPC_SERVER_NO_BUILD=1, so nothing is built and the CPU key is the script's own."""
    import importlib.metadata as md
    from .. import config
    if not BUILD_SCRIPT.exists():          # an installed llmlab without the checkout's tools/
        return None
    try:
        version = md.version("llama-cpp-python")
    except md.PackageNotFoundError:
        from .. import LLAMA_CPP_PYTHON
        version = LLAMA_CPP_PYTHON
    r = subprocess.run(["bash", str(BUILD_SCRIPT), str(cache or config.home()), version],
                       env={**os.environ, "RPC_SERVER_NO_BUILD": "1"}, capture_output=True, text=True)
    if r.returncode != 0 or not r.stdout.strip():
        return None
    p = Path(r.stdout.strip().splitlines()[-1])
    return p if p.is_file() and os.access(p, os.X_OK) else None


def free_port(host: str = "127.0.0.1") -> int:
    """A port nobody listens on now (the OS picks it)."""
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def _die_with_parent() -> None:
    """In the child before exec: SIGKILL it when the notebook's kernel dies (Linux prctl PR_SET_PDEATHSIG)."""
    try:
        import ctypes
        ctypes.CDLL(None).prctl(1, signal.SIGKILL)
    except (OSError, AttributeError):
        pass


_RUNNING: list["LocalServer"] = []


class LocalServer:
    """One rpc-server on a free port of 127.0.0.1 with ``threads`` compute threads; ``endpoint`` is what
    ``Context(devices=[...])`` and ``--rpc`` take."""

    def __init__(self, path: Path | str, threads: int = 1, host: str = "127.0.0.1", start_timeout: float = 10.0):
        self.host, self.port = host, free_port(host)
        self.endpoint = f"{host}:{self.port}"
        self.proc = subprocess.Popen([str(path), "-H", host, "-p", str(self.port), "-t", str(threads)],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                     preexec_fn=_die_with_parent if sys.platform == "linux" else None)
        _RUNNING.append(self)
        deadline = time.monotonic() + start_timeout
        while True:
            if self.proc.poll() is not None:
                self.stop()
                raise rpc.RPCError(f"rpc-server exited with status {self.proc.returncode} before listening")
            try:
                socket.create_connection((host, self.port), timeout=1).close()   # it then serves the next client
                return
            except OSError:
                if time.monotonic() > deadline:
                    self.stop()
                    raise rpc.RPCError(f"rpc-server did not listen on {self.endpoint} within {start_timeout:g} s") \
                        from None
                time.sleep(0.05)

    def cpu_seconds(self) -> float:
        """User + system CPU time the server has used (/proc/PID/stat fields 14 and 15)."""
        fields = Path(f"/proc/{self.proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    @property
    def running(self) -> bool:
        return self.proc.poll() is None

    def stop(self) -> None:
        """Kill the server and forget the client's connection to it (a later device() connects afresh)."""
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()
        c = rpc._CONNECTIONS.pop(self.endpoint, None)
        if c is not None:
            c.close()
        for k in [k for k in rpc_backend._DEVICES if k[0] == self.endpoint]:
            del rpc_backend._DEVICES[k]
        if self in _RUNNING:
            _RUNNING.remove(self)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.stop()

    def __repr__(self) -> str:
        return f"LocalServer({self.endpoint}, pid {self.proc.pid}, {'running' if self.running else 'stopped'})"


def start(n: int, path: Path | str | None = None, threads: int = 1) -> list[LocalServer]:
    """``n`` local servers, as ``n`` "machines" on one host (all stopped again if one fails to start)."""
    path = path or binary()
    if path is None:
        raise rpc.RPCError(f"llama.cpp's rpc-server is not built for this CPU: {BUILD_HINT}")
    out: list[LocalServer] = []
    try:
        for _ in range(n):
            out.append(LocalServer(path, threads))
    except BaseException:
        stop_all(out)
        raise
    return out


def stop_all(servers=None) -> None:
    """Stop ``servers`` (default: every server this process started)."""
    for s in list(_RUNNING if servers is None else servers):
        s.stop()


atexit.register(stop_all)


# ---- reading the traffic
def phase_rows(backends, phase: str) -> list[dict]:
    """Per command, over the connections of ``backends`` (each connection counted once): calls, bytes out and
    in, round trips, in the messages labelled ``phase``."""
    agg: dict[str, dict] = {}
    for conn in {id(b.conn): b.conn for b in backends}.values():
        for r in conn.traffic.rows(phase):
            a = agg.setdefault(r["command"], dict(command=r["command"], calls=0, bytes_out=0, bytes_in=0,
                                                   round_trips=0))
            for k in ("calls", "bytes_out", "bytes_in", "round_trips"):
                a[k] += r[k]
    return sorted(agg.values(), key=lambda r: -(r["bytes_out"] + r["bytes_in"]))


def set_phase(backends, phase: str) -> None:
    """Label the next messages of every connection of ``backends`` (Traffic.phase)."""
    for b in backends:
        b.conn.traffic.phase = phase


def split_rows(backends, phase: str) -> list[dict]:
    """One row per split a device of ``backends`` computed in ``phase``: its device, nodes, records sent, the
    messages since that connection's previous split (its inputs up, earlier outputs down), bytes, round trips."""
    rows = []
    for b in backends:
        for r in b.split_log:
            if r["phase"] == phase:
                rows.append(dict(device=b.name, nodes=r["nodes"], records=r["records"], messages=r["messages"],
                                 bytes_out=r["bytes_out"], bytes_in=r["bytes_in"], round_trips=r["round_trips"]))
    return rows


def measure_rtt(conn: rpc.RPCConnection, n: int = 200) -> float:
    """Median seconds of one tiny round trip (GET_ALIGNMENT: 13 bytes up, 16 down) on ``conn``; the messages
    are counted under phase "probe"."""
    saved, conn.traffic.phase = conn.traffic.phase, "probe"
    ts = []
    try:
        for _ in range(n):
            t0 = time.perf_counter()
            conn.get_alignment(0)
            ts.append(time.perf_counter() - t0)
    finally:
        conn.traffic.phase = saved
    ts.sort()
    return ts[len(ts) // 2]


def measure_bandwidth(backend, tensor, repeat: int = 5) -> float:
    """Bytes per second of reading ``tensor`` (already on ``backend``) back with GET_TENSOR, the best of
    ``repeat``; the RTT is in it, so take a tensor of a few MB. Counted under phase "probe"."""
    conn = backend.conn
    saved, conn.traffic.phase = conn.traffic.phase, "probe"
    try:
        best = float("inf")
        for _ in range(repeat):
            t0 = time.perf_counter()
            backend.get_tensor(tensor)
            best = min(best, time.perf_counter() - t0)
    finally:
        conn.traffic.phase = saved
    return tensor.nbytes() / best


@dataclass
class Link:
    """A network between the client and its servers: round-trip time (s) and bandwidth (bytes/s)."""
    name: str
    rtt: float
    bandwidth: float
    measured: bool = False


def wire_time(link: Link, round_trips: int, nbytes: int) -> dict:
    """Time one decode step spends on the wire, by the simplest model: every round trip waits one RTT, and
    every byte crosses at the link's bandwidth (a message sent without waiting costs only its bytes)."""
    lat, bw = round_trips * link.rtt, nbytes / link.bandwidth
    return dict(link=link.name, measured="yes" if link.measured else "assumed", rtt_ms=link.rtt * 1e3,
                mbytes_per_s=link.bandwidth / 1e6, latency_ms=lat * 1e3, transfer_ms=bw * 1e3,
                wire_ms=(lat + bw) * 1e3, latency_share=lat / (lat + bw) if lat + bw > 0 else 0.0)


def record_rows(raw: bytes) -> list[dict]:
    """One ``rpc_tensor`` record (296 bytes), field by field: name, byte offset, size, the bytes in hex and
    the value as the server reads it (``decode_record``'s, plus the op's name)."""
    if len(raw) != rpc.RPC_TENSOR.size:
        raise ValueError(f"an rpc_tensor record has {rpc.RPC_TENSOR.size} bytes, not {len(raw)}")
    import struct
    vals = rpc.decode_record(raw)
    rows, off = [], 0
    for name, fmt, n in rpc.RPC_TENSOR_FIELDS:
        size = struct.calcsize("<" + fmt) * n
        chunk = raw[off:off + size]
        v = vals[name]
        if name == "op":
            v = f"{v} ({vals['op_name']})"
        elif name == "type":
            from .types import ggml_type
            try:
                v = f"{v} ({ggml_type(v).name})"
            except ValueError:
                pass
        elif name in ("data", "buffer", "id", "view_src") and isinstance(v, int):
            v = hex(v)
        elif name == "src":
            v = [x for x in v if x] or "none"
        shown = chunk.hex(" ") if size <= 16 else chunk[:16].hex(" ") + f" ... ({size} bytes)"
        rows.append(dict(field=name, offset=off, size=size, hex=shown, value=v))
        off += size
    return rows


def labelled(backends, steps, n: int) -> list:
    """The first ``n`` items of ``steps``, an iterator that computes one decode per item (e.g.
    ``llmlab.generate.greedy``), with the messages of ``backends`` labelled "prompt" while the first is
    computed (it also uploads the weights and clears the KV cache) and "token 1".."token n-1" while the
    others are; unlabelled after."""
    out = []
    try:
        for i in range(n):
            set_phase(backends, "prompt" if i == 0 else f"token {i}")
            out.append(next(steps))
    finally:
        set_phase(backends, "")
    return out


def sent_record(backend, node) -> bytes:
    """``node``'s rpc_tensor record as ``backend``'s GRAPH_COMPUTE sends it (its remote buffer and address, its
    readers in the graph as use count), with the ids numbered for this record alone (in a real message
    they number every tensor of the split)."""
    return backend.record(node, ids={}, use_count=backend._uses.get(backend.key(node), 0))
