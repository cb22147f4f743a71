"""numba's threading layers under llmlab: a one-thread parallel region runs on the calling thread on every
layer (workqueue would hand it to a worker and wake it), under workqueue llmlab's spinning pool serves the
larger ones (chunk 0 on the caller, the rest on the pool's workers, workqueue's bits), the thread limit and
the governor's count reach the layer, and the work from which a product is threaded comes from the layer's
measured wake-up cost. Checked by which thread ran each task and by the region counts, never by timing."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numba
import numpy as np
import pytest

from llmlab.ggml.cpu import threadpool
from llmlab.ggml.cpu.fast import _common          # binds llmlab's region entry before any kernel below links

ROOT = Path(__file__).resolve().parents[1]

# pthread_self() of the thread running each task of a parallel region, and of the caller: a region ran
# on the calling thread when every task reports the caller's. The limit is llmlab's (fast._common).
PROBE = r'''
import json, os, sys
import numpy as np
from llvmlite import ir
from numba import njit, prange, types
from numba.core import cgutils
from numba.extending import intrinsic

from llmlab.ggml.cpu import threadpool
from llmlab.ggml.cpu.fast import _common

if "nospin" in sys.argv:      # every wait sleeps on its condition variable at once (a busy machine's path)
    threadpool.SPIN = 0


@intrinsic
def _pthread_self(typingctx):
    def codegen(context, builder, signature, args):
        fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(ir.IntType(64), []), "pthread_self")
        return builder.call(fn, [])
    return types.int64(), codegen


@njit
def caller():
    return _pthread_self()


@njit(parallel=True)
def total(a):
    s = 0.0
    for i in prange(a.size):
        s += a[i] * 1.0000001
    return s


@njit(parallel=True)
def tasks(out, n_threads):
    prev = _common.limit_threads(n_threads)
    for i in prange(out.size):
        out[i] = _pthread_self()
    _common.restore_threads(prev)


def run(step_count, limit):
    """Tasks of one region on ``step_count`` threads (as the governor sets a step's count) with a kernel limit:
    (all on the caller, regions run inline, regions handed to the layer)."""
    _common.use_threads(step_count)
    out = np.zeros(8, np.int64)
    c0 = threadpool.region_counts()
    tasks(out, limit)
    c1 = threadpool.region_counts()
    me = caller()
    return {"on_caller": bool((out == me).all()), "none_on_caller": bool((out != me).all()),
            "inline": c1[0] - c0[0], "layer": c1[1] - c0[1]}


def pooled():
    """A two-thread region: which threads ran its tasks, and whether the pool served it."""
    _common.use_threads(2)
    out = np.zeros(8, np.int64)
    p0 = threadpool.pooled_regions()
    tasks(out, 0)
    workers = [t.ident for t in threadpool.pool_threads()]
    return {"caller": int((out == caller()).sum()), "workers": int(np.isin(out, workers).sum()) if workers else 0,
            "pooled": threadpool.pooled_regions() - p0}


def sums():
    """A product (row sums, one thread each) and a prange reduction (a partial sum per thread, combined in
    thread order) on one thread, then two."""
    a = np.random.default_rng(0).standard_normal(100_003)
    w = np.random.default_rng(1).standard_normal((301, 77)).astype(np.float32)
    r = {}
    for n in (1, 2):
        _common.use_threads(n)
        r[n] = (float(total(a)), row_sums(w).tobytes().hex())
    return {"total_1": r[1][0], "total_2": r[2][0], "rows_equal": r[1][1] == r[2][1], "exact": float(a.sum() * 1.0000001)}


@njit(parallel=True)
def row_sums(w):
    out = np.zeros(w.shape[0], np.float32)
    for i in prange(w.shape[0]):
        s = np.float32(0)
        for k in range(w.shape[1]):
            s += w[i, k] * np.float32(1.5)
        out[i] = s
    return out


_common.set_threads(2)
res = {"limit_1": run(2, 1), "step_1": run(1, 0), "step_2": run(2, 0)}
import numba
res["layer"] = numba.threading_layer()
res["min_work"] = _common.parallel_min_work()
res["derived"] = _common.min_work_for(threadpool.wake_cost_us(2), 2)
res["pool"] = pooled()
res["sums"] = sums()
if "fork" in sys.argv and hasattr(os, "fork"):
    pid = os.fork()
    if pid == 0:                                      # the child: its own pool serves, with the same bits
        import signal
        signal.alarm(60)                              # a pool waiting for the parent's workers would hang
        got = {"pool": pooled(), "sums": sums()}
        ok = got["pool"]["pooled"] == 1 and got["pool"]["workers"] > 0 and got["sums"] == res["sums"]
        if not ok:
            print("child:", json.dumps(got), file=sys.stderr)
        os._exit(0 if ok else 3)
    res["child_status"] = os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
res["stopped"] = threadpool.stop_pool()
res["after_stop"] = pooled()
res["after_stop"]["tasks"] = run(2, 0)
print(json.dumps(res))
'''

two_threads = pytest.mark.skipif(numba.config.NUMBA_NUM_THREADS < 2, reason="numba's pool has one thread here")
posix = pytest.mark.skipif(sys.platform == "win32", reason="the probe reads pthread_self")


def probe(layer: str | None, *args: str) -> dict:
    env = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""),
           "NUMBA_NUM_THREADS": "2"}
    env.pop("LLMLAB_PARALLEL_MIN_WORK", None)
    env.pop("LLMLAB_THREADS", None)
    if layer:
        env["NUMBA_THREADING_LAYER"] = layer
    else:
        env.pop("NUMBA_THREADING_LAYER", None)
    p = subprocess.run([sys.executable, "-c", PROBE, *args], env=env, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-2000:]
    return json.loads(p.stdout.strip().splitlines()[-1])


@two_threads
@posix
def test_workqueue_regions_run_inline_or_on_the_pool():
    """workqueue hands every region to its workers, a one-thread one too, and the caller never runs a task.
    llmlab's entry runs the limit's one-thread regions and the governor's one-thread steps on the caller;
    a two-thread region's chunk 0 on the caller and chunk 1 on the pool's worker, never on workqueue's:
    each product row and each reduction's partial sum as workqueue computes them (a reduction's slot is its
    chunk's number: both halves counted, in the order omp's threads give, checked below). A forked child
    starts its own pool; once stopped, workqueue serves the regions again (the caller runs no task)."""
    r = probe("workqueue", "fork")
    assert r["layer"] == "workqueue"
    assert r["limit_1"] == {"on_caller": True, "none_on_caller": False, "inline": 1, "layer": 0}
    assert r["step_1"] == {"on_caller": True, "none_on_caller": False, "inline": 1, "layer": 0}
    assert (r["step_2"]["inline"], r["step_2"]["layer"]) == (0, 1)
    assert r["pool"] == {"caller": 4, "workers": 4, "pooled": 1}
    assert r["min_work"] == r["derived"] == _common.MIN_WORK      # the pool's wake costs as omp's
    assert r["sums"]["rows_equal"] and abs(r["sums"]["total_2"] - r["sums"]["exact"]) < 1e-6 * 100_003
    assert r["child_status"] == 0, r
    assert r["stopped"] and r["after_stop"]["pooled"] == 0 and r["after_stop"]["tasks"]["none_on_caller"]


@two_threads
@posix
def test_the_pool_that_never_spins_sleeps_and_wakes_with_the_same_bits():
    """With no spinning, every worker sleeps between regions and the caller sleeps until each worker's
    chunk is done (the condition variables a machine busier than its threads goes through): the regions
    are served, with the spinning pool's bits, and the pool stops."""
    r, spun = probe("workqueue", "nospin"), probe("workqueue")
    assert r["pool"] == {"caller": 4, "workers": 4, "pooled": 1}
    assert r["sums"] == spun["sums"] and r["stopped"]


@two_threads
@posix
def test_the_pool_reduces_as_omp_does():
    """A prange reduction on two threads gives omp's bits under the pool: the same two chunks, each partial
    sum in its thread's slot, combined in the same order."""
    if "omp" not in threadpool.threading_layers()["available"]:
        pytest.skip("numba's omp layer does not load here")
    assert probe("workqueue")["sums"] == probe("omp")["sums"]


@two_threads
def test_the_pool_stops_at_exit():
    """A process whose pool workers spin (a region just ran) exits at once, cleanly: atexit stops them."""
    code = ("import atexit\nfrom llmlab.ggml.cpu import threadpool\nfrom llmlab.ggml.cpu.fast import _common\n"
            "atexit.register(lambda: print('stopped', threadpool.pool_threads() == []))\n"   # runs after the pool's
            "import numpy as np\nfrom numba import njit, prange\n"
            "@njit(parallel=True)\ndef f(a):\n    for i in prange(a.size):\n        a[i] += 1\n"
            "_common.set_threads(2); f(np.zeros(64)); assert threadpool.pooled_regions() == 1\n")
    env = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""),
           "NUMBA_NUM_THREADS": "2", "NUMBA_THREADING_LAYER": "workqueue"}
    p = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-2000:]
    assert p.stdout.strip() == "stopped True"


@two_threads
@posix
@pytest.mark.parametrize("layer", [None, "tbb"])
def test_other_layers_one_thread_regions_stay_on_the_calling_thread(layer):
    """The default layer here (omp on Linux) and tbb where it loads: the limit and the governor's count
    reach the layer (a two-thread step is the layer's region; tbb may run both tasks on the caller, which
    steals them, so only omp's placement is checked)."""
    if layer and layer not in threadpool.threading_layers()["available"]:
        pytest.skip(f"numba's {layer} layer does not load here")
    r = probe(layer)
    for case in ("limit_1", "step_1"):
        assert r[case] == {"on_caller": True, "none_on_caller": False, "inline": 1, "layer": 0}, (r["layer"], case)
    assert (r["step_2"]["inline"], r["step_2"]["layer"]) == (0, 1)
    if r["layer"] == "omp":
        assert not r["step_2"]["on_caller"]
    assert r["min_work"] == r["derived"]


def test_min_work_follows_the_wake_cost(monkeypatch):
    """The threshold is what a wake costs in one thread's work, n/(n-1) times (n threads save (n-1)/n of
    it), never below MIN_WORK; LLMLAB_PARALLEL_MIN_WORK wins; one thread wakes nobody (nothing measured)."""
    monkeypatch.delenv("LLMLAB_PARALLEL_MIN_WORK", raising=False)
    asked = []

    def wake(n):
        asked.append(n)
        return cost[0]
    monkeypatch.setattr(_common, "wake_cost_us", wake)
    monkeypatch.setattr(_common, "threads", lambda: 2)
    cost = [100.0]                                           # workqueue's condition variables
    assert _common.parallel_min_work() == 100 * _common.WORK_PER_US * 2
    cost[0] = 0.5                                            # a spinning omp worker
    assert _common.parallel_min_work() == _common.MIN_WORK
    monkeypatch.setattr(_common, "threads", lambda: 4)
    cost[0] = 90.0
    assert _common.parallel_min_work() == int(90 * _common.WORK_PER_US * 4 / 3)
    assert asked == [2, 2, 4]
    monkeypatch.setenv("LLMLAB_PARALLEL_MIN_WORK", "12345")
    assert _common.parallel_min_work() == 12345 and asked == [2, 2, 4]
    assert _common.min_work_for(1e6, 1) == _common.MIN_WORK


def test_wake_cost_is_measured_once_per_count():
    """Once per process and count, never above the layer's quiet cost (load only adds to a measurement);
    a spinning layer (omp, tbb) takes the table's value."""
    a = threadpool.wake_cost_us(2)
    assert a >= 0.0 and threadpool.wake_cost_us(2) == a and threadpool.wake_cost_us(1) == 0.0
    layer = numba.threading_layer()
    assert a <= threadpool.QUIET_WAKE_US.get(layer, float("inf"))
    if threadpool.QUIET_WAKE_US.get(layer, 1e9) < threadpool.MEASURE_FROM_US:
        assert a == threadpool.QUIET_WAKE_US[layer]


@two_threads
def test_a_small_product_runs_on_the_calling_thread(monkeypatch):
    """A quantized product bound below the threshold gets the limit 1: its region runs inline; above it,
    the layer's threads. The same bits either way."""
    from llmlab.ggml.cpu.fast import dispatch
    from llmlab.ggml.quant import quantize
    from llmlab.ggml.types import ggml_type
    monkeypatch.delenv("LLMLAB_PARALLEL_MIN_WORK", raising=False)
    rng = np.random.default_rng(3)
    qt = ggml_type("q4_0")
    raw = quantize(rng.standard_normal(64 * 256).astype(np.float32), "q4_0").reshape(64, -1)
    X = rng.standard_normal((1, 256)).astype(np.float32)
    n0 = _common.threads()
    _common.set_threads(2)
    try:
        outs = []
        for wake in (1e6, 0.0):                              # a layer slower than any product, then a free one
            monkeypatch.setattr(_common, "wake_cost_us", lambda n, w=wake: w)
            monkeypatch.setattr(_common, "MIN_WORK", 1)
            Y = np.zeros((1, 64), np.float32)
            step = dispatch.bind_step(raw, qt, X, Y)
            c0 = threadpool.region_counts()
            step()
            c1 = threadpool.region_counts()
            outs.append(Y.copy())
            if wake:
                assert c1[1] == c0[1] and c1[0] > c0[0]
            else:
                assert c1[1] > c0[1]
        assert outs[0].tobytes() == outs[1].tobytes()
    finally:
        _common.set_threads(n0)
