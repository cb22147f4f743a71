"""The packed-weight cache of the fast path lives as long as the weight's bytes: a second model loaded in
the same notebook (or a bench's second round) does not keep the first one's packed copy, and an entry of
a freed or closed mapping is never served for new bytes at the same address."""
from __future__ import annotations

import gc
import mmap

import numpy as np

from llmlab.ggml.cpu.fast import dispatch
from llmlab.ggml.types import ggml_type

Q8 = ggml_type("q8_0")


def _pack(rows, name, K):
    return (rows.copy(),)


def _keys(w) -> set:
    """The cache's keys for the bytes of w (one test's own entries, whatever earlier tests left behind)."""
    addr = w.__array_interface__["data"][0]
    return {k for k in dispatch._PACKED if k[0] == addr and k[-1] is _pack}


def _weights(tmp_path, fill: int):
    f = (tmp_path / f"w{fill}.bin")
    f.write_bytes(bytes([fill]) * (4 * 34))
    fh = open(f, "rb")
    m = mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ)
    fh.close()
    return m, np.frombuffer(m, np.uint8).reshape(4, 34)


def test_entry_leaves_with_its_mapping(tmp_path):
    m, w = _weights(tmp_path, 1)
    R, (p,) = dispatch.packed(w, Q8, 32, _pack)
    mine = _keys(w)
    assert R == 4 and (p == 1).all() and len(mine) == 1
    assert dispatch.packed(w, Q8, 32, _pack)[1][0] is p             # cached
    del w, m
    gc.collect()
    assert not mine & dispatch._PACKED.keys()


def test_closed_mapping_is_not_served(tmp_path):
    m, w = _weights(tmp_path, 2)
    key_addr = w.__array_interface__["data"][0]
    dispatch.packed(w, Q8, 32, _pack)
    hit = next(v for k, v in dispatch._PACKED.items() if k[0] == key_addr and k[-1] is _pack)
    assert hit[0]() and hit[1]() is not None
    del w
    m.close()
    assert not hit[0]() and hit[1]() is None                       # a new map at that address repacks


def test_private_array_entry_leaves_with_it():
    w = np.full((4, 34), 3, np.uint8)
    dispatch.packed(w[1:], Q8, 32, _pack)                           # a view: its owner's lifetime counts
    mine = _keys(w[1:])
    assert len(mine) == 1
    del w
    gc.collect()
    assert not mine & dispatch._PACKED.keys()
