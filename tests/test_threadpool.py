"""The thread governor (llmlab.ggml.cpu.threadpool) on simulated step times: it keeps all threads
on a quiet machine, moves to one thread when the machine is busy, and back when it is quiet again."""
from __future__ import annotations

import os
import time

import pytest

from llmlab.ggml.cpu.threadpool import PROBE_MAX, PROBE_MIN, BusySince, Governor, busy_cores, candidates, start_count

QUIET = {2: 0.008, 1: 0.014}        # seconds per decode step: threads pay
BUSY = {2: 0.300, 1: 0.050}         # another process on the second core: every region waits for it


def run(g: Governor, cost, steps: int, kind: str = "token", start: int = 0) -> list[int]:
    used = []
    for i in range(start, start + steps):
        n = g.choose(kind)
        used.append(n)
        g.record(kind, n, cost(i)[n])
    return used


def test_candidates():
    assert candidates(1) == (1,)
    assert candidates(2) == (2, 1)
    assert candidates(8) == (8, 4, 1)


def test_quiet_machine_keeps_all_threads_and_tries_one_rarely():
    used = run(Governor(2), lambda i: QUIET, 400)
    assert used[:3] == [2, 2, 1]                 # the first step is not counted; then one thread is tried
    assert used[-100:].count(1) <= 1             # the tries back off while two threads stay clearly faster
    assert used.count(1) <= 8


def test_busy_machine_moves_to_one_thread():
    used = run(Governor(2), lambda i: BUSY, 200)
    assert used[4:].count(2) <= 6
    assert all(n == 1 for n in used[-20:])


def test_follows_the_load_both_ways():
    g = Governor(2)
    phase = lambda i: BUSY if 100 <= i < 300 else QUIET          # noqa: E731
    used = run(g, phase, 600)
    assert used[110:300].count(2) <= 4                      # busy: one thread, but for a few tries
    back = used[300:].index(2) if 2 in used[300:] else None
    assert back is not None and back <= PROBE_MAX           # quiet again: found at the next try
    rest = used[300 + back + 5:]
    assert rest.count(1) <= len(rest) // 25                 # and stays on two threads, trying one rarely


def test_batch_steps_start_from_the_token_steps_choice():
    g = Governor(2)
    run(g, lambda i: BUSY, 60)
    assert g.choose("batch") == 1


def test_start_from_the_cores_the_load_leaves_free():
    assert start_count(2, 0.1, n_cpus=2) == 2          # quiet
    assert start_count(2, 1.0, n_cpus=2) == 1          # one busy process beside it (a browser, a build)
    assert start_count(2, 0.6, n_cpus=2) == 1
    assert start_count(8, 4.2, n_cpus=8) == 4
    assert start_count(8, 9.0, n_cpus=8) == 1
    assert start_count(4, None) == 4                   # unknown (no /proc/stat): all threads


def test_busy_cores_sees_a_busy_process():
    import subprocess
    import sys
    b = busy_cores()
    if b is None:
        pytest.skip("no /proc/stat on this system")
    assert 0 <= b <= os.cpu_count() + 0.01
    p = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        time.sleep(0.3)
        assert busy_cores(0.3) >= 0.8                 # at least the spinning child (more if the machine is busy)
    finally:
        p.kill()
        p.wait()


def test_busy_since_counts_other_processes_not_this_one():
    """The probe's reading without a sleep: a spinning child counts, this process's own spinning
    (a decode step's work between two probes) does not; too short an interval says nothing."""
    import subprocess
    import sys
    b = BusySince()
    if b.last is None:
        pytest.skip("no /proc/stat on this system")
    assert b() is None                                  # no interval yet
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < 0.3:               # our own work
        pass
    own = b()
    assert own is not None and 0 <= own <= os.cpu_count() + 0.01
    base = busy_cores(0.1)                              # what the rest of the machine does meanwhile
    p = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        time.sleep(0.3)
        b()
        time.sleep(0.3)
        other = b()
        assert other is not None and other >= 0.8       # at least the spinning child
    finally:
        p.kill()
        p.wait()
    assert own < other or base > 0.5                    # our own spin was not counted (unless the machine is busy)


def test_busy_start_tries_more_threads_only_on_the_probe_schedule():
    """Started on one thread (a loaded machine), it does not pay a slow 2-thread step at once; if the
    machine is in fact quiet, the probe finds two threads and keeps them."""
    g = Governor(2, start=1)
    busy = run(g, lambda i: BUSY, 60)
    assert busy[:PROBE_MIN - 1] == [1] * (PROBE_MIN - 1)
    assert busy.count(2) <= 3
    g = Governor(2, start=1)
    quiet = run(g, lambda i: QUIET, 100)
    assert quiet[:PROBE_MIN - 1] == [1] * (PROBE_MIN - 1) and all(n == 2 for n in quiet[-20:])


def test_no_try_of_more_threads_while_the_cores_are_busy():
    """The probe of two threads is skipped (and backs off) while the other core is busy, and taken
    once it is free."""
    load = {"busy": 1.0}
    g = Governor(2, start=1, busy=lambda: load["busy"])
    used = run(g, lambda i: BUSY, 100)
    assert used.count(2) == 0 and g.n_skipped >= 2
    load["busy"] = 0.0
    used = run(g, lambda i: QUIET, 300, start=100)
    assert all(n == 2 for n in used[-20:])


def test_one_thread_has_nothing_to_choose():
    g = Governor(1)
    assert run(g, lambda i: {1: 0.01}, 20) == [1] * 20


def test_context_steps_go_through_the_shared_governor(smollm2_path):
    from llmlab.ggml.cpu import threadpool
    from llmlab.ggml.cpu.fast import threads
    from llmlab.llama import Batch, Context, Model
    ctx = Context(Model(smollm2_path), n_ctx=256)
    ctx.decode(Batch.from_tokens([1, 2, 3]))
    for i in range(6):
        ctx.decode(Batch.from_tokens([4], pos0=3 + i))
    g = threadpool.governor(threads())
    assert ctx.threadpool is g
    assert sum(len(t) for (kind, _), t in g.times.items() if kind == "token") >= 5   # the first step is not counted
