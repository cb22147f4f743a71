"""Comparing with the live llama.cpp, honestly: bit for bit where llmlab reproduces this machine's
llama.cpp build (its CPU profile), within a tolerance elsewhere (an ARM laptop, an x86 without AVX2),
without stopping a learner's run."""
from __future__ import annotations

import numpy as np

from ..ggml.cpu import profiles


def banner(cpu=None) -> tuple[profiles.CPUProfile, bool]:
    """Print the profile llmlab runs with and whether it is this machine's llama.cpp; return both."""
    prof = profiles.resolve(cpu)
    exact = profiles.bit_identical_here(prof)
    print(f"CPU profile: {prof.name} ({prof.title}); bit-identical on this CPU: {'yes' if exact else 'no'}")
    return prof, exact


def expect(exact_here: bool, same: bool, what: str, close: bool | None = None) -> bool:
    """Where llmlab reproduces this CPU, ``same`` must hold (an AssertionError otherwise); elsewhere
    report whether the values at least agree within the tolerance (``close``) and carry on."""
    if exact_here:
        assert same, f"{what}: expected bit-identical to llama.cpp on this CPU"
        return True
    status = "agree within tolerance" if close or close is None and same else "differ beyond tolerance"
    print(f"{what}: {'identical' if same else status} (this CPU is not reproduced bit for bit)")
    return bool(same or close)


def close(a, b, rtol: float = 1e-2) -> bool:
    """Normwise relative agreement: max |a - b| <= rtol * max |b| (infinities must coincide)."""
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    fin = np.isfinite(b)
    if not np.array_equal(np.isfinite(a), fin):
        return False
    scale = np.abs(b[fin]).max() if fin.any() else 0.0
    return bool(np.abs(a[fin] - b[fin]).max(initial=0.0) <= rtol * max(scale, 1e-30))
