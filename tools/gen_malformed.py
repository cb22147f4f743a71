"""The malformed-metadata corpus: small GGUF files that parse but lie, each with the error it must give.

    python tools/gen_malformed.py [OUTDIR]     # default: tests/data/malformed

Every file starts from one tiny LLaMA model (1 layer, n_embd 8, a 36-token SentencePiece
vocabulary, f16 matrices: about 3 KB) written by llmlab's own GGUF writer, and changes one thing:
a key of the wrong type, an impossible value, a tensor missing, unused, of the wrong shape or type,
tensor data not packed as gguf.cpp packs it, NaN weights. ``expected.json`` maps each file to the
one error line ``python -m llmlab logits -m FILE -p hello`` must print (and ``describe`` to what
was changed). ``load_and_run(path)`` is that command's path through the library.

The hypothesis suite (tests/test_malformed_gguf.py) uses ``base_writer`` and ``write_raw`` to mutate
the same model at random.
"""
from __future__ import annotations

import json
import struct
import sys
from pathlib import Path
from typing import Callable

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from llmlab.ggml.gguf import GGUFWriter, ValueType  # noqa: E402
from llmlab.ggml.gguf.writer import _encode_string, encode_value  # noqa: E402

U8, U32, I32, F32, STR, ARR, BOOL = (ValueType.UINT8, ValueType.UINT32, ValueType.INT32, ValueType.FLOAT32,
                                     ValueType.STRING, ValueType.ARRAY, ValueType.BOOL)
OUT = ROOT / "tests" / "data" / "malformed"
PROMPT = "hello world"

# the tiny SentencePiece vocabulary: specials, the word boundary, letters, a few merges
TOKENS = (["<unk>", "<s>", "</s>", "\u2581"] + [chr(c) for c in range(ord("a"), ord("z") + 1)]
          + ["\u2581h", "he", "ll", "lo", "\u2581w", "or"])
TYPES = [2, 3, 3] + [1] * (len(TOKENS) - 3)


def base_writer(arch: str = "llama", n_layer: int = 1, seed: int = 0) -> GGUFWriter:
    """The tiny model every case starts from (as a writer, so a case can change anything)."""
    rng = np.random.default_rng(seed)
    n_embd, n_head, n_head_kv, hd, n_ff, n_vocab = 8, 2, 1, 4, 16, len(TOKENS)
    w = GGUFWriter()
    a = arch + "."
    w.add("general.architecture", arch)
    w.add("general.name", f"malformed-{arch}")
    w.add(a + "block_count", n_layer, U32)
    w.add(a + "context_length", 256, U32)
    w.add(a + "embedding_length", n_embd, U32)
    w.add(a + "feed_forward_length", n_ff, U32)
    w.add(a + "attention.head_count", n_head, U32)
    w.add(a + "attention.head_count_kv", n_head_kv, U32)
    w.add(a + "attention.layer_norm_rms_epsilon", 1e-6, F32)
    w.add(a + "rope.freq_base", 10000.0, F32)
    if arch == "llama":
        w.add(a + "rope.dimension_count", hd, U32)
    else:
        w.add(a + "attention.key_length", hd, U32)
        w.add(a + "attention.value_length", hd, U32)
        w.add(a + "attention.sliding_window", 4, U32)
    w.add("tokenizer.ggml.model", "llama")
    w.add("tokenizer.ggml.tokens", TOKENS, ARR, STR)
    w.add("tokenizer.ggml.scores", np.linspace(0, -10, len(TOKENS)).astype(np.float32), ARR, F32)
    w.add("tokenizer.ggml.token_type", np.array(TYPES, np.int32), ARR, I32)
    w.add("tokenizer.ggml.bos_token_id", 1, U32)
    w.add("tokenizer.ggml.eos_token_id", 2, U32)
    w.add("tokenizer.ggml.unknown_token_id", 0, U32)
    w.add("tokenizer.ggml.add_bos_token", True, BOOL)

    def mat(rows, cols, scale=None):
        s = scale if scale is not None else 1.0 / np.sqrt(cols)
        return (rng.standard_normal((rows, cols)) * s).astype(np.float16)

    def norm(n):
        return (1.0 + 0.1 * rng.standard_normal(n)).astype(np.float32)

    w.add_tensor("token_embd.weight", mat(n_vocab, n_embd, 1.0))
    w.add_tensor("output_norm.weight", norm(n_embd))
    for il in range(n_layer):
        p = f"blk.{il}."
        w.add_tensor(p + "attn_norm.weight", norm(n_embd))
        w.add_tensor(p + "attn_q.weight", mat(n_head * hd, n_embd))
        w.add_tensor(p + "attn_k.weight", mat(n_head_kv * hd, n_embd))
        w.add_tensor(p + "attn_v.weight", mat(n_head_kv * hd, n_embd))
        w.add_tensor(p + "attn_output.weight", mat(n_embd, n_head * hd))
        w.add_tensor(p + "ffn_norm.weight", norm(n_embd))
        w.add_tensor(p + "ffn_gate.weight", mat(n_ff, n_embd))
        w.add_tensor(p + "ffn_up.weight", mat(n_ff, n_embd))
        w.add_tensor(p + "ffn_down.weight", mat(n_embd, n_ff))
        if arch == "gemma3":
            w.add_tensor(p + "attn_q_norm.weight", norm(hd))
            w.add_tensor(p + "attn_k_norm.weight", norm(hd))
            w.add_tensor(p + "post_attention_norm.weight", norm(n_embd))
            w.add_tensor(p + "post_ffw_norm.weight", norm(n_embd))
    return w


def write_raw(w: GGUFWriter, path, offsets: dict[str, int] | None = None, order: list[str] | None = None) -> Path:
    """Write ``w`` with the tensor data placed as told: ``order`` is the data order (directory
    order stays), ``offsets`` overrides individual offsets (data is written there, gaps zero)."""
    align = w.alignment
    names = list(w.tensors)
    off, at = 0, {}
    for n in (order or names):
        at[n] = off
        off += -(-w.tensors[n][2].size // align) * align
    at.update(offsets or {})
    parts = [b"GGUF", struct.pack("<IQQ", w.version, len(w.tensors), len(w.kv))]
    for key, (value, vtype, item) in w.kv.items():
        parts += [_encode_string(key), struct.pack("<I", vtype), encode_value(value, vtype, item)]
    for n in names:
        t, shape, raw = w.tensors[n]
        parts += [_encode_string(n), struct.pack("<I", len(shape)), struct.pack(f"<{len(shape)}Q", *shape),
                  struct.pack("<IQ", t.id, at[n])]
    head = b"".join(parts)
    head += bytes(-len(head) % align)
    end = max(at[n] + w.tensors[n][2].size for n in names)
    data = bytearray(-(-end // align) * align)
    for n in names:
        raw = w.tensors[n][2]
        data[at[n]:at[n] + raw.size] = raw.tobytes()
    path = Path(path)
    path.write_bytes(head + bytes(data))
    return path


def load_and_run(path, prompt: str = PROMPT) -> np.ndarray:
    """What ``python -m llmlab logits -m PATH -p PROMPT`` does, through the library: load the model
    (validated), its tokenizer, check the context, decode, refuse non-finite logits."""
    from llmlab.llama import Batch, Context, Model
    from llmlab.llama.validate import check_context, check_finite
    from llmlab.llama.vocab import Tokenizer
    model = Model(path)
    try:
        tok = Tokenizer.from_model(path)
        ids = tok.tokenize(prompt, add_bos=True, special=True)
        check_context(model.hparams, len(ids), n_prompt=len(ids))
        ctx = Context(model, n_ctx=len(ids), n_batch=len(ids))
        logits = ctx.decode(Batch.from_tokens(ids, logits="all"))
        check_finite(logits)
        return logits
    finally:
        model.gguf.close()


# ---------------------------------------------------------------------------- the cases
def _kv(key, value, vtype=None, item=None):
    def f(w):
        w.add(key, value, vtype, item)
    return f


def _del_kv(key):
    def f(w):
        del w.kv[key]
    return f


def _del_tensor(name):
    def f(w):
        del w.tensors[name]
    return f


def _tensor(name, data=None, type=None, shape=None):
    """Replace one tensor (same place in the directory): new bytes, type or shape."""
    def f(w):
        items = list(w.tensors.items())
        w.tensors.clear()
        for n, (t, sh, raw) in items:
            if n != name:
                w.tensors[n] = (t, sh, raw)
                continue
            w.add_tensor(n, raw if data is None else data(raw, sh), type=t if type is None else type,
                         shape=sh if shape is None else shape)
    return f


def _extra_tensor(name, shape):
    def f(w):
        w.add_tensor(name, np.ones(shape[::-1], np.float32))
    return f


def _nan(raw, sh):
    return np.full(raw.size // 2, np.nan, np.float16).view(np.uint8)


def _inf(raw, sh):
    v = raw.view(np.float16).copy()
    v[::2], v[1::2] = np.inf, -np.inf
    return v.view(np.uint8)


def _both(*changes):
    def f(w):
        for change in changes:
            change(w)
    return f


def _tokens(tokens):
    return _kv("tokenizer.ggml.tokens", tokens, ARR, STR)


L = "llama."
CASES: dict[str, tuple[str, Callable]] = {
    # metadata of the wrong type
    "arch_is_number": ("general.architecture is a uint32", _kv("general.architecture", 7, U32)),
    "arch_unknown": ("general.architecture names no supported architecture", _kv("general.architecture", "qwen9")),
    "arch_missing": ("no general.architecture", _del_kv("general.architecture")),
    "block_count_float": ("block_count is a float32", _kv(L + "block_count", 1.0, F32)),
    "block_count_string": ("block_count is a string", _kv(L + "block_count", "1")),
    "head_count_strings": ("head_count is an array of strings", _kv(L + "attention.head_count", ["2"], ARR, STR)),
    "head_count_per_layer_mixed": ("head_count per layer, with different values",
                                   _kv(L + "attention.head_count", np.array([2, 1], np.uint32), ARR, U32)),
    "head_count_per_layer_length": ("head_count per layer, 2 values for 1 layer",
                                    _kv(L + "attention.head_count", np.array([2, 2], np.uint32), ARR, U32)),
    "eps_is_string": ("the RMS epsilon is a string", _kv(L + "attention.layer_norm_rms_epsilon", "1e-6")),
    "tokens_is_string": ("tokenizer.ggml.tokens is one string", _kv("tokenizer.ggml.tokens", "hello")),
    "tokens_are_ints": ("tokenizer.ggml.tokens is an array of integers",
                        _kv("tokenizer.ggml.tokens", np.arange(len(TOKENS), dtype=np.int32), ARR, I32)),
    "scores_are_strings": ("tokenizer.ggml.scores is an array of strings",
                           _kv("tokenizer.ggml.scores", ["0"] * len(TOKENS), ARR, STR)),
    "token_type_floats": ("tokenizer.ggml.token_type is an array of floats",
                          _kv("tokenizer.ggml.token_type", np.ones(len(TOKENS), np.float32), ARR, F32)),
    "tokenizer_model_number": ("tokenizer.ggml.model is a number", _kv("tokenizer.ggml.model", 1, U32)),
    "tokenizer_model_unknown": ("tokenizer.ggml.model names no supported tokenizer", _kv("tokenizer.ggml.model", "bert")),
    "bos_id_string": ("tokenizer.ggml.bos_token_id is a string", _kv("tokenizer.ggml.bos_token_id", "1")),
    "add_bos_is_int": ("tokenizer.ggml.add_bos_token is a uint8, not a bool", _kv("tokenizer.ggml.add_bos_token", 1, U8)),
    # impossible values
    "key_length_zero": ("attention.key_length is 0", _kv(L + "attention.key_length", 0, U32)),
    "head_count_zero": ("attention.head_count is 0", _kv(L + "attention.head_count", 0, U32)),
    "head_count_kv_not_divisor": ("head_count 2 with head_count_kv 3", _kv(L + "attention.head_count_kv", 3, U32)),
    "context_length_zero": ("context_length is 0", _kv(L + "context_length", 0, U32)),
    "embedding_length_huge": ("embedding_length is 2^32-1", _kv(L + "embedding_length", 2**32 - 1, U32)),
    "eps_zero": ("the RMS epsilon is 0", _kv(L + "attention.layer_norm_rms_epsilon", 0.0, F32)),
    "eps_nan": ("the RMS epsilon is NaN", _kv(L + "attention.layer_norm_rms_epsilon", float("nan"), F32)),
    "freq_base_inf": ("rope.freq_base is +inf", _kv(L + "rope.freq_base", float("inf"), F32)),
    "freq_base_negative": ("rope.freq_base is -10000", _kv(L + "rope.freq_base", -10000.0, F32)),
    "rope_dim_odd": ("rope.dimension_count is odd", _kv(L + "rope.dimension_count", 3, U32)),
    "rope_dim_too_big": ("rope.dimension_count exceeds the head size", _kv(L + "rope.dimension_count", 8, U32)),
    "value_length_differs": ("value_length differs from key_length", _kv(L + "attention.value_length", 8, U32)),
    "scaling_factor_negative": ("rope.scaling.factor is negative", _kv(L + "rope.scaling.factor", -2.0, F32)),
    "tokens_empty": ("tokenizer.ggml.tokens is empty", _tokens([])),
    "tokens_duplicate": ("a token appears twice", _tokens(TOKENS[:-1] + ["he"])),
    "scores_nan": ("a token score is NaN", _kv("tokenizer.ggml.scores",
                                              np.r_[np.zeros(len(TOKENS) - 1), np.nan].astype(np.float32), ARR, F32)),
    "vocab_smaller_than_embd": ("the tokenizer has one token fewer than token_embd has rows", _tokens(TOKENS[:-1])),
    # the tensor directory against the architecture
    "block_count_too_big": ("block_count 2, tensors for 1 layer", _kv(L + "block_count", 2, U32)),
    "tensor_missing": ("blk.0.ffn_down.weight is missing", _del_tensor("blk.0.ffn_down.weight")),
    "tensor_unused": ("a tensor no layer uses", _extra_tensor("blk.1.attn_norm.weight", (8,))),
    "embedding_length_wrong": ("embedding_length 16 for 8-wide tensors", _kv(L + "embedding_length", 16, U32)),
    "feed_forward_length_wrong": ("feed_forward_length 32 for 16-wide FFN tensors", _kv(L + "feed_forward_length", 32, U32)),
    "token_embd_1d": ("token_embd.weight is 1-D", _tensor("token_embd.weight", shape=(8 * len(TOKENS),))),
    "ffn_up_transposed": ("blk.0.ffn_up.weight has its dimensions swapped", _tensor("blk.0.ffn_up.weight", shape=(16, 8))),
    "norm_is_i32": ("blk.0.attn_norm.weight is i32", _tensor("blk.0.attn_norm.weight", type="i32")),
    "matmul_is_i16": ("blk.0.attn_q.weight is i16", _tensor("blk.0.attn_q.weight", type="i16")),
    "norm_is_f64": ("output_norm.weight is f64 (8 bytes a value)",
                    _tensor("output_norm.weight", type="f64",
                            data=lambda raw, sh: np.ones(sh[0], np.float64).view(np.uint8))),
    # strings meant for a terminal: gguf-dump and the error line escape them
    "names_with_control_characters": ("a key and an unused tensor whose names clear the screen and fake a verdict",
                                      _both(_kv("general.\x1b[2J\x1b[H\rALL CHECKS PASSED\x07", "x"),
                                            _extra_tensor("blk.0.\x1b[2J\rALL CHECKS PASSED\x07", (8,)))),
    # compute: a file whose numbers are poison
    "weights_nan": ("blk.0.attn_q.weight is all NaN", _tensor("blk.0.attn_q.weight", data=_nan)),
    "weights_inf": ("blk.0.ffn_up.weight holds +inf and -inf", _tensor("blk.0.ffn_up.weight", data=_inf)),
}

# the data section, placed other than gguf.cpp places it (written by write_raw)
RAW_CASES: dict[str, tuple[str, dict]] = {
    "offsets_gap": ("a 32-byte gap in the data section before output_norm.weight",
                    {"gap_before": "output_norm.weight"}),
    "offsets_reordered": ("tensor data in reverse directory order", {"reverse": True}),
}


def build(name: str, path) -> Path:
    path = Path(path)
    w = base_writer()
    if name in CASES:
        CASES[name][1](w)
        w.write(path)
        return path
    spec = RAW_CASES[name][1]
    if spec.get("reverse"):
        return write_raw(w, path, order=list(reversed(w.tensors)))
    offs, off, align = {}, 0, w.alignment
    for n, (_, _, raw) in w.tensors.items():
        if n == spec["gap_before"]:
            off += align
        offs[n] = off
        off += -(-raw.size // align) * align
    return write_raw(w, path, offsets=offs)


def all_cases() -> list[str]:
    return list(CASES) + list(RAW_CASES)


def describe(name: str) -> str:
    return (CASES.get(name) or RAW_CASES[name])[0]


def expected_error(path) -> str:
    """The error ``load_and_run`` gives (an LLMLabError), as the CLI prints it (one line, control characters escaped)."""
    from llmlab import LLMLabError
    from llmlab.cli import _one_line
    try:
        load_and_run(path)
    except LLMLabError as e:
        return f"error: {_one_line(e)}"
    raise AssertionError(f"{path} loads and runs: not a malformed file")


def main(outdir: str | None = None) -> None:
    out = Path(outdir) if outdir else OUT
    out.mkdir(parents=True, exist_ok=True)
    base = out / "base.gguf"
    base_writer().write(base)
    load_and_run(base)   # the base itself is fine
    expected = {}
    for name in all_cases():
        p = build(name, out / f"{name}.gguf")
        expected[name] = {"changed": describe(name), "error": expected_error(p).replace(str(p.name), "FILE")}
    (out / "expected.json").write_text(json.dumps(expected, indent=1, ensure_ascii=False) + "\n")
    total = sum(f.stat().st_size for f in out.glob("*.gguf"))
    print(f"{len(expected)} cases + base.gguf in {out} ({total:,} bytes)")


if __name__ == "__main__":
    main(*sys.argv[1:2])
