"""The RPC backend against llama.cpp's own rpc-server (``make rpc-server``) and against fake servers.

The real-server tests start rpc-servers on free localhost ports (one thread each: ``-t 1``) and check that
generation through them gives llama.cpp's greedy tokens and llmlab's local logits bit for bit, with full and
partial offload and two servers; the fakes check that a refused, silent, dropped, mismatched or lying server
is one ``error:`` line, never a hang or a traceback.
"""
from __future__ import annotations

import json
import os
import socket
import struct
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from conftest import ref_logits
from llmlab.ggml import rpc, rpc_backend
from llmlab.llama import Context, Model
from llmlab.llama.batch import Batch

ROOT = Path(__file__).resolve().parents[1]
CACHE = Path.home() / ".cache" / "llmlab"


def _free_port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


@pytest.fixture(scope="session")
def server_bin() -> str:
    import importlib.metadata as md
    r = subprocess.run(["bash", str(ROOT / "tools/rpc/build_server.sh"), str(CACHE), md.version("llama-cpp-python")],
                       env={**os.environ, "RPC_SERVER_NO_BUILD": "1"}, capture_output=True, text=True)
    if r.returncode != 0:
        pytest.skip("llama.cpp's rpc-server is not built for this CPU: make rpc-server")
    return r.stdout.strip().splitlines()[-1]


class Server:
    """An rpc-server on a free localhost port, one thread, stopped by :meth:`stop`."""

    def __init__(self, binary: str):
        self.port = _free_port()
        self.endpoint = f"127.0.0.1:{self.port}"
        self.proc = subprocess.Popen([binary, "-H", "127.0.0.1", "-p", str(self.port), "-t", "1"],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        for _ in range(200):
            if self.proc.poll() is not None:
                raise RuntimeError(f"rpc-server exited with {self.proc.returncode}")
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=1).close()   # it serves the next client
                return
            except OSError:
                time.sleep(0.05)
        raise RuntimeError("rpc-server did not start listening")

    def cpu_ticks(self) -> int:
        """utime + stime of the server process (/proc/PID/stat fields 14 and 15)."""
        fields = Path(f"/proc/{self.proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return int(fields[11]) + int(fields[12])

    def stop(self) -> None:
        self.proc.kill()
        self.proc.wait()


@pytest.fixture
def servers(server_bin):
    started: list[Server] = []

    def start(n: int = 1) -> list[Server]:
        started.extend(Server(server_bin) for _ in range(n))
        return started[-n:]
    yield start
    for s in started:
        s.stop()
    rpc._CONNECTIONS.clear()
    rpc_backend._DEVICES.clear()


def _generate(path, *extra, n: int = 16, prompt: str, timeout: int = 900) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "llmlab", "generate", "-m", str(path), "--temp", "0", "--json",
                           "--no-timings", "-n", str(n), "-p", prompt, *extra],
                          capture_output=True, text=True, timeout=timeout, cwd=ROOT,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})


def _prompt0(name):
    """The first stored prompt and its greedy tokens, from the references of the profile this host's
    llama.cpp (and so the natively built rpc-server) computes, not always avx512's."""
    from llmlab.ggml.cpu import profiles
    meta, npz = ref_logits(name, profiles.resolve(None).name)
    return meta["prompts"][0]["prompt"], npz["p0_greedy"].tolist()


def _llama_completion(server_bin, path, endpoint, prompt, n) -> str:
    """llama.cpp's own client (llama-completion --rpc, built beside rpc-server) on the same server: the text it
    generates greedily, prompt included."""
    completion = Path(server_bin).with_name("llama-completion")
    if not completion.exists():
        pytest.skip("llama-completion is not built beside rpc-server: make rpc-server")
    r = subprocess.run([str(completion), "-m", str(path), "--rpc", endpoint, "-ngl", "99", "-fa", "off",
                        "-c", "256", "--temp", "0", "-n", str(n), "-p", prompt, "-no-cnv", "--no-warmup", "-t", "2"],
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    return r.stdout.rstrip("\n")


# ---- the real server
@pytest.mark.slow
def test_generate_through_rpc_server_gives_llama_cpps_tokens(real_model, servers, server_bin):
    """``generate --rpc HOST:PORT -ngl 99``: llama.cpp's greedy continuation, computed by the server.

    The oracle is the stored references where llama.cpp's local run and the server compute alike. Gemma's
    q4_K weights are the exception off avx512: the local CPU run (the references) repacks them for REPACK's
    gemm, the server holds them unrepacked, and on avx2 the two orders part (token 11, seen on a Zen 3).
    There the oracle is llama.cpp itself through the same server."""
    name, path = real_model
    from llmlab.ggml.cpu import profiles
    prompt, want = _prompt0(name)
    (srv,) = servers(1)
    before = srv.cpu_ticks()
    r = _generate(path, "--rpc", srv.endpoint, "-ngl", "99", prompt=prompt)
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert len(out["ids"]) == 16
    assert srv.cpu_ticks() - before > 10          # more than 0.1 s of the server's CPU: it computed
    if name == "gemma3" and profiles.resolve(None).name != "avx512":
        assert (prompt + out["text"]).rstrip("\n") == _llama_completion(server_bin, path, srv.endpoint, prompt, 16)
    else:
        assert out["ids"] == want[:16]


@pytest.mark.slow
@pytest.mark.parametrize("how", ["partial", "two-servers", "two-servers-partial"])
def test_partial_offload_and_two_servers_give_the_same_tokens(servers, smollm2_path, how):
    prompt, want = _prompt0("smollm2")
    eps = [s.endpoint for s in servers(2 if how.startswith("two") else 1)]
    ngl = ["-ngl", "10"] if how.endswith("partial") else []
    r = _generate(smollm2_path, "--rpc", ",".join(eps), *ngl, "--tensor-split", ",".join(["1"] * len(eps)),
                  prompt=prompt, n=12)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["ids"] == want[:12]


@pytest.mark.slow
def test_logits_through_rpc_are_bit_equal_to_the_local_run(real_model, servers):
    """A prompt, then decode steps: every logit through two servers (-ngl all) equals the local run of the
    server's arithmetic (this CPU's profile without REPACK: rpc-server's buffers are plain CPU buffers)."""
    name, path = real_model
    npz = ref_logits(name, "avx512")[1]
    ids = npz["p0_ids"].tolist()
    model = Model(path)
    eps = [s.endpoint for s in servers(2)]
    local = Context(model, n_ctx=64, cpu=rpc_backend.server_profile(), kernels="reference")   # no compile for a new profile
    remote = Context(model, n_ctx=64, devices=eps, tensor_split=[1, 1])
    np.testing.assert_array_equal(remote.decode(Batch.from_tokens(ids, logits="all")),
                                  local.decode(Batch.from_tokens(ids, logits="all")))
    for i, t in enumerate(npz["p0_greedy"].tolist()[:3]):
        b = Batch.from_tokens([t], pos0=len(ids) + i, logits="all")
        np.testing.assert_array_equal(remote.decode(b), local.decode(b))
    devs = remote.sched.backends[:2]
    assert all(d.split_log for d in devs)                 # both servers computed splits
    t = devs[0].conn.traffic
    assert t.calls["HELLO"] == 1 and t.calls["GRAPH_COMPUTE"] + t.calls["GRAPH_RECOMPUTE"] == 4
    assert t.calls["GRAPH_RECOMPUTE"] >= 1            # a reused graph's split runs again from the server's copy
    # weights went up once: the second decode step sent no SET_TENSOR bigger than an activation copy
    weights = sum(x.nbytes() for x in devs[0].keep.values())
    assert t.bytes_out["SET_TENSOR"] < weights * 1.05


# ---- fake servers: one error line, no hang
def _fake(script):
    """A one-client TCP server on a free port running ``script(conn)``; returns the endpoint."""
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(1)

    def run():
        c, _ = srv.accept()
        try:
            script(c)
        except OSError:
            pass
        finally:
            time.sleep(0.2)
            c.close()
            srv.close()
    threading.Thread(target=run, daemon=True).start()
    return f"127.0.0.1:{srv.getsockname()[1]}"


def _read_cmd(c) -> tuple[int, bytes]:
    head = b""
    while len(head) < 9:
        head += c.recv(9 - len(head))
    cmd, n = struct.unpack("<BQ", head)
    body = b""
    while len(body) < n:
        body += c.recv(n - len(body))
    return cmd, body


def _hello(c, major=7, minor=0):
    _read_cmd(c)
    c.sendall(struct.pack("<Q", 28) + bytes([major, minor, 0, 0]) + bytes(24))


def _device_count(c, n=1):
    _read_cmd(c)
    c.sendall(struct.pack("<QI", 4, n))


def _silent(c):
    _hello(c)
    _read_cmd(c)
    time.sleep(5)


def _busy(c):
    time.sleep(5)                                # accepted by the kernel, never served: another client has it


def _drops(c):
    _hello(c)
    _read_cmd(c)


def _huge_reply(c):
    _hello(c)
    _read_cmd(c)
    c.sendall(struct.pack("<Q", 1 << 60))        # a reply "of 2^60 bytes": refused before reading


def _bad_alignment(c):
    _hello(c)
    _device_count(c)
    _read_cmd(c)
    c.sendall(struct.pack("<QQ", 8, 3))           # not a power of two


def _no_devices(c):
    _hello(c)
    _device_count(c, 0)


FAKES = {
    "old version": (lambda c: _hello(c, major=6), "speaks RPC protocol 6.0.0"),
    "newer minor": (lambda c: _hello(c, minor=3), "speaks RPC protocol 7.3.0"),
    "silent": (_silent, "no reply from rpc-server"),
    "busy": (_busy, "within 1 s \\(HELLO\\) \\(it serves one client at a time"),
    "drops": (_drops, "closed the connection during DEVICE_COUNT"),
    "huge reply": (_huge_reply, "answered DEVICE_COUNT with 1152921504606846976 bytes, expected 4"),
    "bad alignment": (_bad_alignment, "reports an alignment of 3"),
    "no devices": (_no_devices, "reports 0 devices"),
}


@pytest.mark.parametrize("kind", FAKES)
def test_lying_or_broken_server_is_one_clear_error(kind):
    script, msg = FAKES[kind]
    ep = _fake(script)
    t0 = time.monotonic()
    with pytest.raises(rpc.RPCError, match=msg):
        rpc_backend.RPCBackend(ep, timeout=1.0)
    assert time.monotonic() - t0 < 4


def test_refused_and_silent_servers_in_the_cli(smollm2_path):
    """The CLI: one ``error:`` line and exit status 2, within the timeout (LLMLAB_RPC_TIMEOUT)."""
    port = _free_port()                          # nothing listens there
    r = _generate(smollm2_path, "--rpc", f"127.0.0.1:{port}", prompt="Hi", n=2, timeout=120)
    assert r.returncode == 2 and r.stderr.strip().splitlines() == [
        f"error: cannot connect to rpc-server 127.0.0.1:{port}: connection refused (is rpc-server running there?)"]
    ep = _fake(_silent)
    t0 = time.monotonic()
    r = subprocess.run([sys.executable, "-m", "llmlab", "generate", "-m", str(smollm2_path), "--rpc", ep, "-p", "Hi",
                        "-n", "2", "--no-timings"], capture_output=True, text=True, timeout=120, cwd=ROOT,
                       env={**os.environ, "PYTHONPATH": str(ROOT), "LLMLAB_RPC_TIMEOUT": "1"})
    assert r.returncode == 2 and r.stderr.strip().splitlines() == [
        f"error: no reply from rpc-server {ep} within 1 s (DEVICE_COUNT)"]
    assert time.monotonic() - t0 < 60


@pytest.mark.parametrize("args, msg", [
    (["--rpc", "localhost"], "bad RPC endpoint 'localhost': expected HOST:PORT"),
    (["--rpc", "h:99999"], "bad RPC endpoint 'h:99999'"),
    (["-ngl", "3"], "error: -ngl and --tensor-split place layers on devices: give them with --rpc HOST:PORT"),
    (["--rpc", "h:1", "--tensor-split", "0,0"], "weights must be >= 0, not all 0"),
])
def test_bad_rpc_options(smollm2_path, args, msg):
    r = _generate(smollm2_path, *args, prompt="Hi", n=1, timeout=120)
    assert r.returncode == 2 and msg in r.stderr and "Traceback" not in r.stderr


def test_rpc_tensor_record_layout():
    """296 packed bytes, as ggml-rpc.cpp's rpc_tensor; a record decodes back to its fields."""
    from llmlab.ggml.tensor import Tensor
    a = Tensor("f32", (8, 2), name="a")
    v = Tensor("f32", (8,), op="VIEW", src=(a,), op_params={"offset": 32}, name="a (view)", view_src=a, view_offs=32)
    v.id = 5

    class Fake(rpc_backend.RPCBackend):
        def __init__(self):
            self.where = {self.key(a): (0x1000, 0x7f0000000000)}
    rec = Fake().record(v, {}, use_count=2)
    assert len(rec) == rpc.RPC_TENSOR.size == 296
    d = rpc.decode_record(rec)
    assert d["op_name"] == "VIEW" and d["ne"] == [8, 1, 1, 1] and d["nb"] == [4, 32, 32, 32]
    assert d["buffer"] == 0x1000 and d["data"] == 0x7f0000000000 + 32 and d["view_offs"] == 32
    assert d["op_params"][:2] == [32, 0] and d["flags"] == rpc.GGML_TENSOR_FLAG_COMPUTE and d["use_count"] == 2
    assert d["name"] == "a (view)" and d["src"][0] == d["view_src"] != 0 and d["id"] not in (0, d["src"][0])


def test_op_table_matches_ggml():
    """Every op llmlab's CPU backend computes has an encoding; the enums are ggml.h's."""
    from llmlab.ggml.sched.backend import ALL_OPS
    assert ALL_OPS <= rpc.SUPPORTED_OPS
    assert (rpc.GGML_OP["MUL_MAT"], rpc.GGML_OP["FLASH_ATTN_EXT"], rpc.GGML_OP["UNARY"], rpc.GGML_OP["GLU"]) == (
        29, 74, 91, 100)
    assert rpc.GGML_UNARY_OP["SILU"] == 10 and rpc.GGML_GLU_OP["SWIGLU"] == 2 and rpc.CMD["GRAPH_COMPUTE"] == 10


def test_layer_devices_follow_llama_cpp():
    """llama_model::load_tensors: the last n_gpu_layers slots (the output layer is slot n_layer) are offloaded,
    split between devices at the cumulative, normalised tensor_split."""
    from llmlab.ggml.sched.placement import layer_devices
    slots = layer_devices(30, 10, [1.0])
    assert slots[:21] == [None] * 21 and slots[21:] == [0] * 10
    two = layer_devices(30, 99, [1, 1])
    assert two == [0] * 16 + [1] * 15                 # slot 15: 15/31 < 0.5; slot 16: 16/31 >= 0.5
    assert layer_devices(30, 0, [1, 1]) == [None] * 31
    assert layer_devices(4, 5, [3, 1]) == [0, 0, 0, 0, 1]    # 3/5 = 0.6 < 0.75 -> device 0
    with pytest.raises(ValueError):
        layer_devices(4, 5, [0, 0])


@pytest.mark.slow
def test_repacked_weights_round_differently_through_rpc(servers, gemma3_path):
    """Gemma 3's q4_K weights: llama.cpp's local CPU repacks them (and so does llmlab's profile), rpc-server does
    not, so a prompt's logits through RPC differ from the local run's in the last bits."""
    ids = ref_logits("gemma3", "avx512")[1]["p0_ids"].tolist()
    model = Model(gemma3_path)
    (srv,) = servers(1)
    b = Batch.from_tokens(ids, logits="all")
    remote = Context(model, n_ctx=64, devices=[srv.endpoint]).decode(b)
    local = Context(model, n_ctx=64).decode(Batch.from_tokens(ids, logits="all"))
    assert not np.array_equal(remote, local)
    assert remote[-1].argmax() == local[-1].argmax()                     # the same next token nonetheless


def test_fnv_hash_is_fnv1a_64():
    """rpc-server's cache key: FNV-1a 64 (published test vectors)."""
    h = rpc_backend.fnv_hash
    assert h(np.zeros(0, np.uint8)) == 0xcbf29ce484222325
    assert h(np.frombuffer(b"a", np.uint8)) == 0xaf63dc4c8601ec8c
    assert h(np.frombuffer(b"foobar", np.uint8)) == 0x85944171f73967e8


@pytest.mark.slow
def test_server_dying_mid_generation_is_one_error(servers, smollm2_path):
    """A server killed between two steps: the next decode raises RPCError (one line for the CLI), promptly."""
    (srv,) = servers(1)
    ctx = Context(Model(smollm2_path), n_ctx=64, devices=[srv.endpoint], n_gpu_layers=10)
    ctx.decode(Batch.from_tokens([1, 2, 3], logits="last"))
    srv.stop()
    t0 = time.monotonic()
    with pytest.raises(rpc.RPCError, match="rpc-server 127.0.0.1:[0-9]+ (closed the connection|dropped)"):
        ctx.decode(Batch.from_tokens([4], pos0=3, logits="last"))
    assert time.monotonic() - t0 < 30


def test_request_layouts_on_the_wire():
    """Each command's request has the size of ggml-rpc.cpp's packed struct; the answers are read as its replies."""
    seen = []

    def script(c):
        _hello(c)
        _device_count(c, 2)
        for reply in (struct.pack("<B", 1), struct.pack("<Q", 4096), struct.pack("<QQ", 1 << 30, 2 << 30), b"", b""):
            cmd, body = _read_cmd(c)
            seen.append((rpc.RPC_CMDS[cmd], len(body)))
            if reply:
                c.sendall(struct.pack("<Q", len(reply)) + reply)
    conn = rpc.RPCConnection(_fake(script), timeout=2.0)
    rec = bytes(rpc.RPC_TENSOR.size)
    assert conn.n_devices == 2 and conn.version == (7, 0, 0)
    assert conn.copy_tensor(rec, rec) is True
    assert conn.get_alloc_size(1, rec, [rec]) == 4096
    assert conn.get_device_memory(1) == (1 << 30, 2 << 30)
    conn.buffer_clear(0x1234, 0)
    conn.graph_recompute(1)
    time.sleep(0.3)
    assert seen == [("COPY_TENSOR", 592), ("GET_ALLOC_SIZE", 4 + 296 * 11), ("GET_DEVICE_MEMORY", 4),
                    ("BUFFER_CLEAR", 9), ("GRAPH_RECOMPUTE", 4)]
    assert conn.traffic.round_trips == 5 and conn.traffic.calls["BUFFER_CLEAR"] == 1   # HELLO, DEVICE_COUNT + 3


@pytest.mark.slow
@pytest.mark.parametrize("name, prompt", [("gemma3", "Water boils at a temperature of"),
                                          ("gemma3", "My favourite recipe for pancakes is"),
                                          ("smollm2", "The three primary colours are")])
def test_same_text_as_llama_cpps_own_rpc_client(servers, server_bin, name, prompt):
    """llama.cpp's llama-completion --rpc on the same server (built beside it by make rpc-server) and llmlab's
    RPC backend generate the same greedy text, Gemma 3's included, where both part from the local CPU run."""
    from llmlab import models
    path = models.resolve(name)
    (srv,) = servers(1)
    want = _llama_completion(server_bin, path, srv.endpoint, prompt, 24)
    r = _generate(path, "--rpc", srv.endpoint, "-ngl", "99", prompt=prompt, n=24)
    assert r.returncode == 0, r.stderr
    assert (prompt + json.loads(r.stdout)["text"]).rstrip("\n") == want


def test_devices_of_one_server_copy_there():
    """Two devices of one server: a split input goes device to device with COPY_TENSOR (src and dst records
    carrying their remote buffers and addresses), not through the client; a server answering 0 means "get and
    set instead"."""
    from llmlab.ggml.tensor import Tensor
    seen = []

    def script(c):
        _hello(c)
        _device_count(c, 2)
        for reply in (struct.pack("<Q", 32), struct.pack("<Q", 1 << 40)) * 2 + (b"\1", b"\0"):
            cmd, body = _read_cmd(c)
            seen.append((rpc.RPC_CMDS[cmd], body))
            c.sendall(struct.pack("<Q", len(reply)) + reply)
    ep = _fake(script)
    d0, d1 = rpc_backend.RPCBackend(ep, 0, timeout=2.0), rpc_backend.RPCBackend(ep, 1, timeout=2.0)
    assert d0.conn is d1.conn and d0.buffer_type != d1.buffer_type
    src, dst = Tensor("f32", (4, 2), name="l_out-9"), Tensor("f32", (4, 2), name="RPC1#l_out-9#0")
    d0.where[d0.key(src)] = (0xA0, 0x1000)
    d1.where[d1.key(dst)] = (0xB0, 0x2000)
    assert d1.cpy_tensor(d0, src, dst) is True and d1.cpy_tensor(d0, src, dst) is False
    cmd, body = seen[-2]
    s_rec, d_rec = rpc.decode_record(body[:296]), rpc.decode_record(body[296:])
    assert cmd == "COPY_TENSOR" and (s_rec["buffer"], s_rec["data"]) == (0xA0, 0x1000)
    assert (d_rec["buffer"], d_rec["data"], d_rec["name"]) == (0xB0, 0x2000, "RPC1#l_out-9#0")
    rpc._CONNECTIONS.clear()
