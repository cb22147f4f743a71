"""The KV cache against llama.cpp itself: memory sizes from its logs, sequence bookkeeping through its API."""
from __future__ import annotations


import numpy as np
import pytest

llama_cpp = pytest.importorskip("llama_cpp", reason="llama-cpp-python is not installed (optional oracle)")

from llmlab.llama.batch import Batch, BatchAllocator, BatchError  # noqa: E402
from llmlab.ggml.gguf import GGUFFile  # noqa: E402
from llmlab.llama.kv_cache import KVCache, kv_cache_bytes  # noqa: E402
from llmlab.llama.kv_cache_iswa import KVCacheISWA, make_kv_cache  # noqa: E402
from llmlab.llamacpp.eval_callback import _logs, kv_cache_report  # noqa: E402

MiB = 1024 * 1024


def cache_for(path, n_ctx, type_k, n_ubatch=512):
    """llmlab's cache for a model, sized as llama.cpp sizes it (swa_full off)."""
    kv = GGUFFile(path).kv
    arch = kv["general.architecture"]
    n_layer, n_head_kv = kv[f"{arch}.block_count"], kv[f"{arch}.attention.head_count_kv"]
    n_embd, n_head = kv[f"{arch}.embedding_length"], kv[f"{arch}.attention.head_count"]
    head_k = kv.get(f"{arch}.attention.key_length", n_embd // n_head)
    head_v = kv.get(f"{arch}.attention.value_length", n_embd // n_head)
    swa = [il for il in range(n_layer) if il % 6 != 5] if arch == "gemma3" else []   # Gemma 3: 5 local, 1 global
    return make_kv_cache(n_ctx, n_layer, head_k * n_head_kv, head_v * n_head_kv, swa_layers=swa,
                         n_swa=kv.get(f"{arch}.attention.sliding_window", 0), type_k=type_k, n_ubatch=n_ubatch,
                         allocate=False)


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


class LlamaSession:
    """A llama.cpp context with a unified KV cache for several sequences, driven through the C API."""

    def __init__(self, path, n_ctx=256, n_seq_max=3):
        lc = self.lc = llama_cpp
        _logs(lc)
        self.model = lc.llama_model_load_from_file(str(path).encode(), lc.llama_model_default_params())
        cp = lc.llama_context_default_params()
        cp.n_ctx, cp.n_batch, cp.n_ubatch, cp.n_seq_max = n_ctx, 64, 16, n_seq_max
        cp.kv_unified = True
        cp.n_threads = cp.n_threads_batch = 1
        self.ctx = lc.llama_init_from_model(self.model, cp)
        self.mem = lc.llama_get_memory(self.ctx)

    def decode(self, batch: Batch) -> int:
        lc = self.lc
        n = batch.n_tokens
        b = lc.llama_batch_init(n, 0, 4)
        try:
            for i in range(n):
                b.token[i], b.pos[i], b.logits[i] = batch.tokens[i], batch.pos[i], batch.logits[i]
                b.n_seq_id[i] = len(batch.seq_ids[i])
                for j, s in enumerate(batch.seq_ids[i]):
                    b.seq_id[i][j] = s
            b.n_tokens = n
            return lc.llama_decode(self.ctx, b)
        finally:
            lc.llama_batch_free(b)

    def pos_range(self, s):
        return self.lc.llama_memory_seq_pos_min(self.mem, s), self.lc.llama_memory_seq_pos_max(self.mem, s)

    def close(self):
        self.lc.llama_free(self.ctx)
        self.lc.llama_model_free(self.model)


OPS = {
    "seq_rm": lambda c, s, p0, p1: c.seq_rm(s, p0, p1),
    "seq_cp": lambda c, a, b, p0, p1: c.seq_cp(a, b, p0, p1),
    "seq_keep": lambda c, s: c.seq_keep(s),
    "seq_add": lambda c, s, p0, p1, d: c.seq_add(s, p0, p1, d),
    "seq_div": lambda c, s, p0, p1, d: c.seq_div(s, p0, p1, d),
}
LLAMA_OPS = {
    "seq_rm": "llama_memory_seq_rm", "seq_cp": "llama_memory_seq_cp", "seq_keep": "llama_memory_seq_keep",
    "seq_add": "llama_memory_seq_add", "seq_div": "llama_memory_seq_div",
}


def run_script(path, script, n_seq=3):
    """Apply the same decodes and sequence operations to llama.cpp and to llmlab; compare after each step."""
    sess = LlamaSession(path, n_seq_max=n_seq)
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
                assert sess.decode(batch) == 0, step
            else:
                OPS[step[0]](ours, *step[1:])
                getattr(llama_cpp, LLAMA_OPS[step[0]])(sess.mem, *step[1:])
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
    sess = LlamaSession(smollm2_path)
    ours = KVCache(256, 1, 4, n_seq_max=3, allocate=False)
    try:
        first = Batch.from_tokens([1, 2, 3])
        assert sess.decode(first) == 0
        ubs = BatchAllocator(first, n_seq_max=3, memory=ours).split_all(16)
        ours.apply_ubatch(ours.prepare(ubs)[0], ubs[0])
        bad = Batch.from_tokens([4], pos0=5)                         # a gap: 3, 4 are missing
        assert sess.decode(bad) != 0
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
    lc = llama_cpp
    _logs(lc)
    model = lc.llama_model_load_from_file(str(gemma3_path).encode(), lc.llama_model_default_params())
    cp = lc.llama_context_default_params()
    cp.n_ctx, cp.n_batch, cp.n_ubatch, cp.swa_full = 2048, 512, 512, False
    cp.n_threads = cp.n_threads_batch = 2
    ctx = lc.llama_init_from_model(model, cp)
    mem = lc.llama_get_memory(ctx)
    ours = cache_for(gemma3_path, 2048, "f16")
    try:
        assert isinstance(ours, KVCacheISWA) and ours.swa.size == 1024
        sess = LlamaSession.__new__(LlamaSession)
        sess.lc, sess.ctx, sess.mem = lc, ctx, mem
        start = 0
        for n in (512, 512, 300, 76):
            batch = Batch.from_tokens(range(1000, 1000 + n), pos0=start)
            ubs = BatchAllocator(batch, memory=ours).split_all(512)
            for ub, slots in zip(ubs, ours.prepare(ubs)):
                ours.apply_ubatch(slots, ub)
            assert sess.decode(batch) == 0
            start += n
            assert (ours.seq_pos_min(0), ours.seq_pos_max(0)) == sess.pos_range(0)
            assert ours.base.seq_pos_min(0) == 0                     # the global layers keep everything
        assert ours.seq_pos_min(0) > 0                                # the window cache has dropped old positions
    finally:
        lc.llama_free(ctx)
        lc.llama_model_free(model)
