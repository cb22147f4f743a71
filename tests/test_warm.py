"""The kernels' warm-up (llmlab.warm, python -m llmlab warm): compile or load before anything is timed,
and say which, apart from the tokens per second."""
from __future__ import annotations

import os
import subprocess
import sys

from llmlab.warm import Warmup, cache_counts, warm


def test_summary_says_compiled_or_loaded():
    assert "compiled 3" in Warmup(12.0, 3, 10).summary() and "once per machine" in Warmup(12.0, 3, 10).summary()
    assert "10 loaded from numba's cache" in Warmup(0.5, 0, 10).summary()


def test_warm_loads_every_kernel_a_generation_takes(smollm2_path):
    from llmlab.llama import Batch, Context, Model
    m = Model(smollm2_path)
    w = warm(m)
    assert w.compiled + w.loaded > 0 and w.seconds > 0
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
