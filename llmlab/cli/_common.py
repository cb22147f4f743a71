"""What the commands share: number arguments checked by argparse (so ``--n-ctx 0`` is a usage
error, exit 2, never a silent "default"), and strict JSON output (never NaN or Infinity).

Every number a command takes goes through one parser, ``llmlab.config``'s ``parse_int`` and
``parse_float`` (the one the LLMLAB_* variables use too): ASCII digits only, so ``-n ١٠``,
``--seed ٣``, ``--n-ctx 1_0`` and ``--temp infinity`` are refused.
"""
from __future__ import annotations

import argparse
import json
import math

import numpy as np

from .. import config


def parse_int(text: str) -> int:
    """Any integer (an argparse ``type``)."""
    try:
        return config.parse_int(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


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


def parse_float(text: str) -> float:
    """A finite decimal number (an argparse ``type``): not inf or nan."""
    try:
        return config.parse_float(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def add_flash_attn(p, default: str = "off") -> None:
    """llama.cpp's ``-fa, --flash-attn [on|off|auto]``; a bare ``--flash-attn`` (llmlab's older flag) means on.
    ``auto`` is what llama.cpp resolves it to on the CPU backend, which runs flash attention: on."""
    p.add_argument("-fa", "--flash-attn", nargs="?", const="on", default=default, choices=("on", "off", "auto"),
                   metavar="on|off|auto", help=f"the flash-attention path (default: {default}; auto: on, as llama.cpp "
                                                "decides on the CPU)")


def flash_attn(args) -> bool:
    return args.flash_attn in ("on", "auto")


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
