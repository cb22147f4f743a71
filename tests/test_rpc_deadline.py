"""Each rpc-server reply must arrive whole within one deadline (LLMLAB_RPC_TIMEOUT), however slowly it drips:
a timeout per recv would let a server sending a byte a second hold the client for as long as it likes.
Fake servers on 127.0.0.1, each in a thread, every test bounded in time."""
from __future__ import annotations

import socket
import struct
import threading
import time

import pytest

from llmlab import config
from llmlab.ggml import rpc

HELLO_REPLY = struct.pack("<Q", 28) + bytes([7, 0, 0, 0]) + bytes(24)


def _read_cmd(c):
    head = b""
    while len(head) < 9:
        head += c.recv(9 - len(head))
    n = struct.unpack("<BQ", head)[1]
    body = b""
    while len(body) < n:
        body += c.recv(n - len(body))


def _drip(c, data: bytes, every: float = 0.2) -> None:
    for i in range(len(data)):
        c.sendall(data[i:i + 1])
        time.sleep(every)


def fake(script) -> tuple[str, threading.Event]:
    """A one-connection server running ``script(conn)`` in a thread; the event stops it."""
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen(1)
    stop = threading.Event()

    def serve():
        c, _ = s.accept()
        try:
            script(c)
        except OSError:
            pass
        finally:
            stop.wait(10)
            c.close()
            s.close()
    threading.Thread(target=serve, daemon=True).start()
    return f"127.0.0.1:{s.getsockname()[1]}", stop


def dripping_hello(c):
    _read_cmd(c)
    _drip(c, HELLO_REPLY)                    # 36 bytes at 5 a second: 7 s, each recv well inside the timeout


def dripping_device_count(c):
    _read_cmd(c)
    c.sendall(HELLO_REPLY)
    _read_cmd(c)
    _drip(c, struct.pack("<QI", 4, 1))      # the header, then the count, a byte at a time


@pytest.mark.parametrize("script, cmd", [(dripping_hello, "HELLO"), (dripping_device_count, "DEVICE_COUNT")])
def test_a_dripping_reply_times_out_whole(script, cmd):
    ep, stop = fake(script)
    t0 = time.monotonic()
    try:
        with pytest.raises(rpc.RPCError) as e:
            rpc.RPCConnection(ep, timeout=1.0)
    finally:
        stop.set()
    took = time.monotonic() - t0
    assert took < 2.5, took
    msg = str(e.value)
    assert msg.startswith(f"rpc-server {ep} did not finish its reply to {cmd} within 1 s ("), msg
    assert "bytes came; LLMLAB_RPC_TIMEOUT sets the limit)" in msg


def test_a_reply_in_time_is_read_as_before():
    def quick(c):
        _read_cmd(c)
        _drip(c, HELLO_REPLY, every=0.001)
        _read_cmd(c)
        c.sendall(struct.pack("<QI", 4, 2))
    ep, stop = fake(quick)
    try:
        conn = rpc.RPCConnection(ep, timeout=5.0)
        assert conn.version == (7, 0, 0) and conn.n_devices == 2
        conn.close()
    finally:
        stop.set()


@pytest.mark.parametrize("value, ok", [("86400", True), ("0.5", True), ("86401", False), ("9999999999", False),
                                       ("0", False), ("1e999", False)])
def test_the_timeout_has_bounds(monkeypatch, value, ok):
    monkeypatch.setenv("LLMLAB_RPC_TIMEOUT", value)
    if ok:
        assert config.rpc_timeout() == float(value)
    else:
        with pytest.raises(ValueError, match="^LLMLAB_RPC_TIMEOUT: "):
            config.rpc_timeout()
