"""``quantize``: requantize a GGUF model to another ggml type, like llama.cpp's ``llama-quantize``.

Every 2-D (or higher) weight that llama.cpp would quantize is dequantized to f32 and
quantized again with ggml's reference quantizer; norms, biases and other 1-D tensors are
copied as they are. A tensor whose rows do not split into whole blocks falls back to
the type llama.cpp falls back to (q4_k -> q5_0, q6_k -> q8_0, ...). The metadata is
copied and ``general.file_type`` set to the llama_ftype of the target.

The output is written safely: never over the input (same inode) or over something that is not a
regular file, through a temporary file in the target directory renamed into place at the end, and
that temporary file is removed on any failure (Ctrl-C included).
"""
from __future__ import annotations


from .. import LLMLabError, models

# llama_ftype of a whole-model target (llama.h): the "mostly TYPE" file types
FILE_TYPES = {"f32": 0, "f16": 1, "q4_0": 2, "q4_1": 3, "q8_0": 7, "q5_0": 8, "q5_1": 9, "q2_k": 10,
              "q3_k": 11, "q4_k": 14, "q5_k": 16, "q6_k": 18, "bf16": 32, "tq1_0": 36, "tq2_0": 37,
              "mxfp4": 38, "q1_0": 40, "iq4_nl": 25, "iq4_xs": 30}

# tensor_type_fallback() in llama-quant.cpp: rows not a multiple of the block size
FALLBACK = {"q2_k": "q4_0", "q3_k": "q4_0", "tq1_0": "q4_0", "tq2_0": "q4_0", "q4_k": "q5_0",
            "q5_k": "q5_1", "q6_k": "q8_0", "iq4_xs": "iq4_nl"}

# substrings of weight names llama.cpp never quantizes (tensor_allows_quantization)
KEEP = ("_norm.weight", "ffn_gate_inp.weight", "altup", "laurel", "per_layer_model_proj", "position_embd",
        "token_types.weight", "ssm_conv1d", "shortconv.conv.weight", "time_mix_", "attn_rel_b.weight", "rel_pos",
        "patch_embd", "patch_merger")


def register(sub) -> None:
    p = sub.add_parser("quantize", help="requantize a GGUF model to another type (like llama-quantize)")
    p.add_argument("input", help="input .gguf, or a registry name (smollm2, gemma3)")
    p.add_argument("output", help="output .gguf")
    p.add_argument("type", help=f"target type: {', '.join(FILE_TYPES)}")
    p.add_argument("--allow-requantize", action="store_true",
                   help="allow requantizing tensors that are already quantized (quality loss)")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.set_defaults(func=run)


def allows_quantization(name: str, shape: tuple[int, ...]) -> bool:
    return len(shape) >= 2 and name.endswith("weight") and not any(k in name for k in KEEP)


def target_type(name: str, shape: tuple[int, ...], qtype: str) -> str | None:
    """The type a tensor gets, or None to keep it as it is."""
    from ..ggml.types import ggml_type
    if not allows_quantization(name, shape):
        return None
    t = qtype
    if shape[0] % ggml_type(t).block_size:
        t = FALLBACK.get(t)
        if t is None or shape[0] % ggml_type(t).block_size:
            t = "f16"
    return t


def plan(f, qtype: str) -> list[tuple[object, str | None]]:
    return [(t, target_type(t.name, t.shape, qtype)) for t in f.tensors]


def quantize_file(src, dst, qtype: str, allow_requantize: bool = False, progress: bool = True) -> dict:
    """Quantize the GGUF file ``src`` into ``dst``; returns a summary (types chosen, sizes)."""
    from ..ggml.gguf import GGUFFile, GGUFWriter, ValueType
    from ..progress import Progress
    from ..ggml import quant
    from ..ggml.types import ggml_type
    from ..safeio import atomic_write, check_output

    qtype = qtype.lower()
    if qtype not in FILE_TYPES:
        raise LLMLabError(f"unknown or unsupported target type {qtype!r} (choose from {', '.join(FILE_TYPES)})")
    check_output(dst, [src])     # before any work: not the input, not a directory or a device
    with GGUFFile(src) as f:
        jobs = plan(f, qtype)
        for t, new in jobs:
            if new and t.type.name != new and t.type.is_quantized and not allow_requantize:
                raise LLMLabError(f"tensor {t.name} is already quantized ({t.type.name}): "
                                  "requantizing loses quality; pass --allow-requantize to do it anyway")
            if new and t.type.to_float is None and t.type.name != new:
                raise LLMLabError(f"tensor {t.name}: type {t.type.name} cannot be dequantized by llmlab")
        w = GGUFWriter.from_file(f)
        w.tensors.clear()
        w.add("general.file_type", FILE_TYPES[qtype], vtype=ValueType.UINT32)
        w.add("general.quantization_version", 2, vtype=ValueType.UINT32)
        total = sum(4 * t.n_elements for t, new in jobs if new and new != t.type.name) or 1
        done, types = 0, {}
        with Progress(total, f"quantize {qtype}", unit="B", enabled=progress) as bar:   # float32 bytes processed
            for t, new in jobs:
                if new is None or new == t.type.name:
                    w.add_tensor(t.name, t.data.copy(), type=t.type, shape=t.shape)
                    types[t.name] = t.type.name
                    continue
                values = quant.dequantize(t.data, t.type)
                raw = quant.quantize(values, new)
                w.add_tensor(t.name, raw, type=ggml_type(new), shape=t.shape)
                types[t.name] = new
                done += 4 * t.n_elements
                bar.update(done)
        size_in = sum(t.nbytes for t in f.tensors)
        with atomic_write(dst, inputs=[src]) as fh:
            w.write(fh)
    size_out = sum(raw.size for _, _, raw in w.tensors.values())
    return {"types": types, "bytes_in": size_in, "bytes_out": size_out}


def run(args) -> int:
    summary = quantize_file(models.resolve(args.input), args.output, args.type, args.allow_requantize, progress=not args.quiet)
    counts: dict[str, int] = {}
    for name in summary["types"].values():
        counts[name] = counts.get(name, 0) + 1
    print(f"{args.output}: {summary['bytes_in'] / 1e6:.1f} MB -> {summary['bytes_out'] / 1e6:.1f} MB of tensors; "
          + ", ".join(f"{n} {k}" for k, n in sorted(counts.items())))
    return 0
