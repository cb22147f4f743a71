"""Checkers of notebook 07_dp4a_mmvq: launch arithmetic, dp4a by hand, which lanes read which block.

A wrong answer gets the rule it breaks, never the expected number."""
from __future__ import annotations

import numpy as np

from .verdict import Verdict, call_learner, needs_answer

# how each launch quantity is computed: the hint for a wrong value
LAUNCH_RULES = {
    "blocks_per_row": "K / qk: weight blocks in one row",
    "blocks_per_iter": "vdr * nwarps * 32 / qi: blocks one CUDA block takes per trip of the K loop",
    "iters": "trips of the K loop: blocks_per_row / blocks_per_iter, rounded up",
    "threads": "CUDA blocks in the grid x threads per CUDA block (32 * nwarps)",
    "weights_per_thread": "trips x rows per CUDA block x weights one vec_dot call multiplies (qk * vdr / qi)",
    "nwarps": "4 warps for 1-4 columns on the generic table, 2 for 5-8",
    "rows_per_block": "1 for one column unless small_k applies, then nwarps",
}


def _verdict(problems: list[str]) -> Verdict:
    return Verdict.not_yet("; ".join(problems)) if problems else Verdict.correct()


def check_launch(answer: dict, type_name: str, nrows: int, ncols: int, ncols_dst: int = 1) -> Verdict:
    """Compare your launch arithmetic (any of launch_params' keys) with the simulator's; a wrong value
    gets the rule it should follow and whether it is too large or too small."""
    from ...cuda_sim.launch import launch_params
    if not answer or all(v is None for v in answer.values()):
        return Verdict.unanswered("my_answer")
    want = launch_params(type_name, nrows, ncols, ncols_dst)
    problems = [f"unknown key {k!r}" for k in answer if k not in want]
    for k, v in answer.items():
        if k not in want or v is None:
            problems += [f"{k}: still None"] if k in want else []
            continue
        if tuple(np.atleast_1d(v)) != tuple(np.atleast_1d(want[k])):
            side = ""
            if np.ndim(v) == 0 and np.ndim(want[k]) == 0:
                side = " (too large)" if v > want[k] else " (too small)"
            problems.append(f"{k} = {v!r}{side}: {LAUNCH_RULES.get(k, 'see launch_params')}")
    return _verdict(problems)


def check_dp4a(fn, trials: int = 2000, seed: int = 0) -> Verdict:
    """Your ``fn(a, b, c)`` on Python ints (a, b as unsigned 32-bit patterns, c signed) against dp4a."""
    from ...cuda_sim.dp4a import dp4a
    rng = np.random.default_rng(seed)
    cases = [(0x01020304, 0x01010101, 0, "small positive bytes"), (0x80808080, 0x01010101, 0, "bytes >= 0x80 are negative"),
             (0xE0E0E0E0, 0x01020304, 5, "0xE0 is -32"), (0x7F7F7F7F, 0x7F7F7F7F, 2**31 - 1, "the sum must wrap like int32")]
    cases += [(int(a), int(b), int(c), "random words") for a, b, c in
              zip(rng.integers(0, 2**32, trials), rng.integers(0, 2**32, trials), rng.integers(-2**31, 2**31, trials))]
    for a, b, c, what in cases:
        got, bad = call_learner(fn, a, b, c)
        if bad is not None:
            return bad
        if got != int(dp4a(a, b, c)):
            return Verdict.not_yet(f"fn({a:#010x}, {b:#010x}, {c}) = {got} is off", f"check this case: {what}")
    return Verdict.correct(f"{len(cases)} cases")


@needs_answer("lanes_of_second_block")
def check_lanes(type_name: str, lanes_of_second_block, kqs_of_lane: dict) -> Verdict:
    """Warp 0, first trip: which lanes work on weight block 1, and the word ``kqs`` of some lanes."""
    from ...cuda_sim.vecdotq import cuda_type
    t = cuda_type(type_name)
    tpb = t.threads_per_block
    want = [lane for lane in range(32) if lane // tpb == 1]
    problems = []
    if sorted(lanes_of_second_block) != want:
        problems.append(f"the lanes on block 1 are those with lane // (qi/vdr) == 1; look up {t.name}'s qi and vdr"
                        if want else f"{t.name}: does one warp's first trip reach block 1 at all? compare 32 with qi/vdr")
    for lane, k in kqs_of_lane.items():
        if k != t.vdr * (lane % tpb):
            problems.append(f"lane {lane}: kqs = {k} is off; kqs = vdr * (lane % (qi/vdr))")
    return _verdict(problems)
