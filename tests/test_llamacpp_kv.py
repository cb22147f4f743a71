"""The KV cache against llama.cpp itself: memory sizes from its logs, sequence bookkeeping through its API."""
from __future__ import annotations


import numpy as np
import pytest

llama_cpp = pytest.importorskip("llama_cpp", reason="llama-cpp-python is not installed (optional oracle)")

from llmlab.llama.batch import Batch, BatchAllocator, BatchError  # noqa: E402
from llmlab.ggml.gguf import GGUFFile  # noqa: E402
from llmlab.llama.kv_cache import KVCache, kv_cache_bytes  # noqa: E402
from llmlab.llama.kv_cache_iswa import KVCacheISWA, make_kv_cache  # noqa: E402
from llmlab.llama import load_hparams  # noqa: E402
from llmlab.llamacpp.eval_callback import kv_cache_report  # noqa: E402
from llmlab.llamacpp.session import Session  # noqa: E402
from llmlab.llamacpp.worker import open_remote  # noqa: E402

MiB = 1024 * 1024


def cache_for(path, n_ctx, type_k, n_ubatch=512):
    """llmlab's cache for a model, sized as llama.cpp sizes it (swa_full off)."""
    hp = load_hparams(GGUFFile(path).kv)
    swa = [il for il in range(hp.n_layer) if hp.is_swa(il)]          # Gemma 3: 5 local layers, then 1 global
    return make_kv_cache(n_ctx, hp.n_layer, hp.n_embd_k_gqa, hp.n_embd_v_gqa, swa_layers=swa, n_swa=hp.n_swa,
                         type_k=type_k, n_ubatch=n_ubatch, allocate=False)


@pytest.mark.parametrize("type_k", ["f32", "f16", "q8_0"])
def test_memory_accounting_matches_llama_cpp(real_model, type_k):
    name, path = real_model
    n_ctx = 4096
    got = kv_cache_report(path, n_ctx, type_k, flash_attn=type_k == "q8_0", swa_full=False)
    ours = cache_for(path, n_ctx, type_k)
    caches = ours.caches if isinstance(ours, KVCacheISWA) else (ours,)
    assert len(got) == len(caches)
    for rep, c in zip(got, caches):
        assert (rep["cells"], rep["layers"], rep["type_k"]) == (c.size, len(c.layers), type_k)
        assert abs(c.size_k_bytes() / MiB - rep["k_mib"]) <= 0.005
        assert abs(c.size_v_bytes() / MiB - rep["v_mib"]) <= 0.005
        assert c.total_bytes() == kv_cache_bytes(c.size, len(c.layers), c.n_embd_k_gqa, c.n_embd_v_gqa, type_k)


def llama_session(path, n_ctx=256, n_batch=64, n_ubatch=16, n_seq_max=3, n_threads=1, **kw):
    """A llama.cpp context (flash attention as llama.cpp chooses) in the llama.cpp worker, by default with
    a unified KV cache for several sequences."""
    kw.setdefault("kv_unified", True)
    return open_remote(Session, str(path), n_ctx=n_ctx, n_batch=n_batch, n_ubatch=n_ubatch, n_seq_max=n_seq_max,
                       n_threads=n_threads, flash_attn="auto", **kw)


def decode(sess, batch: Batch) -> int:
    """llama_decode of an llmlab Batch (its tokens, positions, sequences and output flags)."""
    return sess.decode([int(t) for t in batch.tokens], pos=[int(p) for p in batch.pos],
                       seq_ids=[[int(s) for s in ids] for ids in batch.seq_ids],
                       logits=[bool(x) for x in batch.logits])


OPS = {
    "seq_rm": lambda c, s, p0, p1: c.seq_rm(s, p0, p1),
    "seq_cp": lambda c, a, b, p0, p1: c.seq_cp(a, b, p0, p1),
    "seq_keep": lambda c, s: c.seq_keep(s),
    "seq_add": lambda c, s, p0, p1, d: c.seq_add(s, p0, p1, d),
    "seq_div": lambda c, s, p0, p1, d: c.seq_div(s, p0, p1, d),
}


def run_script(path, script, n_seq=3):
    """Apply the same decodes and sequence operations to llama.cpp and to llmlab; compare after each step."""
    sess = llama_session(path, n_seq_max=n_seq)
    ours = KVCache(256, 1, 4, n_seq_max=n_seq, allocate=False)
    try:
        for step in script:
            if step[0] == "decode":
                _, seq, n = step
                start = ours.seq_pos_max(seq) + 1
                batch = Batch.from_tokens(range(100, 100 + n), pos0=start, seq_id=seq)
                ubs = BatchAllocator(batch, n_seq_max=n_seq, memory=ours).split_all(16)
                for ub, slot in zip(ubs, ours.prepare(ubs)):
                    ours.apply_ubatch(slot, ub)
                assert decode(sess, batch) == 0, step
            else:
                OPS[step[0]](ours, *step[1:])
                getattr(sess, step[0])(*step[1:])          # llama_memory_seq_rm, ... of the same name
            for s in range(n_seq):
                assert (ours.seq_pos_min(s), ours.seq_pos_max(s)) == sess.pos_range(s), (step, s)
    finally:
        sess.close()


def test_sequence_operations_agree_with_llama_cpp(smollm2_path):
    run_script(smollm2_path, [
        ("decode", 0, 10), ("seq_cp", 0, 1, -1, -1), ("seq_cp", 0, 2, 0, 5), ("seq_rm", 0, 7, -1),
        ("decode", 1, 3), ("decode", 2, 3), ("seq_add", 1, 3, -1, -2), ("decode", 0, 2),
        ("seq_keep", 1), ("seq_div", 1, 0, -1, 2), ("seq_rm", -1, 4, 6), ("decode", 1, 4),
        ("seq_add", 1, 0, 3, -10), ("decode", 2, 20), ("seq_rm", 2, -1, -1), ("decode", 2, 5),
    ])


def test_random_operation_sequences_agree_with_llama_cpp(smollm2_path):
    rng = np.random.default_rng(7)
    script = [("decode", 0, 6)]
    for _ in range(30):
        k = rng.integers(6)
        s, t = int(rng.integers(3)), int(rng.integers(3))
        p0, p1 = int(rng.integers(-1, 20)), int(rng.integers(-1, 30))
        if k <= 1:
            script.append(("decode", s, int(rng.integers(1, 9))))
        elif k == 2:
            script.append(("seq_rm", s - (rng.random() < 0.2) * (s + 1), p0, p1))
        elif k == 3:
            if s != t:
                script += [("seq_rm", t, -1, -1), ("seq_cp", s, t, p0, p1)]
        elif k == 4:
            script.append(("seq_add", s, p0, p1, int(rng.integers(-6, 7))))
        else:
            script.append(("seq_div", s, p0, p1, int(rng.integers(1, 4))) if rng.random() < 0.5 else ("seq_keep", s))
    run_script(smollm2_path, script)


def test_inconsistent_positions_are_refused_by_both(smollm2_path):
    sess = llama_session(smollm2_path)
    ours = KVCache(256, 1, 4, n_seq_max=3, allocate=False)
    try:
        first = Batch.from_tokens([1, 2, 3])
        assert decode(sess, first) == 0
        ubs = BatchAllocator(first, n_seq_max=3, memory=ours).split_all(16)
        ours.apply_ubatch(ours.prepare(ubs)[0], ubs[0])
        bad = Batch.from_tokens([4], pos0=5)                         # a gap: 3, 4 are missing
        assert decode(sess, bad) != 0
        with pytest.raises(BatchError, match="Y = X \\+ 1"):
            BatchAllocator(bad, n_seq_max=3, memory=ours)
    finally:
        sess.close()




@pytest.mark.parametrize("type_k", ["f16", "q8_0"])
def test_stored_rows_are_llama_cpp_cache_rows(smollm2_path, type_k):
    """K rows written by KVCache.store are byte for byte the rows llama.cpp's SET_ROWS writes into its cache."""
    from llmlab.llamacpp import capture
    ids = [1, 504, 1463, 282, 260, 3606]
    cap = capture(smollm2_path, ids, flash_attn=True, type_k=type_k)
    # the SET_ROWS that writes layer 0's K cache, and the rows it reads (a quantized cache gets rotated K rows)
    i, set_rows = next((i, n) for i, n in enumerate(cap.nodes) if n.op == "SET_ROWS" and "cache_k_l0" in n.src)
    src = next(n for n in reversed(cap.nodes[:i]) if n.name == set_rows.src[0])
    k_cur = src.values.reshape(len(ids), -1)
    theirs = set_rows.values
    theirs = theirs.reshape(theirs.shape[-2], -1)[: len(ids)]
    cache = KVCache(256, [0], k_cur.shape[1], type_k=type_k)
    ubs = BatchAllocator(Batch.from_tokens(ids), memory=cache).split_all(len(ids))
    (slot,) = cache.prepare(ubs)
    cache.apply_ubatch(slot, ubs[0])
    cache.store(0, slot, k_cur, k_cur)
    ours = cache.k(0, len(ids))
    assert np.array_equal(ours.view(np.uint8).reshape(len(ids), -1), theirs.view(np.uint8).reshape(len(ids), -1))


@pytest.mark.slow
def test_sliding_window_cache_recycles_like_llama_cpp(gemma3_path):
    """1400 tokens through Gemma 3 with a 1024-cell window cache: both purge the same old positions."""
    sess = llama_session(gemma3_path, n_ctx=2048, n_batch=512, n_ubatch=512, n_seq_max=1, n_threads=2,
                         swa_full=False, kv_unified=None)
    ours = cache_for(gemma3_path, 2048, "f16")
    try:
        assert isinstance(ours, KVCacheISWA) and ours.swa.size == 1024
        start = 0
        for n in (512, 512, 300, 76):
            batch = Batch.from_tokens(range(1000, 1000 + n), pos0=start)
            ubs = BatchAllocator(batch, memory=ours).split_all(512)
            for ub, slots in zip(ubs, ours.prepare(ubs)):
                ours.apply_ubatch(slots, ub)
            assert decode(sess, batch) == 0
            start += n
            assert (ours.seq_pos_min(0), ours.seq_pos_max(0)) == sess.pos_range(0)
            assert ours.base.seq_pos_min(0) == 0                     # the global layers keep everything
        assert ours.seq_pos_min(0) > 0                                # the window cache has dropped old positions
    finally:
        sess.close()
