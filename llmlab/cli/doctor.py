"""``doctor``: is this machine ready for llmlab and its notebooks (see :mod:`llmlab.doctor`)."""
from __future__ import annotations

from .. import doctor


def register(sub) -> None:
    p = sub.add_parser("doctor", help="check Python, packages, Graphviz, fonts, CPU profile and numba's cache; "
                                      f"exit {doctor.EXIT_MISSING} with an install hint when a required piece is missing",
                       description="One line per check (ok, warn, missing), an install hint for this system under each "
                                   "missing piece. Exit status 0 when every required piece is here (fonts and "
                                   f"llama-cpp-python are optional), {doctor.EXIT_MISSING} when one is missing, "
                                   "2 for a usage error.")
    doctor.add_arguments(p)
    p.set_defaults(func=doctor.run)
