"""KV cache and batches: llmlab's array version against a line-by-line transliteration of llama.cpp's loops.

``RefCache`` below is llama.cpp's ``llama_kv_cells`` + ``llama_kv_cache`` (src/llama-kv-cells.h,
src/llama-kv-cache.cpp, llama.cpp as vendored by llama-cpp-python 0.3.36) written cell by cell with
Python sets, the way the C++ reads. The hypothesis state machines drive both through random
sequences of decodes and sequence operations and require identical cells, head and slots.
"""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from llmlab.llama.batch import Batch, BatchAllocator, BatchError, UBatch, split_simple
from llmlab.llama.hparams import HParams
from llmlab.llama.kv_cache import KVCache, kv_cache_bytes
from llmlab.llama.kv_cache_iswa import KVCacheISWA, swa_cache_size
from llmlab.llama.memory import ContextFullError, Memory, context_shift

INT_MAX = 2**31 - 1


# ------------------------------------------------------------------------------------------------------------
# reference: llama.cpp's loops, cell by cell
# ------------------------------------------------------------------------------------------------------------
class RefCache:
    def __init__(self, size, n_seq_max=1, n_swa=0, swa_type="none"):
        self.size, self.n_swa, self.swa_type = size, n_swa, swa_type
        self.pos = [-1] * size
        self.seq = [set() for _ in range(size)]
        self.shift = [0] * size
        self.head = 0

    def used(self):
        return sum(p != -1 for p in self.pos)

    def seq_pos_max(self, s):
        ps = [p for p, ss in zip(self.pos, self.seq) if s in ss]
        return max(ps) if ps else -1

    def seq_pos_min(self, s):
        ps = [p for p, ss in zip(self.pos, self.seq) if s in ss]
        return min(ps) if ps else -1

    def masked(self, p0, p1):
        return self.swa_type == "standard" and p1 - p0 >= self.n_swa

    def rm(self, i):
        self.pos[i], self.seq[i], self.shift[i] = -1, set(), 0

    @staticmethod
    def rng(p0, p1):
        return (0 if p0 is None or p0 < 0 else p0), (INT_MAX if p1 is None or p1 < 0 else p1)

    def seq_rm(self, seq_id, p0, p1):
        p0, p1 = self.rng(p0, p1)
        new_head = self.size
        for i in range(self.size):
            if not (p0 <= self.pos[i] < p1):
                continue
            if seq_id < 0:
                self.rm(i)
                if new_head == self.size:
                    new_head = i
            elif seq_id in self.seq[i]:
                self.seq[i].discard(seq_id)
                if not self.seq[i]:
                    self.rm(i)
                    if new_head == self.size:
                        new_head = i
        if new_head != self.size and new_head < self.head:
            self.head = new_head

    def seq_cp(self, a, b, p0, p1):
        if a == b:
            return
        p0, p1 = self.rng(p0, p1)
        for i in range(self.size):
            if p0 <= self.pos[i] < p1 and a in self.seq[i]:
                self.seq[i].add(b)

    def seq_keep(self, s):
        new_head = self.size
        for i in range(self.size):
            if s in self.seq[i]:
                self.seq[i] = {s}
            elif self.seq[i]:
                self.rm(i)
                if new_head == self.size:
                    new_head = i
        if new_head != self.size and new_head < self.head:
            self.head = new_head

    def seq_add(self, s, p0, p1, d):
        if d == 0:
            return
        p0, p1 = self.rng(p0, p1)
        if p0 == p1:
            return
        new_head = self.size
        for i in range(self.size):
            if p0 <= self.pos[i] < p1 and s in self.seq[i]:
                self.pos[i] += d
                self.shift[i] += d
                if self.pos[i] < 0:
                    self.rm(i)
                    if new_head == self.size:
                        new_head = i
        self.head = new_head if new_head != self.size else 0

    def seq_div(self, s, p0, p1, d):
        if d == 1:
            return
        p0, p1 = self.rng(p0, p1)
        if p0 == p1:
            return
        for i in range(self.size):
            if p0 <= self.pos[i] < p1 and s in self.seq[i]:
                old = self.pos[i]
                self.pos[i] = old // d
                self.shift[i] += old - self.pos[i]

    def find_slot(self, ub):
        n_tokens = ub.n_tokens
        head_cur = self.head
        if head_cur > self.used() + 2 * n_tokens:
            head_cur = 0
        if n_tokens > self.size:
            return None
        n_tested, idxs = 0, []
        while True:
            if head_cur + 1 > self.size:
                n_tested += self.size - head_cur
                head_cur = 0
                continue
            idx = head_cur
            head_cur += 1
            n_tested += 1
            can_use = self.pos[idx] == -1
            if not can_use and len(self.seq[idx]) == 1:
                (s,) = self.seq[idx]
                if self.masked(self.pos[idx], self.seq_pos_max(s) + 1):
                    can_use = True
            if can_use:
                idxs.append(idx)
            if len(idxs) == n_tokens:
                break
            if n_tested >= self.size:
                return None
        return idxs

    def apply_ubatch(self, idxs, ub):
        rm_max = {}
        for ii, idx in enumerate(idxs):
            if self.pos[idx] != -1:
                (s,) = self.seq[idx]
                rm_max[s] = max(rm_max.get(s, -1), self.pos[idx])
                self.rm(idx)
            self.pos[idx] = int(ub.pos[ii])
            self.seq[idx] = set(ub.seq_ids[ii])
        for s in sorted(rm_max):
            if self.seq_pos_min(s) <= rm_max[s]:
                self.seq_rm(s, self.seq_pos_min(s), rm_max[s] + 1)
        self.head = idxs[-1] + 1

    def prepare(self, ubatches):
        saved = (list(self.pos), [set(s) for s in self.seq], list(self.shift), self.head)
        res = []
        for ub in ubatches:
            idxs = self.find_slot(ub)
            if idxs is None:
                res = None
                break
            res.append(idxs)
            self.apply_ubatch(idxs, ub)
        self.pos, self.seq, self.shift, self.head = saved
        return res

    def mask(self, ub, n_kv):
        m = np.full((ub.n_tokens, n_kv), -np.inf, np.float32)
        for i in range(ub.n_tokens):
            s, p1 = ub.seq_ids[i][0], int(ub.pos[i])
            for j in range(n_kv):
                if self.pos[j] == -1 or s not in self.seq[j] or self.pos[j] > p1 or self.masked(self.pos[j], p1):
                    continue
                m[i, j] = 0
        return m


def same_state(ours: KVCache, ref: RefCache):
    assert ours.pos.tolist() == ref.pos
    assert [set(ours.seq_ids(i)) for i in range(ours.size)] == ref.seq
    assert ours.shift.tolist() == ref.shift
    assert ours.head == ref.head


def _ref_of(cache: KVCache) -> RefCache:
    ref = RefCache(cache.size, cache.n_seq_max, cache.n_swa, cache.swa_type)
    ref.pos, ref.seq = cache.pos.tolist(), [set(cache.seq_ids(i)) for i in range(cache.size)]
    ref.shift, ref.head = cache.shift.tolist(), cache.head
    return ref


def decode(cache, batch, n_ubatch):
    """What a context's decode does with the cache: split, prepare, apply each micro-batch."""
    ubs = BatchAllocator(batch, n_seq_max=cache.n_seq_max, memory=cache).split_all(n_ubatch)
    slots = cache.prepare(ubs)
    for ub, slot in zip(ubs, slots):
        cache.apply_ubatch(slot, ub)
    return ubs, slots


def ubatch(pos, seq=0):
    pos = np.asarray(pos, np.int32)
    n = len(pos)
    return UBatch(tokens=np.zeros(n, np.int32), pos=pos, seq_ids=((seq,),) * n, output=np.zeros(n, bool),
                  batch_idxs=np.arange(n, dtype=np.int32))


# ------------------------------------------------------------------------------------------------------------
# batches and micro-batches
# ------------------------------------------------------------------------------------------------------------
def test_split_simple_cuts_in_order_and_collects_outputs():
    b = Batch.from_tokens(range(10, 17), pos0=3, logits="all")
    alloc = BatchAllocator(b)
    ubs = alloc.split_all(3)
    assert [ub.tokens.tolist() for ub in ubs] == [[10, 11, 12], [13, 14, 15], [16]]
    assert [ub.pos.tolist() for ub in ubs] == [[3, 4, 5], [6, 7, 8], [9]]
    assert alloc.out_ids == list(range(7))
    assert split_simple(Batch.get_one([5, 6, 7]), 8)[0].output.tolist() == [False, False, True]


def test_split_equal_interleaves_sequences():
    b = Batch()
    for i in range(4):
        for s in range(3):
            b.add(100 * s + i, i, s, logits=True)
    ubs = BatchAllocator(b, n_seq_max=3).split_all(6, how="equal")
    assert all(ub.equal_seqs and ub.n_seqs == 3 for ub in ubs)
    assert [ub.n_tokens for ub in ubs] == [6, 6]
    assert ubs[0].tokens.tolist() == [0, 1, 100, 101, 200, 201]


def test_batch_positions_continue_the_cache():
    cache = KVCache(32, 1, 4, n_seq_max=2)
    decode(cache, Batch.from_tokens([1, 2, 3]), 8)
    alloc = BatchAllocator(Batch.get_one([4, 5]), memory=cache)
    assert alloc.pos.tolist() == [3, 4]
    with pytest.raises(BatchError, match="Y = X \\+ 1"):
        BatchAllocator(Batch.from_tokens([4], pos0=5), memory=cache)


@pytest.mark.parametrize("batch, kw, msg", [
    (Batch(), {}, "empty"),
    (Batch.from_tokens([1, 99]), {"n_vocab": 50}, "invalid token\\[1\\] = 99"),
    (Batch.from_tokens([1, 2], seq_id=3), {"n_seq_max": 2}, "invalid seq_id"),
    (Batch([1, 2], [0, 2], [(0,), (0,)], [False, True]), {}, "not continuous"),
    (Batch([1, 2, 3], [0, 2, 1], [(0,), (0,), (0,)], [False] * 3), {}, "decreasing"),
])
def test_bad_batches_are_refused_with_llama_cpp_reasons(batch, kw, msg):
    with pytest.raises(BatchError, match=msg):
        BatchAllocator(batch, **kw)


# ------------------------------------------------------------------------------------------------------------
# find_slot, prepare, apply
# ------------------------------------------------------------------------------------------------------------
def test_find_slot_wraps_around_the_ring():
    cache = KVCache(8, 1, 4, allocate=False)
    decode(cache, Batch.from_tokens(range(6)), 6)          # cells 0..5, head 6
    cache.seq_rm(0, 0, 3)                                   # free cells 0..2; head stays at 6 (0 < 6 -> head 0)
    assert cache.head == 0
    cache.head = 6                                          # as if the head had moved on
    trace = []
    slot = cache.find_slot(ubatch([6, 7, 8, 9]), trace=trace)
    assert slot.idxs.tolist() == [6, 7, 0, 1]               # 6, 7, then around to the start
    assert [c for c, _ in trace] == [6, 7, 0, 1]
    # many free cells behind the head (head > used + 2 n_tokens): start over from cell 0 to fill densely
    cache = KVCache(32, 1, 4, allocate=False)
    decode(cache, Batch.from_tokens(range(2)), 2)
    cache.head = 20
    assert cache.find_slot(ubatch([2, 3])).idxs.tolist() == [2, 3]
    assert RefCache.find_slot(_ref_of(cache), ubatch([2, 3])) == [2, 3]
    cache.head = 6                                          # 6 = used + 2 n_tokens: keep searching from the head
    assert cache.find_slot(ubatch([2, 3])).idxs.tolist() == [6, 7]


def test_find_slot_skips_used_cells_and_fails_after_one_turn():
    cache = KVCache(6, 1, 4, n_seq_max=2, allocate=False)
    decode(cache, Batch.from_tokens(range(2)), 6)
    decode(cache, Batch.from_tokens(range(2), seq_id=1), 6)
    cache.seq_rm(0, 0, 1)                                   # hole at cell 0
    assert cache.find_slot(ubatch([2, 3, 4])).idxs.tolist() == [0, 4, 5]
    assert cache.find_slot(ubatch([2, 3, 4, 5])) is None
    assert cache.find_slot(ubatch(range(7))) is None        # larger than the cache


def test_prepare_is_transactional():
    cache = KVCache(8, 1, 4, allocate=False)
    decode(cache, Batch.from_tokens(range(5)), 8)
    before = (cache.pos.copy(), cache.seq.copy(), cache.head)
    ubs = BatchAllocator(Batch.get_one(range(5)), memory=cache).split_all(2)   # 5 more tokens: the 3rd ubatch fails
    with pytest.raises(ContextFullError, match="KV cache is full"):
        cache.prepare(ubs)
    assert (cache.pos == before[0]).all() and (cache.seq == before[1]).all() and cache.head == before[2]
    slots = cache.prepare(ubs[:1])                           # a fitting batch: slots found, cells still untouched
    assert slots[0].idxs.tolist() == [5, 6] and cache.used == 5


def test_sequence_operations_share_keep_and_shift():
    cache = KVCache(16, 1, 4, n_seq_max=3, allocate=False)
    decode(cache, Batch.from_tokens(range(6)), 16)
    cache.seq_cp(0, 1, 0, 4)                                 # seq 1 shares the first 4 cells
    assert cache.seq_ids(0) == {0, 1} and cache.seq_ids(5) == {0}
    assert (cache.seq_pos_min(1), cache.seq_pos_max(1)) == (0, 3)
    cache.seq_rm(0, 2, -1)                                   # seq 0 forgets positions >= 2
    assert cache.seq_ids(2) == {1} and cache.is_empty(4) and cache.head == 4
    cache.seq_add(1, 1, -1, 10)                              # shift seq 1's positions >= 1 by +10
    assert cache.pos[:4].tolist() == [0, 11, 12, 13] and cache.has_shift
    assert cache.seq_pos_max(0) == 11                        # the shared cell moved for seq 0 as well
    cache.seq_keep(1)
    assert all(cache.seq_ids(i) <= {1} for i in range(16)) and cache.used == 4
    cache.seq_add(1, 0, -1, -12)                             # positions below 0 vanish
    assert cache.pos[:4].tolist() == [-1, -1, 0, 1] and cache.head == 0


def test_kq_mask_causal_per_sequence():
    cache = KVCache(16, 1, 4, n_seq_max=2, allocate=False)
    b = Batch()
    for i in range(3):
        b.add(i, i, 0)
        b.add(i, i, 1)
    ubs, _ = decode(cache, b, 16)
    m = cache.kq_mask(ubs[0], n_kv=8)
    assert m.shape == (6, 8) and m.dtype == np.float32
    for i in range(6):
        s, p = i % 2, i // 2
        want = [j < 6 and j % 2 == s and j // 2 <= p for j in range(8)]
        assert (m[i] == 0).tolist() == want
    assert set(np.unique(m)) <= {0.0, -np.inf}


def test_sliding_window_cache_recycles_cells():
    """With a window of 4, a 6-cell SWA cache decodes forever token by token; a plain one fills up."""
    swa = KVCache(6, 1, 4, n_swa=4, swa_type="standard", allocate=False)
    plain = KVCache(6, 1, 4, allocate=False)
    ref = RefCache(6, n_swa=4, swa_type="standard")
    for t in range(20):
        b = Batch.get_one([t])
        ubs, slots = decode(swa, b, 1)
        idxs = ref.prepare(ubs)
        assert idxs == [s.idxs.tolist() for s in slots]
        ref.apply_ubatch(idxs[0], ubs[0])
        same_state(swa, ref)
        # the window always holds the last 4 positions (and at most the micro-batch beyond)
        assert swa.seq_pos_max(0) == t and swa.seq_pos_min(0) <= max(0, t - 3)
        m = swa.kq_mask(ubs[0], n_kv=6)
        assert sorted(swa.pos[m[0] == 0].tolist()) == list(range(max(0, t - 3), t + 1))
        if t < 6:
            decode(plain, b, 1)
        else:
            with pytest.raises(ContextFullError):
                decode(plain, b, 1)


def test_is_masked_swa_types():
    is_masked_swa = HParams.is_masked_swa
    assert is_masked_swa(4, "standard", 0, 4) and not is_masked_swa(4, "standard", 1, 4)
    assert is_masked_swa(4, "chunked", 3, 4) and not is_masked_swa(4, "chunked", 4, 7)
    assert is_masked_swa(4, "symmetric", 0, 3) and not is_masked_swa(4, "symmetric", 5, 3)
    assert not is_masked_swa(4, "none", 0, 1000)


def test_context_shift_keeps_the_head_and_slides_the_rest():
    cache = KVCache(8, 1, 4, allocate=False)
    decode(cache, Batch.from_tokens(range(8)), 8)
    with pytest.raises(ContextFullError):
        decode(cache, Batch.get_one([8]), 1)
    n = context_shift(cache, 0, n_keep=2)
    assert n == 3
    assert cache.pos.tolist() == [0, 1, -1, -1, -1, 2, 3, 4] and cache.shift.tolist() == [0, 0, 0, 0, 0, -3, -3, -3]
    ubs, slots = decode(cache, Batch.get_one([8]), 1)
    assert ubs[0].pos.tolist() == [5] and slots[0].idxs.tolist() == [2]


def test_k_shift_rotates_only_shifted_cells_and_clears_shifts():
    cache = KVCache(8, [0, 1], 2, type_k="f32")
    ubs, slots = decode(cache, Batch.from_tokens(range(4)), 8)
    for il in (0, 1):
        cache.store(il, slots[0], np.ones((4, 2)), np.zeros((4, 2)))
    cache.seq_add(0, 2, -1, 5)
    seen = []

    def rope(il, k, delta):
        seen.append((il, delta.tolist()))
        return k * delta[:, None]

    cache.apply_k_shift(rope)
    assert seen == [(0, [5, 5]), (1, [5, 5])]
    assert cache.k(0, 4)[:, 0].tolist() == [1, 1, 5, 5] and not cache.has_shift and not cache.shift.any()


def test_store_rounds_to_the_cache_type():
    x = np.random.default_rng(0).standard_normal((3, 8)).astype(np.float32)
    for t, dt in (("f16", np.float16), ("f32", np.float32)):
        cache = KVCache(4, 1, 8, type_k=t)
        ubs, slots = decode(cache, Batch.from_tokens(range(3)), 4)
        cache.store(0, slots[0], x, 2 * x)
        assert cache.k(0, 3).dtype == dt
        assert np.array_equal(cache.k_float(0, 3), x.astype(dt).astype(np.float32))
        assert np.array_equal(cache.v_float(0, 3), (2 * x).astype(dt).astype(np.float32))


def test_n_kv_is_padded_to_256():
    cache = KVCache(1024, 1, 4, allocate=False)
    assert cache.n_kv() == 256
    decode(cache, Batch.from_tokens(range(300)), 512)
    assert cache.n_kv() == 512
    assert KVCache(100, 1, 4, allocate=False).n_kv() == 100


def test_iswa_routes_layers_and_sizes_the_window_cache():
    c = KVCacheISWA(4096, [5, 11], [0, 1, 2, 3, 4], n_embd_k_gqa=256, n_swa=512, n_ubatch=512, allocate=False)
    assert (c.base.size, c.swa.size) == (4096, swa_cache_size(4096, 512, 512)) == (4096, 1024)
    assert c.layer_cache(5) is c.base and c.layer_cache(3) is c.swa
    assert not c.can_shift
    with pytest.raises(ContextFullError, match="cannot shift"):
        context_shift(c, 0, 0)
    decode(c, Batch.from_tokens(range(10)), 4)
    assert c.base.used == c.swa.used == 10 and c.seq_pos_max(0) == 9
    c.seq_rm(0, 5, -1)
    assert c.base.used == c.swa.used == 5


def test_memory_accounting_formula():
    # n_ctx x n_layer x 2 x n_embd_gqa x sizeof(type); q8_0 is 34 bytes per 32 values
    assert kv_cache_bytes(4096, 32, 4096, type_k="f16") == 4096 * 32 * 2 * 4096 * 2
    assert kv_cache_bytes(4096, 32, 4096, type_k="f32") == 4096 * 32 * 2 * 4096 * 4
    assert kv_cache_bytes(4096, 32, 4096, type_k="q8_0") == 4096 * 32 * 2 * 4096 * 34 // 32
    c = KVCache(512, 30, 192, allocate=True)
    assert c.total_bytes() == kv_cache_bytes(512, 30, 192) == sum(a.nbytes for a in (*c._k.values(), *c._v.values()))
    with pytest.raises(ValueError, match="unsupported KV cache type"):
        KVCache(8, 1, 32, type_k="q4_k")


# ------------------------------------------------------------------------------------------------------------
# state machines: random operation sequences, llmlab vs the transliteration
# ------------------------------------------------------------------------------------------------------------
SEQS = 3


class CacheMachine(RuleBasedStateMachine):
    size = 24
    n_swa, swa_type = 0, "none"

    @initialize()
    def start(self):
        self.ours = KVCache(self.size, 1, 4, n_seq_max=SEQS, n_swa=self.n_swa, swa_type=self.swa_type, allocate=False)
        self.ref = RefCache(self.size, SEQS, self.n_swa, self.swa_type)

    @rule(seq=st.integers(0, SEQS - 1), n=st.integers(1, 12), n_ubatch=st.integers(1, 8))
    def decode_tokens(self, seq, n, n_ubatch):
        ubs = BatchAllocator(Batch.get_one([0] * n) if seq == 0 else
                             Batch(list(range(n)), None, [(seq,)] * n, [False] * n),
                             n_seq_max=SEQS, memory=self.ours).split_all(n_ubatch)
        want = self.ref.prepare(ubs)
        try:
            slots = self.ours.prepare(ubs)
        except ContextFullError:
            assert want is None
            return
        assert want == [s.idxs.tolist() for s in slots]
        for ub, slot in zip(ubs, slots):
            n_kv = 16
            self.ours.apply_ubatch(slot, ub)
            self.ref.apply_ubatch(slot.idxs.tolist(), ub)
            assert np.array_equal(self.ours.kq_mask(ub, n_kv=n_kv), self.ref.mask(ub, n_kv))

    @rule(seq=st.integers(-1, SEQS - 1), p0=st.integers(-1, 20), p1=st.integers(-1, 30))
    def seq_rm(self, seq, p0, p1):
        self.ours.seq_rm(seq, p0, p1)
        self.ref.seq_rm(seq, p0, p1)

    @rule(a=st.integers(0, SEQS - 1), b=st.integers(0, SEQS - 1), p0=st.integers(-1, 20), p1=st.integers(-1, 30))
    def seq_cp(self, a, b, p0, p1):
        # llama.cpp copies only into a sequence with no cells in that range; we copy into an emptied one
        self.ours.seq_rm(b, -1, -1)
        self.ref.seq_rm(b, -1, -1)
        self.ours.seq_cp(a, b, p0, p1)
        self.ref.seq_cp(a, b, p0, p1)

    @rule(seq=st.integers(0, SEQS - 1))
    def seq_keep(self, seq):
        self.ours.seq_keep(seq)
        self.ref.seq_keep(seq)

    @rule(seq=st.integers(0, SEQS - 1), p0=st.integers(-1, 20), p1=st.integers(-1, 30), d=st.integers(-8, 8))
    def seq_add(self, seq, p0, p1, d):
        self.ours.seq_add(seq, p0, p1, d)
        self.ref.seq_add(seq, p0, p1, d)

    @rule(seq=st.integers(0, SEQS - 1), p0=st.integers(-1, 20), p1=st.integers(-1, 30), d=st.integers(1, 4))
    def seq_div(self, seq, p0, p1, d):
        self.ours.seq_div(seq, p0, p1, d)
        self.ref.seq_div(seq, p0, p1, d)

    @invariant()
    def same(self):
        same_state(self.ours, self.ref)
        for s in range(SEQS):
            assert self.ours.seq_pos_max(s) == self.ref.seq_pos_max(s)
            assert self.ours.seq_pos_min(s) == self.ref.seq_pos_min(s)
        assert ((self.ours.pos >= 0) == self.ours.seq.any(axis=1)).all()   # a cell is used iff some sequence sees it
        assert 0 <= self.ours.head <= self.ours.size


class SWACacheMachine(CacheMachine):
    size = 16
    n_swa, swa_type = 5, "standard"


SETTINGS = settings(max_examples=60, stateful_step_count=25, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow])
TestCacheMachine = CacheMachine.TestCase
TestCacheMachine.settings = SETTINGS
TestSWACacheMachine = SWACacheMachine.TestCase
TestSWACacheMachine.settings = SETTINGS


# ------------------------------------------------------------------------------------------------------------
# micro-batch splits: properties over random batches
# ------------------------------------------------------------------------------------------------------------
@st.composite
def multi_seq_batches(draw):
    n_seq = draw(st.integers(1, 4))
    lens = draw(st.lists(st.integers(0, 9), min_size=n_seq, max_size=n_seq))
    order = draw(st.permutations([s for s, n in enumerate(lens) for _ in range(n)]))
    if not order:
        order = [0]
    b, nxt = Batch(), {}
    for s in order:
        b.add(token=s, pos=nxt.get(s, 0), seq_ids=s, logits=draw(st.booleans()))
        nxt[s] = nxt.get(s, 0) + 1
    return b


@settings(max_examples=200, deadline=None)
@given(batch=multi_seq_batches(), n_ubatch=st.integers(1, 12))
def test_splits_cover_the_batch_once(batch, n_ubatch):
    for how in ("simple", "equal"):
        alloc = BatchAllocator(batch, n_seq_max=4)
        ubs = alloc.split_all(n_ubatch, how=how)
        idx = np.concatenate([ub.batch_idxs for ub in ubs])
        assert sorted(idx.tolist()) == list(range(batch.n_tokens))            # every token exactly once
        assert alloc.out_ids == [int(i) for ub in ubs for i in ub.batch_idxs[ub.output]]
        for ub in ubs:
            assert np.array_equal(ub.tokens, np.asarray(batch.tokens)[ub.batch_idxs])
            assert np.array_equal(ub.pos, np.asarray(batch.pos)[ub.batch_idxs])
        if how == "simple":
            assert idx.tolist() == list(range(batch.n_tokens)) and all(ub.n_tokens <= n_ubatch for ub in ubs)
        else:
            for ub in ubs:      # equal split: n_seqs runs of the same length, one per sequence, each in order
                runs = ub.batch_idxs.reshape(ub.n_seqs, -1)
                assert all(len({batch.seq_ids[i] for i in run}) == 1 for run in runs)
                assert all((np.diff(run) > 0).all() for run in runs)


@pytest.mark.parametrize("swa", [False, True])
def test_both_caches_are_one_memory_interface(swa):
    """The unified cache and the sliding-window pair answer the same calls (llama_memory_i): a context
    places micro-batches, fills its k_idxs and masks per layer, saves and restores state without knowing which."""
    cache = (KVCacheISWA(512, [1], [0], n_embd_k_gqa=8, n_swa=4, n_ubatch=8) if swa
             else KVCache(512, 2, 8))
    assert isinstance(cache, Memory)
    ubs = BatchAllocator(Batch.from_tokens(range(6)), memory=cache).split_all(3)
    before = cache.state()
    placements = cache.prepare(ubs)
    assert cache.seq_pos_max(0) == -1                                           # a dry run: nothing placed
    for ub, pl in zip(ubs, placements):
        cache.apply_ubatch(pl, ub)
        for il in (0, 1):
            idxs = cache.k_idxs(pl, il)
            assert len(idxs) == ub.n_tokens
            assert cache.kq_mask(ub, cache.n_kv(il), il=il).shape == (ub.n_tokens, cache.n_kv(il))
            assert cache.layer_cache(il).k(il, cache.layer_cache(il).size).shape[0] == cache.layer_cache(il).size
    assert cache.seq_pos_max(0) == 5
    after = cache.state()
    cache.restore(before)
    assert cache.seq_pos_max(0) == -1
    cache.restore(after)
    assert cache.seq_pos_max(0) == 5
    if swa:                                                  # the window layer sees 4 positions back, the other all
        ub = ubs[-1]
        assert (cache.kq_mask(ub, il=0)[-1] == 0).sum() == 4 and (cache.kq_mask(ub, il=1)[-1] == 0).sum() == 6
