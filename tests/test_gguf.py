"""GGUF reader and writer: equal to gguf-py on the real models, byte-exact round trips, and
every malformed file refused with a GGUFError naming the offset."""
from __future__ import annotations

import hashlib
import struct

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from llmlab.ggml.gguf import GGUFError, GGUFFile, GGUFWriter, ValueType
from llmlab.ggml.types import TYPES, ggml_type

# -- against gguf-py, on both real models -----------------------------------------------------


def _gguf_py_value(field):
    import gguf
    main = field.types[0]
    if main == gguf.GGUFValueType.ARRAY and len(field.types) > 1 and field.types[1] == gguf.GGUFValueType.ARRAY:
        pytest.fail("nested arrays: gguf-py cannot read their contents, and the real models have none")
    return field.contents()


def test_every_record_equals_gguf_py(real_model):
    gguf = pytest.importorskip("gguf", reason="gguf-py is not installed (optional oracle)")
    _, path = real_model
    ref = gguf.GGUFReader(path)
    with GGUFFile(path) as f:
        ref_fields = {k: v for k, v in ref.fields.items() if not k.startswith("GGUF.")}
        assert list(f.fields) == list(ref_fields)
        for key, rf in ref_fields.items():
            mine = f.fields[key]
            assert mine.type == rf.types[0], key
            if mine.item_type is not None:
                assert mine.item_type == rf.types[-1], key
            want = _gguf_py_value(rf)
            got = mine.value
            if isinstance(got, np.ndarray):
                np.testing.assert_array_equal(got, np.asarray(want), err_msg=key)
            elif mine.type == ValueType.ARRAY:
                assert list(got) == list(want), key
            else:
                assert got == want, key
            assert mine.span.start == rf.offset, key
        assert len(f.tensors) == len(ref.tensors)
        for t, rt in zip(f.tensors, ref.tensors):
            assert t.name == rt.name
            assert t.type.id == int(rt.tensor_type)
            assert list(t.shape) == [int(d) for d in rt.shape]
            assert t.nbytes == rt.n_bytes
            assert t.data_span.start == rt.data_offset
            assert t.n_elements == rt.n_elements
        # spot-check the data views (full equality of all bytes is the round-trip test's job)
        for t, rt in list(zip(f.tensors, ref.tensors))[::25]:
            assert np.array_equal(t.data, np.asarray(rt.data).reshape(-1).view(np.uint8))


def test_spans_tile_the_file(real_model):
    _, path = real_model
    with GGUFFile(path) as f:
        pos = 0
        for s in f.spans:
            assert s.start == pos, s
            pos = s.end
        assert pos == f.file_size
        kinds = {s.kind for s in f.spans}
        assert {"header", "kv", "tensor_info", "tensor_data"} <= kinds
        assert sum(s.kind == "tensor_data" for s in f.spans) == len(f.tensors)


def _sha(path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        while chunk := fh.read(1 << 22):
            h.update(chunk)
    return h.hexdigest()


def test_round_trip_is_byte_identical(real_model, tmp_path):
    _, path = real_model
    out = tmp_path / "copy.gguf"
    with GGUFFile(path) as f:
        GGUFWriter.from_file(f).write(out)
    assert out.stat().st_size == path.stat().st_size
    assert _sha(out) == _sha(path)


def test_tensor_views_are_zero_copy(smollm2_path):
    with GGUFFile(smollm2_path) as f:
        t = f.tensor("blk.0.attn_norm.weight")
        a = t.array
        assert a.dtype == np.float32 and a.shape == (576,)
        assert not a.flags.owndata and not a.flags.writeable
        q = f.tensor("blk.0.attn_q.weight")
        assert q.blocks.shape == (576, 576 // 32)
        assert q.blocks.dtype.itemsize == 20


def _resident_kb(f: GGUFFile) -> int:
    """Resident kB of this file's own mapping, from /proc/self/smaps (other mappings don't count)."""
    addr = f.buffer.__array_interface__["data"][0]
    try:
        lines = open("/proc/self/smaps").read().splitlines()
    except OSError:
        pytest.skip("no /proc/self/smaps on this system")
    inside = False
    for line in lines:
        head = line.split()
        if "-" in head[0] and len(head) >= 5 and ":" not in head[0]:
            lo, hi = (int(x, 16) for x in head[0].split("-"))
            inside = lo <= addr < hi
        elif inside and head[0] == "Rss:":
            return int(head[1])
    raise AssertionError("mapping not found in /proc/self/smaps")


def test_open_does_not_read_tensor_data(gemma3_path):
    """Opening touches the directory's pages only: the mapping's resident size stays far below the
    253 MB of tensor data (the 262,144-token vocabulary is about 6.5 MB)."""
    with GGUFFile(gemma3_path) as f:
        toks = f.kv["tokenizer.ggml.tokens"]
        assert len(toks) == 262144 and toks[2] == "<bos>"
        assert f.data_offset < 8_000_000
        resident = _resident_kb(f)
        assert resident < 10_000, f"opening made {resident} kB of the file resident"
        f.tensor("token_embd.weight").data[::4096].sum()     # touching data does make it resident
        assert _resident_kb(f) > 100_000


# -- writer output read by gguf-py and llama.cpp ---------------------------------------------


def _tiny_writer() -> GGUFWriter:
    w = GGUFWriter()
    w.add("general.architecture", "toy")
    w.add("toy.u8", 7, ValueType.UINT8)
    w.add("toy.i8", -7, ValueType.INT8)
    w.add("toy.u16", 65535, ValueType.UINT16)
    w.add("toy.i16", -300, ValueType.INT16)
    w.add("toy.u32", 4_000_000_000, ValueType.UINT32)
    w.add("toy.i32", -5)
    w.add("toy.u64", 2**63 + 5, ValueType.UINT64)
    w.add("toy.i64", -(2**40), ValueType.INT64)
    w.add("toy.f32", 0.5)
    w.add("toy.f64", 1e-300, ValueType.FLOAT64)
    w.add("toy.flag", True)
    w.add("toy.name", "héllo ✓")
    w.add("toy.ints", np.arange(5, dtype=np.int32))
    w.add("toy.words", ["a", "", "ünïcode"], item_type=ValueType.STRING)
    w.add("toy.nested", [np.arange(2, dtype=np.uint8), np.arange(3, dtype=np.uint8)], ValueType.ARRAY, ValueType.ARRAY)
    w.add_tensor("a", np.arange(64, dtype=np.float32).reshape(2, 32))
    w.add_tensor("b", np.ones(3, dtype=np.float16))
    w.add_tensor("c", np.zeros(2 * 18, dtype=np.uint8), "q4_0", (64,))
    return w


def test_writer_reader_round_trip(tmp_path):
    p = tmp_path / "toy.gguf"
    _tiny_writer().write(p)
    with GGUFFile(p) as f:
        assert f.kv["toy.u64"] == 2**63 + 5
        assert f.kv["toy.i64"] == -(2**40)
        assert f.kv["toy.name"] == "héllo ✓"
        assert f.kv["toy.flag"] is True
        assert list(f.kv["toy.words"]) == ["a", "", "ünïcode"]
        assert [list(x) for x in f.kv["toy.nested"]] == [[0, 1], [0, 1, 2]]
        np.testing.assert_array_equal(f.tensor("a").array, np.arange(64, dtype=np.float32).reshape(2, 32))
        assert f.tensor("c").type.name == "q4_0" and f.tensor("c").shape == (64,)
        assert all(t.offset % 32 == 0 for t in f.tensors)
        again = GGUFWriter.from_file(f).to_bytes()
    assert again == p.read_bytes()


def test_writer_output_opens_in_gguf_py(tmp_path):
    gguf = pytest.importorskip("gguf", reason="gguf-py is not installed (optional oracle)")
    p = tmp_path / "toy.gguf"
    _tiny_writer().write(p)
    r = gguf.GGUFReader(p)
    assert r.fields["toy.name"].contents() == "héllo ✓"
    assert r.fields["toy.u64"].contents() == 2**63 + 5
    assert r.fields["toy.words"].contents() == ["a", "", "ünïcode"]
    np.testing.assert_array_equal(r.get_tensor(0).data, np.arange(64, dtype=np.float32).reshape(2, 32))


def test_rewritten_model_runs_in_llama_cpp(smollm2_path, tmp_path):
    """A file llmlab rewrote (metadata changed, tensors re-laid out) gives llama.cpp's same logits."""
    llama_cpp = pytest.importorskip("llama_cpp", reason="llama-cpp-python is not installed (optional oracle)")
    out = tmp_path / "rewritten.gguf"
    with GGUFFile(smollm2_path) as f:
        w = GGUFWriter.from_file(f)
        w.add("general.name", "rewritten by llmlab")
        w.add("llmlab.note", "an extra key llama.cpp ignores")
        w.write(out)

    def logits(path):
        llm = llama_cpp.Llama(str(path), n_ctx=64, n_threads=2, logits_all=False, verbose=False)
        llm.eval(llm.tokenize(b"The history of the printing press"))
        return np.array(llm.scores[llm.n_tokens - 1])
    np.testing.assert_array_equal(logits(out), logits(smollm2_path))


# -- malformed files --------------------------------------------------------------------------


def _s(x: str | bytes) -> bytes:
    b = x.encode() if isinstance(x, str) else x
    return struct.pack("<Q", len(b)) + b


def _file(kvs=(), tensors=(), version=3, magic=b"GGUF", data=b"", align=32, n_kv=None, n_t=None) -> bytes:
    """Raw GGUF bytes from parts, with no validation (so it can be wrong on purpose).
    kvs: (key, type code, value bytes); tensors: (name, dims, type id, offset)."""
    head = magic + struct.pack("<IQQ", version, len(tensors) if n_t is None else n_t, len(kvs) if n_kv is None else n_kv)
    body = b"".join(_s(k) + struct.pack("<I", t) + v for k, t, v in kvs)
    body += b"".join(_s(n) + struct.pack("<I", len(d)) + struct.pack(f"<{len(d)}Q", *d) + struct.pack("<IQ", ty, off)
                     for n, d, ty, off in tensors)
    out = head + body
    return out + bytes(-len(out) % align) + data


def _open(tmp_path, raw: bytes):
    p = tmp_path / "bad.gguf"
    p.write_bytes(raw)
    return GGUFFile(p)


F32 = 0
ONE_F32 = [("t", [8], F32, 0)]


@pytest.mark.parametrize("raw, msg", [
    (b"", "empty file"),
    (b"GGU", "truncated"),
    (_file(magic=b"GGML"), "bad magic"),
    (_file(version=1), "unsupported GGUF version 1"),
    (_file(version=4), "unsupported GGUF version 4"),
    (b"GGUF" + struct.pack(">IQQ", 3, 0, 0), "big-endian"),
    (_file(n_kv=2**62), "metadata count"),
    (_file(n_t=2**40), "tensor count"),
    (_file([("k", 8, struct.pack("<Q", 2**60))]), "truncated"),
    (_file([("k", 13, b"\0" * 8)]), "unknown metadata value type 13"),
    (_file([("k", 9, struct.pack("<IQ", 4, 2**61))]), "array of 2305843009213693952 UINT32"),
    (_file([("k", 9, struct.pack("<IQ", 8, 2**50))]), "cannot fit"),
    (_file([("k", 9, struct.pack("<IQQ", 8, 1, 2**63 + 1) + bytes(16))]), "runs past the end"),
    (_file([("k", 9, struct.pack("<IQ", 42, 1))]), "unknown metadata value type 42"),
    (_file([("k", 7, b"\x02")]), "bool value 2"),
    (_file([("k", 8, _s(b"\xff\xfe"))]), "not valid UTF-8"),
    (_file([("k", 4, b"\0" * 4), ("k", 4, b"\0" * 4)]), "duplicate metadata key 'k'"),
    (_file([("general.alignment", 4, struct.pack("<I", 24))]), "not a power of two"),
    (_file([("general.alignment", 4, struct.pack("<I", 0))]), "not a power of two"),
    (_file(tensors=[("t", [8], 99, 0)], data=bytes(32)), "unknown ggml type id 99"),
    (_file(tensors=[("t", [32], 4, 0)], data=bytes(32)), "was removed"),
    (_file(tensors=[("t", [1, 1, 1, 1, 1], F32, 0)], data=bytes(32)), "5 dimensions"),
    (_file(tensors=[("t", [2**64 - 3], F32, 0)], data=bytes(32)), "ne[0] = -3, must be >= 0"),
    (_file(tensors=[("t", [8], F32, 16)], data=bytes(64)), "not a multiple of the alignment"),
    (_file(tensors=[("t", [8], F32, 0)], data=bytes(16)), "outside"),
    (_file(tensors=[("t", [2**40], F32, 0)], data=bytes(32)), "outside"),
    (_file(tensors=[("t", [16], 2, 0)], data=bytes(32)), "not a multiple of the q4_0 block size"),
    (_file(tensors=[("t", [16], F32, 0), ("u", [8], F32, 32)], data=bytes(96)), "overlaps"),
    (_file(tensors=[("t", [8], F32, 0), ("t", [8], F32, 32)], data=bytes(64)), "duplicate tensor name 't'"),
    (_file(tensors=[("t", [8], F32, 0)]), "data section"),
])
def test_malformed_file_is_refused(tmp_path, raw, msg):
    with pytest.raises(GGUFError, match="offset") as e:
        _open(tmp_path, raw)
    assert msg in str(e.value)


def test_error_names_the_right_offset(tmp_path):
    raw = _file([("a", 4, b"\0" * 4), ("b", 13, b"")])
    with pytest.raises(GGUFError) as e:
        _open(tmp_path, raw)
    assert e.value.offset == 24 + 8 + 1 + 4 + 4 + 8 + 1   # header, pair "a", key of "b": the type code's offset


def test_every_truncation_is_refused(tmp_path):
    raw = _tiny_writer().to_bytes()
    end_of_data = len(raw) - (-36 % 32)   # the trailing padding after the last tensor is optional
    assert GGUFFile.__name__ and _open(tmp_path, raw[:end_of_data]).tensor("c").nbytes == 36
    for n in range(end_of_data):
        try:
            _open(tmp_path, raw[:n])
        except GGUFError:
            continue
        pytest.fail(f"prefix of {n} bytes parsed without error")


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.data())
def test_corrupted_bytes_give_gguf_error_or_parse(tmp_path, data):
    raw = bytearray(_tiny_writer().to_bytes())
    for _ in range(data.draw(st.integers(1, 8))):
        i = data.draw(st.integers(0, len(raw) - 1))
        raw[i] = data.draw(st.integers(0, 255))
    try:
        _open(tmp_path, bytes(raw)).close()
    except GGUFError:
        pass


scalars = st.one_of(
    st.tuples(st.just(ValueType.UINT8), st.integers(0, 255)),
    st.tuples(st.just(ValueType.INT16), st.integers(-(2**15), 2**15 - 1)),
    st.tuples(st.just(ValueType.UINT64), st.integers(0, 2**64 - 1)),
    st.tuples(st.just(ValueType.INT64), st.integers(-(2**63), 2**63 - 1)),
    st.tuples(st.just(ValueType.FLOAT64), st.floats(allow_nan=False)),
    st.tuples(st.just(ValueType.FLOAT32), st.floats(width=32, allow_nan=False)),
    st.tuples(st.just(ValueType.BOOL), st.booleans()),
    st.tuples(st.just(ValueType.STRING), st.text()),
)


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.dictionaries(st.text(min_size=1), scalars, max_size=8), st.lists(st.text(), min_size=1, max_size=20))
def test_random_metadata_round_trips(tmp_path, kv, words):
    w = GGUFWriter()
    for k, (t, v) in kv.items():
        w.add(k, v, t)
    w.add("zz.words", words, ValueType.ARRAY, ValueType.STRING)
    p = tmp_path / "r.gguf"
    w.write(p)
    with GGUFFile(p) as f:
        for k, (t, v) in kv.items():
            assert f.fields[k].type == t
            assert f.kv[k] == v
        assert list(f.kv["zz.words"]) == words


def test_type_table_matches_gguf_py():
    gguf = pytest.importorskip("gguf", reason="gguf-py is not installed (optional oracle)")
    for qt, (blck, size) in gguf.GGML_QUANT_SIZES.items():
        t = ggml_type(int(qt))
        if t.name == "q8_1":   # gguf-py still lists the old f32 d and s; ggml's block_q8_1 has two f16s
            assert (blck, size, t.type_size) == (32, 40, 2 + 2 + 32)
            continue
        assert (t.name, t.block_size, t.type_size) == (qt.name.lower(), blck, size)
    assert {t.id for t in TYPES.values() if t.removed} == {4, 5, 31, 32, 33, 36, 37, 38}
