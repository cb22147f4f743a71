"""The KV-cache pictures and tables of notebook 04 render and say what the cache holds."""
from __future__ import annotations

import matplotlib

matplotlib.use("Agg")

from llmlab.llama.batch import Batch, BatchAllocator  # noqa: E402
from llmlab.llama.kv_cache import KVCache  # noqa: E402
from llmlab.viz import kv as V  # noqa: E402


def filled_cache():
    c = KVCache(16, 1, 4, n_seq_max=2, allocate=False)
    for b in (Batch.from_tokens(range(5)), Batch.from_tokens(range(3), seq_id=1)):
        ubs = BatchAllocator(b, n_seq_max=2, memory=c).split_all(4)
        for ub, s in zip(ubs, c.prepare(ubs)):
            c.apply_ubatch(s, ub)
    c.seq_rm(0, 1, 3)
    return c


def test_cell_strip_and_history_render():
    c = filled_cache()
    fig = V.plot_cells(c, per_row=8)
    assert "used 6/16, head 1" in fig.axes[0].get_title(loc="left")
    texts = [t.get_text() for t in fig.axes[0].texts]
    assert texts == ["0", "3", "4", "0", "1", "2"]           # positions of the non-empty cells, in cell order
    fig = V.plot_history([("a", KVCache(16, 1, 4, allocate=False)), ("b", c.snapshot())], per_row=16)
    assert len(fig.axes) == 2


def test_find_slot_frames_follow_the_trace():
    c = filled_cache()
    ub = BatchAllocator(Batch.get_one([1, 2, 3]), n_seq_max=2, memory=c).split_all(4)[0]
    trace, slot = V.find_slot_steps(c, ub)
    assert slot.idxs.tolist() == [1, 2, 8] and trace == [(1, True), (2, True), (3, False), (4, False),
                                                          (5, False), (6, False), (7, False), (8, True)]
    fig = V.plot_find_slot(c, ub, n_frames=3)
    assert len(fig.axes) == 3 and "cells [1, 2, 8]" in fig.texts[0].get_text()
    assert c.head == 1 and c.used == 6                        # drawing changed nothing


def test_memory_table_reproduces_the_formula():
    rows = V.kv_size_rows([dict(name="LLaMA-7B", n_layer=32, n_embd_gqa=4096),
                           dict(name="LLaMA-70B", n_layer=80, n_embd_gqa=1024)], [2048, 4096], ["f16"])
    sizes = {(r["model"], r["n_ctx"]): r["bytes"] for r in rows}
    assert sizes[("LLaMA-7B", 2048)] == 2048 * 32 * 2 * 4096 * 2 == 2**30
    assert sizes[("LLaMA-7B", 4096)] == 2**31
    assert sizes[("LLaMA-70B", 2048)] == 2048 * 80 * 2 * 1024 * 2
    html = str(V.kv_size_table(rows))
    assert "2048×32×2×4096×2" in html and "1.00 GiB" in html


def test_ubatch_table_shrinks_q_not_k():
    rows = V.ubatch_attention_rows(1024, 512, 1536, head_dim=128)
    assert [r["kq"] for r in rows] == [(1024, 1536), (512, 1536), (512, 1536)]
    assert rows[0]["bytes"] == 2 * rows[1]["bytes"] == 6 * 2**20
    assert all(r["k"] == (1536, 128) for r in rows)
