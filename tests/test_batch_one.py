"""batch.split_one, a decode step's fast path: the micro-batch BatchAllocator makes, or None (and the
allocator says what is wrong); KVCache.kq_mask written in place equals the mask it returns."""
import numpy as np
import pytest

from llmlab.llama.batch import Batch, BatchAllocator, BatchError, split_one
from llmlab.llama.kv_cache import KVCache
from llmlab.llama.kv_cache_iswa import KVCacheISWA


def _cache(n_prompt=5, n_seq_max=2):
    c = KVCache(256, 1, 8, n_seq_max=n_seq_max, allocate=False)
    ub = BatchAllocator(Batch.from_tokens(range(n_prompt)), memory=c, n_seq_max=n_seq_max).split_all(512)[0]
    c.apply_ubatch(c.prepare([ub])[0], ub)
    return c


@pytest.mark.parametrize("batch", [Batch.from_tokens([7], pos0=5), Batch.get_one([3]), Batch.from_tokens([2], pos0=0, seq_id=1),
                                   Batch.from_tokens([9], pos0=5, logits="none"), Batch().add(4, 5, 0, True)])
def test_split_one_is_the_allocators_micro_batch(batch):
    c = _cache()
    got = split_one(batch, n_vocab=10, n_seq_max=2, memory=c)
    want = BatchAllocator(batch, n_vocab=10, n_seq_max=2, memory=c).split_all(1)[0]
    assert got is not None
    for f in ("tokens", "pos", "output", "batch_idxs"):
        a, b = getattr(got, f), getattr(want, f)
        assert a.dtype == b.dtype and a.tolist() == b.tolist(), f
    assert (got.seq_ids, got.n_seqs, got.equal_seqs) == (want.seq_ids, want.n_seqs, want.equal_seqs)


@pytest.mark.parametrize("batch", [Batch.from_tokens([10], pos0=5), Batch.from_tokens([-1], pos0=5),
                                   Batch.from_tokens([1], pos0=7), Batch.from_tokens([1], pos0=4),
                                   Batch.from_tokens([1], pos0=5, seq_id=2), Batch.from_tokens([1], pos0=5, seq_id=(0, 1)),
                                   Batch([1], [5], [(0,)], [1]), Batch([np.int64(1)], [5], [(0,)], [True]),
                                   Batch([True], [5], [(0,)], [True]), Batch.from_tokens([1, 2], pos0=5)])
def test_split_one_leaves_anything_unusual_to_the_allocator(batch):
    c = _cache()
    assert split_one(batch, n_vocab=10, n_seq_max=2, memory=c) is None
    try:
        BatchAllocator(batch, n_vocab=10, n_seq_max=2, memory=c).split_all(1)
    except BatchError:
        pass                                    # what it says is the allocator's, as before


@pytest.mark.parametrize("swa", [False, True])
def test_kq_mask_in_place_is_the_mask(swa):
    c = (KVCacheISWA(512, [0], [1], 8, n_swa=3, allocate=False) if swa else _cache())
    for p in range(0 if swa else 5, 12):
        ub = split_one(Batch.from_tokens([1], pos0=p), n_vocab=10, n_seq_max=1, memory=c)
        c.apply_ubatch(c.prepare([ub])[0], ub)
        for il in ([0, 1] if swa else [None]):
            want = c.kq_mask(ub, 256, il=il)
            out = np.full((1, 256), np.nan, np.float32)
            assert c.kq_mask(ub, 256, il=il, out=out) is out
            assert np.array_equal(out, want) and np.isinf(want).any() and (want == 0).any()
