"""The kernels' warm-up (llmlab.warm, python -m llmlab warm): compile or load before anything is timed,
and say which, apart from the tokens per second."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

from llmlab.warm import Warmup, cache_counts, warm


def test_summary_says_compiled_or_loaded():
    assert "compiled 3" in Warmup(12.0, 3, 10).summary() and "once per machine" in Warmup(12.0, 3, 10).summary()
    assert "10 loaded from numba's cache" in Warmup(0.5, 0, 10).summary()
    # a slow warm-up that numba did not compile in says so; one that compiled says so, even when its
    # kernels' statistics missed it (a helper compiled for a loaded kernel)
    slow = Warmup(39.5, 0, 7, 0.0).summary()
    assert "7 loaded from numba's cache" in slow and "compiled" not in slow and "39.5 s warm-up" in slow
    hidden = Warmup(39.5, 0, 7, 30.2).summary()
    assert hidden.startswith("kernels: compiled") and "30.2 s of the 39.5 s" in hidden


def test_warm_loads_every_kernel_a_generation_takes(smollm2_path):
    from llmlab.llama import Batch, Context, Model
    m = Model(smollm2_path)
    w = warm(m)            # in a process that ran the engine before, nothing is left to load: both may be 0
    assert w.seconds > 0 and w.compile_seconds is not None and w.compile_seconds <= w.seconds
    assert w.summary().startswith("kernels: compiled") == (w.compiled > 0 or w.compile_seconds >= 0.05)
    before = cache_counts()
    ctx = Context(m, n_ctx=64, n_batch=64)
    ctx.decode(Batch.from_tokens(list(range(10, 25))))
    ctx.decode(Batch.from_tokens([5], pos0=15))
    assert cache_counts() == before            # nothing left to compile or load after the warm-up


def test_cli_warm(smollm2_path):
    r = subprocess.run([sys.executable, "-m", "llmlab", "warm", "-m", str(smollm2_path)], capture_output=True,
                       text=True, timeout=900, env=dict(os.environ))
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("kernels: ") and "3/3 a decode step" in r.stderr


def _read_only(cmd: list[str], folder, env: dict) -> subprocess.CompletedProcess:
    """Run ``cmd`` with ``folder`` read-only: a private read-only bind mount as root (root writes through
    file modes), the folder's write bits taken away otherwise."""
    if os.geteuid() == 0:
        script = 'mount --bind "$0" "$0" && mount -o remount,ro,bind "$0" && exec "$@"'
        return subprocess.run(["unshare", "-m", "sh", "-c", script, str(folder), *cmd], capture_output=True,
                              text=True, timeout=900, env=env)
    for root, dirs, files in os.walk(folder):
        for n in dirs + files:
            os.chmod(os.path.join(root, n), 0o555 if n in dirs else 0o444)
    os.chmod(folder, 0o555)
    return subprocess.run(cmd, capture_output=True, text=True, timeout=900, env=env)


@pytest.mark.slow
def test_a_read_only_shared_cache_is_used(tmp_path, smollm2_path):
    """JupyterHub: the admin warms the kernels into one cache (NUMBA_CACHE_DIR) that users can read but
    not write. numba passes over a folder it cannot write, so llmlab copies what it holds into the user's
    own folder: the user's first run loads every kernel and compiles none."""
    shared, home = tmp_path / "shared", tmp_path / "home"
    env = dict(os.environ, NUMBA_CACHE_DIR=str(shared), LLMLAB_HOME=str(home), LLMLAB_KERNEL_TARGET="host")
    cmd = [sys.executable, "-m", "llmlab", "warm", "-m", str(smollm2_path)]
    admin = subprocess.run(cmd, capture_output=True, text=True, timeout=1800, env=env)
    assert admin.returncode == 0 and admin.stdout.startswith("kernels: compiled"), admin.stderr
    user = _read_only(cmd, shared, env)
    assert user.returncode == 0, user.stderr
    assert "loaded from numba's cache" in user.stdout and "compiled" not in user.stdout, user.stdout
    assert any((home / "numba").rglob("*.nbi"))
