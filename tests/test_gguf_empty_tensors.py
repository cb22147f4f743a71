"""Tensors with a zero dimension: llama.cpp's gguf.cpp (0.3.36) reads them (it refuses only ne < 0), with
ggml_nbytes 0, so the next tensor may start at the same offset. llmlab's reader and ``gguf-dump`` accept them
the same way; a model that needs such a tensor is still refused by the model's own shape checks."""
from __future__ import annotations

import json
import os
import struct
import subprocess
import sys
from pathlib import Path

import pytest

from llmlab.ggml.gguf import GGUFError, GGUFFile

ROOT = Path(__file__).resolve().parent.parent
F32, Q4_0 = 0, 2


def _s(b: bytes) -> bytes:
    return struct.pack("<Q", len(b)) + b


def gguf(tensors, data: bytes, align: int = 32) -> bytes:
    """GGUF v3 bytes, no metadata; tensors: (name, dims, type id, offset)."""
    out = b"GGUF" + struct.pack("<IQQ", 3, len(tensors), 0)
    out += b"".join(_s(n.encode()) + struct.pack("<I", len(d)) + struct.pack(f"<{len(d)}Q", *d) +
                    struct.pack("<IQ", ty, off) for n, d, ty, off in tensors)
    return out + bytes(-len(out) % align) + data


@pytest.fixture
def empty_first(tmp_path) -> Path:
    """An empty f32 [8, 0] and an empty q4_0 [0, 4] at offset 0, then an f32 [8] at offset 0 too (gguf.cpp pads
    the empty tensors' 0 bytes to 0)."""
    p = tmp_path / "empty.gguf"
    p.write_bytes(gguf([("e", [8, 0], F32, 0), ("q", [0, 4], Q4_0, 0), ("t", [8], F32, 0)],
                       struct.pack("<8f", *range(8))))
    return p


def test_the_reader_takes_an_empty_tensor(empty_first):
    f = GGUFFile(empty_first)
    e, q, t = f.tensor("e"), f.tensor("q"), f.tensor("t")
    assert (e.shape, e.nbytes, e.n_elements) == ((8, 0), 0, 0) and e.array.shape == (0, 8)
    assert (q.nbytes, q.blocks.shape) == (0, (4, 0))
    assert t.array.tolist() == list(range(8))
    assert [s.label for s in f.spans if s.kind == "tensor_data"] == ["t"]     # nothing to show for empty ones


def test_a_negative_dimension_is_still_refused(tmp_path):
    p = tmp_path / "neg.gguf"
    p.write_bytes(gguf([("t", [8, 2**64 - 1], F32, 0)], bytes(32)))
    with pytest.raises(GGUFError, match=r"ne\[1\] = -1, must be >= 0"):
        GGUFFile(p)


def test_gguf_dump_shows_an_empty_tensor(empty_first):
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    text = subprocess.run([sys.executable, "-m", "llmlab", "gguf-dump", str(empty_first)], capture_output=True,
                          text=True, env=env, timeout=120)
    assert text.returncode == 0 and text.stderr == "", text.stderr
    assert "[8, 0]" in text.stdout and "unexpected" not in text.stdout
    js = subprocess.run([sys.executable, "-m", "llmlab", "gguf-dump", str(empty_first), "--json"],
                        capture_output=True, text=True, env=env, timeout=120)
    assert js.returncode == 0, js.stderr
    rows = {t["name"]: t for t in json.loads(js.stdout)["tensors"]}
    assert rows["e"]["nbytes"] == 0 and rows["q"]["nbytes"] == 0 and rows["t"]["nbytes"] == 32
