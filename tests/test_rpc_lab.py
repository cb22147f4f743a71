"""rpc_lab: local rpc-servers for notebook 06 (start, stop, clean up) and the tables it draws from the traffic."""
from __future__ import annotations

import struct

import pytest

from llmlab.ggml import rpc, rpc_backend, rpc_lab
from llmlab.llama import Context, Model
from llmlab.nb import exercises as ex


@pytest.fixture(scope="module")
def rpc_bin():
    p = rpc_lab.binary()
    if p is None:
        pytest.skip("llama.cpp's rpc-server is not built for this CPU: make rpc-server")
    return p


def test_missing_binary_is_one_clear_error(monkeypatch):
    monkeypatch.setattr(rpc_lab, "binary", lambda cache=None: None)
    with pytest.raises(rpc.RPCError, match="make rpc-server"):
        rpc_lab.start(1)


def test_server_that_exits_at_once_is_an_error(tmp_path):
    fake = tmp_path / "rpc-server"
    fake.write_text("#!/bin/sh\nexit 3\n")
    fake.chmod(0o755)
    with pytest.raises(rpc.RPCError, match="exited with status 3"):
        rpc_lab.start(1, fake)
    assert not rpc_lab._RUNNING


@pytest.mark.slow
def test_start_serve_and_stop(rpc_bin):
    servers = rpc_lab.start(2, rpc_bin)
    try:
        assert len({s.port for s in servers}) == 2 and all(s.running for s in servers)
        assert all(s.endpoint.startswith("127.0.0.1:") for s in servers)
        devs = [rpc_backend.device(s.endpoint) for s in servers]
        assert all(d.alignment > 0 for d in devs)
        rtt = rpc_lab.measure_rtt(devs[0].conn, n=20)
        assert 0 < rtt < 0.5
        assert devs[0].conn.traffic.calls["GET_ALIGNMENT"] >= 21
        assert sum(r["calls"] for r in devs[0].conn.traffic.rows("probe")) == 20
    finally:
        rpc_lab.stop_all(servers)
    assert not any(s.running for s in servers) and not rpc_lab._RUNNING
    assert all(s.endpoint not in rpc._CONNECTIONS for s in servers)


@pytest.mark.slow
def test_traffic_tables_and_tokens_through_two_servers(rpc_bin, smollm2_path):
    """What notebook 06 shows: same greedy tokens, server CPU grew, weights once, the SET_TENSOR of one row
    of activations is the exercise's size, round trips per token are the GET_TENSORs."""
    from itertools import islice

    from llmlab.generate import greedy
    model = Model(smollm2_path)
    servers = rpc_lab.start(2, rpc_bin)
    try:
        before = [s.cpu_seconds() for s in servers]
        ctx = Context(model, n_ctx=64, devices=[s.endpoint for s in servers], n_gpu_layers=20, tensor_split=[1, 1])
        devs = ctx.sched.backends[:-1]
        ids = [1, 504, 3458, 282, 4649, 314]
        run = rpc_lab.labelled(devs, greedy(ctx, ids), 4)
        got, secs = [s.token for s in run], [s.decode_s for s in run]
        want = [s.token for s in islice(greedy(Context(model, n_ctx=64, kernels="reference"), ids), 4)]
        assert got == want and len(secs) == 4
        assert all(s.cpu_seconds() > b for s, b in zip(servers, before))
        first, one = rpc_lab.phase_rows(devs, "prompt"), rpc_lab.phase_rows(devs, "token 2")
        weights = sum(t.nbytes() for d in devs for t in d.keep.values())
        up = {r["command"]: r for r in first}
        assert up["SET_TENSOR"]["bytes_out"] + up.get("SET_TENSOR_HASH", {"bytes_out": 0})["bytes_out"] > weights * 0.5
        per = {r["command"]: r for r in one}
        assert "GRAPH_RECOMPUTE" in per and "GRAPH_COMPUTE" not in per
        assert sum(r["round_trips"] for r in one) == per["GET_TENSOR"]["calls"]
        # one token's residual row crossing to a server: the exercise's message size is on the wire
        row = 4 * model.hparams.n_embd
        sizes = [out for cmd, out, _, _, ph in devs[1].conn.traffic.log if cmd == "SET_TENSOR" and ph == "token 2"]
        want_msg = 1 + 8 + rpc.RPC_TENSOR.size + 1 + 8 + row
        assert want_msg in sizes
        assert ex.check_set_tensor_bytes(model.hparams.n_embd, want_msg)
        splits = rpc_lab.split_rows(devs, "token 2")
        assert len(splits) == 2 and all(r["records"] == 0 for r in splits)     # recomputed, no records sent
        node = next(n for n in ctx.last_graph.gf.nodes if n.op == "ROPE" and devs[1].address(n) is not None)
        rows = rpc_lab.record_rows(rpc_lab.sent_record(devs[1], node))
        assert [r["field"] for r in rows][:3] == ["id", "type", "buffer"] and rows[-1]["offset"] == 292
        assert sum(r["size"] for r in rows) == 296
    finally:
        rpc_lab.stop_all(servers)


def test_labelled_names_each_decode_and_clears_after():
    """The traffic of the first decode is "prompt", then "token 1", ...; unlabelled after, even on an error."""
    from types import SimpleNamespace
    devs = [SimpleNamespace(conn=SimpleNamespace(traffic=SimpleNamespace(phase=""))) for _ in range(2)]
    seen = []

    def steps():
        while True:
            seen.append([d.conn.traffic.phase for d in devs])
            if len(seen) == 5:
                raise RuntimeError("a decode failed")
            yield len(seen)
    assert rpc_lab.labelled(devs, steps(), 3) == [1, 2, 3]
    assert seen == [["prompt"] * 2, ["token 1"] * 2, ["token 2"] * 2] and all(d.conn.traffic.phase == "" for d in devs)
    it = steps()
    with pytest.raises(RuntimeError, match="a decode failed"):
        rpc_lab.labelled(devs, it, 5)
    assert all(d.conn.traffic.phase == "" for d in devs)


def test_record_rows_byte_offsets():
    rec = rpc.RPC_TENSOR.pack(7, 0, 0xAB, 4, 3, 1, 1, 4, 16, 48, 48, 0, *([0] * 16), 16, 5, 6, *([0] * 8), 0, 0,
                              0x1000, b"x", 2)
    rows = rpc_lab.record_rows(rec)
    by = {r["field"]: r for r in rows}
    assert by["id"]["hex"] == struct.pack("<Q", 7).hex(" ") and by["id"]["value"] == "0x7"
    assert by["type"]["value"] == "0 (f32)" and by["buffer"]["offset"] == 12
    assert by["ne"]["offset"] == 20 and by["ne"]["value"] == [4, 3, 1, 1]
    assert by["src"]["value"] == [5, 6] and by["data"]["value"] == "0x1000"
    assert by["name"]["value"] == "x" and by["use_count"]["value"] == 2
    with pytest.raises(ValueError):
        rpc_lab.record_rows(rec[:-1])


def test_wire_time_model():
    lan = rpc_lab.Link("lan", 1e-3, 1e6)
    r = rpc_lab.wire_time(lan, 3, 2000)
    assert r["latency_ms"] == pytest.approx(3.0) and r["transfer_ms"] == pytest.approx(2.0)
    assert r["wire_ms"] == pytest.approx(5.0) and r["latency_share"] == pytest.approx(0.6)
    assert r["measured"] == "assumed"


def test_set_tensor_exercise_checker():
    assert ex.check_set_tensor_bytes(576, 9 + 296 + 9 + 2304)
    assert "header" in str(ex.check_set_tensor_bytes(576, 296 + 9 + 2304))
    assert "4 bytes" in str(ex.check_set_tensor_bytes(576, 9 + 296 + 9 + 576))
    assert not ex.check_set_tensor_bytes(576, 1)
