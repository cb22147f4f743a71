"""The thread governor (llmlab.ggml.cpu.threadpool) on simulated step times: it keeps all threads
on a quiet machine, moves to one thread when the machine is busy, and back when it is quiet again."""
from __future__ import annotations

from llmlab.ggml.cpu.threadpool import PROBE_MAX, Governor, candidates

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
