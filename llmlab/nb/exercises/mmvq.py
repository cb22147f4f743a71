"""Checkers of notebook 07_dp4a_mmvq: launch arithmetic, dp4a by hand, which lanes read which block."""
from __future__ import annotations

import numpy as np

from .verdict import Verdict


def _verdict(problems: list[str]) -> Verdict:
    return Verdict.not_yet("; ".join(problems)) if problems else Verdict.correct()


def check_launch(answer: dict, type_name: str, nrows: int, ncols: int, ncols_dst: int = 1) -> Verdict:
    """Compare your launch arithmetic (any of launch_params' keys) with the simulator's."""
    from ...cuda_sim.launch import launch_params
    want = launch_params(type_name, nrows, ncols, ncols_dst)
    problems = [f"unknown key {k!r}" for k in answer if k not in want]
    problems += [f"{k} = {v!r}, expected {want[k]!r}" for k, v in answer.items()
                 if k in want and tuple(np.atleast_1d(v)) != tuple(np.atleast_1d(want[k]))]
    return _verdict(problems)


def check_dp4a(fn, trials: int = 2000, seed: int = 0) -> Verdict:
    """Your ``fn(a, b, c)`` on Python ints (a, b as unsigned 32-bit patterns, c signed) against dp4a."""
    from ...cuda_sim.dp4a import dp4a
    rng = np.random.default_rng(seed)
    cases = [(0x7F7F7F7F, 0x7F7F7F7F, 2**31 - 1), (0x80808080, 0x01010101, 0), (0xE0E0E0E0, 0x01020304, 5)]
    cases += [(int(a), int(b), int(c)) for a, b, c in zip(rng.integers(0, 2**32, trials), rng.integers(0, 2**32, trials),
                                                          rng.integers(-2**31, 2**31, trials))]
    for a, b, c in cases:
        got, want = fn(a, b, c), int(dp4a(a, b, c))
        if got != want:
            return _verdict([f"fn({a:#010x}, {b:#010x}, {c}) = {got}, expected {want}"])
    return _verdict([])


def check_lanes(type_name: str, lanes_of_second_block, kqs_of_lane: dict) -> Verdict:
    """Warp 0, first trip: which lanes work on weight block 1, and the word ``kqs`` of some lanes."""
    from ...cuda_sim.vecdotq import cuda_type
    t = cuda_type(type_name)
    tpb = t.threads_per_block
    want = [lane for lane in range(32) if lane // tpb == 1]
    problems = []
    if sorted(lanes_of_second_block) != want:
        problems.append(f"block 1 is read by lanes {want[0]}..{want[-1]}" if want else "no lane of warp 0 reaches block 1")
    for lane, k in kqs_of_lane.items():
        if k != t.vdr * (lane % tpb):
            problems.append(f"lane {lane}: kqs = {t.vdr * (lane % tpb)}, not {k}")
    return _verdict(problems)
