"""What the commands share: number arguments checked by argparse (so ``--n-ctx 0`` is a usage
error, exit 2, never a silent "default"), and strict JSON output (never NaN or Infinity)."""
from __future__ import annotations

import argparse
import json
import math
import re

import numpy as np

_INT = re.compile(r"[+-]?[0-9]+")   # ASCII digits only: int() would also take '١٢' and '1_0'


def parse_int(text: str) -> int:
    if not _INT.fullmatch(text.strip()):
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer")
    return int(text)


def positive_int(text: str) -> int:
    v = parse_int(text)
    if v <= 0:
        raise argparse.ArgumentTypeError(f"{text} must be a positive integer")
    return v


def nonnegative_int(text: str) -> int:
    v = parse_int(text)
    if v < 0:
        raise argparse.ArgumentTypeError(f"{text} must be >= 0")
    return v


def finite(obj):
    """``obj`` with every non-finite float replaced by the string "nan", "inf" or "-inf"."""
    if isinstance(obj, dict):
        return {k: finite(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [finite(v) for v in obj]
    if isinstance(obj, np.ndarray):
        return finite(obj.tolist())
    if isinstance(obj, (float, np.floating)):
        v = float(obj)
        return v if math.isfinite(v) else ("nan" if v != v else ("inf" if v > 0 else "-inf"))
    if isinstance(obj, np.integer):
        return int(obj)
    if isinstance(obj, np.bool_):
        return bool(obj)
    return obj


def dumps(obj, **kw) -> str:
    """Strict JSON (RFC 8259): non-finite floats become strings, anything else non-finite is an error."""
    return json.dumps(finite(obj), allow_nan=False, **kw)
