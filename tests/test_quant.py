"""Block formats: layouts, bit-exact dequantizers and byte-exact quantizers against gguf-py and ggml."""
from __future__ import annotations

import numpy as np
import pytest

import llmlab.ggml.quant as Q
from llmlab.ggml.quant import checklist, toy
from llmlab.ggml.quant import core as Q_core
from llmlab.ggml.types import QK_K, TYPES, ggml_type

gguf = pytest.importorskip("gguf", reason="gguf-py is not installed (optional oracle)")
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType as G  # noqa: E402

LIVE = [t for t in TYPES.values() if not t.removed]
WITH_LAYOUT = [t.name for t in LIVE if t.layout is not None]
QUANTIZABLE = [t.name for t in LIVE if t.from_float is not None]


def gguf_type(name):
    return G[name.upper()]


# ---------------------------------------------------------------- the struct sizes of ggml-common.h

HALF = 2
# static_assert(sizeof(block_x) == ...) of ggml-common.h, written out with its constants
STATIC_ASSERTS = {
    "q4_0": HALF + 32 // 2, "q4_1": 2 * HALF + 32 // 2, "q5_0": HALF + 4 + 32 // 2, "q5_1": 2 * HALF + 4 + 32 // 2,
    "q8_0": HALF + 32, "q8_1": 2 * HALF + 32, "q1_0": HALF + 128 // 8, "mxfp4": 1 + 32 // 2, "nvfp4": 4 + 64 // 2,
    "q2_k": 2 * HALF + QK_K // 16 + QK_K // 4, "q3_k": HALF + QK_K // 4 + QK_K // 8 + 12,
    "q4_k": 2 * HALF + 12 + QK_K // 2, "q5_k": 2 * HALF + 12 + QK_K // 2 + QK_K // 8,
    "q6_k": HALF + QK_K // 16 + 3 * QK_K // 4, "q8_k": 4 + QK_K + QK_K // 16 * 2,
    "tq1_0": HALF + QK_K // 64 + (QK_K - 4 * QK_K // 64) // 5, "tq2_0": HALF + QK_K // 4,
    "iq2_xxs": HALF + QK_K // 8 * 2, "iq2_xs": HALF + QK_K // 8 * 2 + QK_K // 32,
    "iq2_s": HALF + QK_K // 4 + QK_K // 16, "iq3_xxs": HALF + 3 * (QK_K // 8),
    "iq3_s": HALF + 13 * (QK_K // 32) + QK_K // 64, "iq1_s": HALF + QK_K // 8 + QK_K // 16,
    "iq1_m": QK_K // 8 + QK_K // 16 + QK_K // 32, "iq4_nl": HALF + 32 // 2, "iq4_xs": HALF + 2 + QK_K // 64 + QK_K // 2,
}


@pytest.mark.parametrize("name", sorted(STATIC_ASSERTS))
def test_struct_size(name):
    t = ggml_type(name)
    assert t.layout is not None and t.layout.itemsize == STATIC_ASSERTS[name] == t.type_size
    if name.upper() in G.__members__ and name != "q8_1":   # gguf-py still lists q8_1 with f32 d and s (40 bytes)
        assert GGML_QUANT_SIZES[gguf_type(name)] == (t.block_size, t.type_size)


def test_every_live_type_has_a_layout_and_dequantizer():
    plain_ints = {"i8", "i16", "i32", "i64", "f64"}
    missing = [t.name for t in LIVE if t.name not in plain_ints and (t.layout is None or t.to_float is None)]
    assert missing == []


def test_quantizers_required_by_the_issue():
    need = "f16 bf16 q4_0 q4_1 q5_0 q5_1 q8_0 q8_1 q2_k q3_k q4_k q5_k q6_k q8_k tq1_0 tq2_0 mxfp4".split()
    assert [n for n in need if ggml_type(n).from_float is None] == []


# ---------------------------------------------------------------- dequantize vs gguf-py, random blocks

def random_blocks(t, n, seed):
    return Q_core.random_blocks(t, n, seed)


DEQUANT_GGUF = [n for n in WITH_LAYOUT if n.upper() in G.__members__
                and (n in ("f32", "f16") or gguf.quants._type_traits.get(gguf_type(n)) is not None)]


@pytest.mark.parametrize("name", DEQUANT_GGUF)
@pytest.mark.parametrize("finite", [True, False], ids=["finite", "any-bytes"])
def test_dequantize_matches_gguf_py(name, finite):
    t = ggml_type(name)
    raw = random_blocks(t, 300, 1) if finite else np.random.default_rng(2).integers(0, 256, 300 * t.type_size, dtype=np.uint8)
    with np.errstate(all="ignore"):                  # DEQUANT_GGUF: the types gguf-py dequantizes
        ref = gguf.quants.dequantize(raw, gguf_type(name))
    assert checklist.same_bits(Q.dequantize(raw, name), ref)


def test_dequantize_covers_all_gguf_dequantizers():
    """Every type gguf-py can dequantize is also dequantized (and tested) here."""
    theirs = {q.name.lower() for q in gguf.quants._type_traits}
    assert theirs <= set(DEQUANT_GGUF)


# ---------------------------------------------------------------- quantize vs gguf-py

def sample_data(block_size, rows=48, seed=0):
    rng = np.random.default_rng(seed)
    n = max(block_size, 512 // block_size * block_size)
    x = (rng.standard_normal((rows, n)) * rng.uniform(1e-3, 20, (rows, 1))).astype(np.float32)
    x[0] = 0                                   # all-zero blocks
    x[1] = 1.5                                 # constant blocks
    x[2, ::3] = -x[2, ::3]
    x[3] = np.round(x[3] * 4) / 4              # many exact halves after scaling
    x[4, :5] = 1e-20                           # tiny values
    x[5] = rng.standard_t(2, n)                # heavy tails
    return x


QUANT_GGUF = [n for n in QUANTIZABLE if n.upper() in G.__members__ and (
    n in ("f16",) or ((c := gguf.quants._type_traits.get(gguf_type(n))) is not None
                      and "quantize_blocks" in c.__dict__))]


@pytest.mark.parametrize("name", QUANT_GGUF)
def test_quantize_matches_gguf_py(name):
    t = ggml_type(name)
    x = sample_data(t.block_size)
    ref = np.asarray(gguf.quants.quantize(x, gguf_type(name))).view(np.uint8).reshape(-1)
    assert np.array_equal(Q.quantize(x, name), ref)


def test_quant_gguf_list_is_complete():
    theirs = {q.name.lower() for q, c in gguf.quants._type_traits.items() if "quantize_blocks" in c.__dict__}
    assert theirs <= set(QUANT_GGUF)


# ---------------------------------------------------------------- the public API's errors

def test_unknown_type():
    with pytest.raises(Q.QuantError, match="q9_9"):
        Q.dequantize(b"\0" * 18, "q9_9")
    with pytest.raises(Q.QuantError, match="q9_9"):
        Q.quantize(np.zeros(32, np.float32), "q9_9")


def test_wrong_length():
    with pytest.raises(Q.QuantError, match="q4_0.*18-byte"):
        Q.dequantize(b"\0" * 19, "q4_0")
    with pytest.raises(Q.QuantError, match="q4_k.*multiple of the block size 256"):
        Q.quantize(np.zeros(100, np.float32), "q4_k")


def test_type_without_quantizer():
    with pytest.raises(Q.QuantError, match="iq2_xxs has no reference quantizer"):
        Q.quantize(np.zeros(256, np.float32), "iq2_xxs")


def test_removed_type():
    with pytest.raises(Q.QuantError, match="q4_2.*removed"):
        Q.dequantize(b"", "q4_2")


def test_bad_raw_dtype():
    with pytest.raises(Q.QuantError, match="uint8"):
        Q.dequantize(np.zeros(9, np.float32), "q4_0")


def test_accepts_bytes_and_arrays():
    raw = Q.quantize(np.arange(64, dtype=np.float32), "q8_0")
    assert np.array_equal(Q.dequantize(raw.tobytes(), "q8_0"), Q.dequantize(raw, ggml_type("q8_0")))
    assert np.array_equal(Q.dequantize(raw.view(ggml_type("q8_0").layout), "q8_0"), Q.dequantize(raw, "q8_0"))


def test_import_is_light():
    import subprocess
    import sys
    code = ("import sys, time; import numpy; t=time.perf_counter(); import llmlab.ggml.quant; "
            "print(time.perf_counter()-t, 'numba' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    assert float(out[0]) < 0.3 and out[1] == "False"


# ---------------------------------------------------------------- the checklist, for built-ins and the toy format

@pytest.mark.parametrize("name", QUANTIZABLE)
def test_checklist_builtin(name):
    assert all(checklist.run_checklist(name, max_rms=0.9).values())


def test_toy_format_registers_and_passes_the_checklist():
    assert "mini1" not in {t.name for t in TYPES.values()}
    with toy.registered() as t:
        assert ggml_type("mini1") is t and t.bits_per_weight == 3.0
        res = checklist.run_checklist("mini1", toy.reference_dequantize_mini1, max_rms=1.5)
        assert all(res.values()), res
        x = np.array([0.5, -1, 2, -2, 0, 0.25, -0.1, 1], np.float32)
        assert list(Q.dequantize(Q.quantize(x, "mini1"), "mini1")) == [2, -2, 2, -2, -2, 2, -2, 2]
    assert "mini1" not in {t.name for t in TYPES.values()}
    with pytest.raises(Q.QuantError):
        Q.quantize(np.zeros(8, np.float32), "mini1")


def test_package_doctest():
    import doctest
    assert doctest.testmod(Q).failed == 0
