"""``--cpu auto|avx2|avx512|arm_dotprod_fp16|arm_i8mm``: whose llama.cpp arithmetic a command reproduces, and ``--kernels
fast|reference``: how it computes it (shared by the commands that compute: logits, generate, chat,
bench, diff-llama-cpp)."""
from __future__ import annotations

import sys


def add_cpu_argument(p) -> None:
    from ..ggml.cpu import profiles
    p.add_argument("--cpu", default=None, choices=profiles.CHOICES,
                   help="CPU profile to reproduce bit for bit (default auto: LLMLAB_CPU, else this machine's "
                        "llama.cpp build, else its CPU flags)")


def add_kernels_argument(p) -> None:
    p.add_argument("--kernels", choices=("fast", "reference"), default="fast",
                   help="numba kernels or the NumPy reference ops (the same bits; default fast)")


def resolve_cpu(args):
    """The profile a command runs with; says once, in one line on stderr, when its results will not be
    bit-identical to this machine's llama.cpp."""
    from ..ggml.cpu import profiles
    choice = getattr(args, "cpu", None)
    if choice in (None, "auto"):
        return profiles.warn_if_unreproduced().profile
    prof = profiles.get(choice)
    here = profiles.detect()
    if here.source != "LLMLAB_CPU" and here.reproduced and here.profile is not prof:
        print(f"llmlab: emulating {prof.name}; this machine's llama.cpp computes {here.profile.name}, "
              f"so results will not be bit-identical to it", file=sys.stderr)
    return prof
