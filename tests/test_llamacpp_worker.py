"""The llama.cpp bridge: llama.cpp runs in a worker process, so a crash of it (SIGILL on AMX Xeons, an abort,
a segfault) is one failed call, one failed test, one line in a notebook; and the oracle's version is written once."""
from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from llmlab import LLAMA_CPP_PYTHON, LLMLabError
from llmlab.llamacpp import worker

ROOT = Path(__file__).resolve().parent.parent
posix_signals = pytest.mark.skipif(sys.platform == "win32", reason="the worker is killed with POSIX signals")


@pytest.fixture
def forget():
    yield
    worker.forget_crashes()


@posix_signals
@pytest.mark.parametrize("sig", ["SIGILL", "SIGSEGV", "SIGABRT"])
def test_a_crash_is_one_exception_and_the_next_call_works(sig, forget):
    pid = worker.isolated(worker.ping)
    assert pid != os.getpid() and worker.isolated(worker.ping) == pid          # one persistent worker
    with pytest.raises(worker.LlamaCppCrashed, match=f"died with {sig}") as e:
        worker.isolated(worker.die, getattr(signal, sig))
    assert e.value.signal_name == sig and isinstance(e.value, LLMLabError)     # the CLI prints it as one line
    assert "Fatal Python error" in e.value.log                                 # the worker's faulthandler dump
    assert worker.last_crash() is e.value
    again = worker.isolated(worker.ping)                                       # a new worker
    assert again not in (pid, os.getpid())


@posix_signals
def test_objects_of_a_crashed_worker_say_so(forget):
    from llmlab.llamacpp.session import Session
    with pytest.raises(LLMLabError, match="model file not found"):              # the worker's exception, re-raised
        worker.open_remote(Session, "/nonexistent/model.gguf")
    remote = worker.Remote(1, worker._WORKER.generation, "Session")
    with pytest.raises(worker.LlamaCppCrashed):
        worker.isolated(worker.die, signal.SIGKILL)
    with pytest.raises(worker.LlamaCppCrashed, match="is gone"):
        remote.decode([1])


def test_only_llmlab_functions_run_in_the_worker():
    with pytest.raises(ValueError, match="only module-level functions of llmlab"):
        worker.isolated(os.getpid)
    with pytest.raises(ValueError, match="only module-level functions"):
        worker.isolated(lambda: 1)


def test_arrays_come_back_unchanged():
    x = np.random.default_rng(0).standard_normal((64, 49152)).astype(np.float32)
    from llmlab.llamacpp.cpu import close
    assert worker.isolated(close, x, x) is True                  # 12 MB each way


@posix_signals
def test_a_crash_fails_one_test_and_the_run_goes_on(tmp_path):
    """Under pytest: the crashing test fails, the tests after it pass (and find a new worker)."""
    (tmp_path / "test_crash.py").write_text(
        "import signal\nfrom llmlab.llamacpp import worker\n"
        "def test_before():\n    assert worker.isolated(worker.ping) > 0\n"
        "def test_crash():\n    worker.isolated(worker.die, signal.SIGILL)\n"
        "def test_after():\n    assert worker.isolated(worker.ping) > 0\n")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), env_path()]))
    r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(tmp_path / "test_crash.py")],
                       capture_output=True, text=True, env=env, cwd=tmp_path, timeout=300)
    assert r.returncode == 1 and "1 failed, 2 passed" in r.stdout, r.stdout[-2000:]
    assert "LlamaCppCrashed: llama.cpp died with SIGILL" in r.stdout


def env_path() -> str:
    return os.environ.get("PYTHONPATH", "")


@posix_signals
def test_a_notebook_says_one_line_after_a_crash(capsys, forget):
    from llmlab import nb
    with pytest.raises(worker.LlamaCppCrashed):
        worker.isolated(worker.die, signal.SIGILL)
    if nb.importlib.util.find_spec("llama_cpp") is None:
        pytest.skip("has_oracle says llama-cpp-python is missing first")
    capsys.readouterr()
    assert nb.has_oracle("the comparison") is False
    out = capsys.readouterr().out.strip().splitlines()
    assert len(out) == 1 and out[0].startswith("skipped: the comparison: llama.cpp crashed") and "SIGILL" in out[0]
    worker.forget_crashes()
    assert nb.has_oracle("the comparison") is True


def test_the_version_pin_is_written_once():
    """``llmlab.LLAMA_CPP_PYTHON`` is the one place in code; pyproject.toml and environment.yml pin the same."""
    import tomllib
    dev = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]["dev"]
    assert f"llama-cpp-python=={LLAMA_CPP_PYTHON}" in dev
    assert f"llama-cpp-python=={LLAMA_CPP_PYTHON}" in (ROOT / "environment.yml").read_text()
    pinned = re.compile(r"llama-cpp-python==\d|[\"']" + re.escape(LLAMA_CPP_PYTHON) + r"[\"']")
    found = [str(p.relative_to(ROOT)) for d in ("llmlab", "tests", "tools", "benchmarks")
             for p in sorted((ROOT / d).rglob("*")) if p.suffix in (".py", ".sh") and p.is_file()
             and pinned.search(p.read_text(errors="replace"))]
    assert found == ["llmlab/__init__.py"], found


@posix_signals
def test_a_crash_in_a_notebook_cell_is_one_line_and_the_kernel_lives(capsys, forget):
    pytest.importorskip("IPython", reason="IPython comes with the lab extras")
    from IPython.core.interactiveshell import InteractiveShell
    from llmlab import nb
    ip = InteractiveShell.instance()
    try:
        assert nb.one_line_oracle_crashes()
        capsys.readouterr()
        r = ip.run_cell("import signal\nfrom llmlab.llamacpp import worker\nworker.isolated(worker.die, signal.SIGILL)")
        out = capsys.readouterr()
        assert isinstance(r.error_in_exec, worker.LlamaCppCrashed)
        lines = (out.out + out.err).strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("llama.cpp crashed") and "SIGILL" in lines[0], lines
        assert ip.run_cell("worker.isolated(worker.ping) > 0").result is True     # the same kernel, a new worker
    finally:
        InteractiveShell.clear_instance()
