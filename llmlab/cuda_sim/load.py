"""What happens to weights on their way to an accelerator: the pinned-buffer upload ring of llama.cpp's
model loader, the zero padding a CUDA buffer adds behind a quantized tensor, and the load-time
requantization a CPU plug-in (SpacemiT IME) applies when it repacks weights.

* ``upload_chunks`` / ``upload_timeline``: ``llama_model_loader::load_all_data`` without mmap reads each
  tensor in chunks into 4 pinned host buffers (1 MiB each; 64 MiB + 2 x alignment with direct I/O) and
  uploads them with ``ggml_backend_tensor_set_async``; an event per buffer makes the next read of that buffer
  wait until its upload is done, so reading chunk i+1 overlaps uploading chunk i.
* ``cuda_alloc_size`` / ``bad_padding_clear``: ``ggml_backend_cuda_buffer_type_get_alloc_size`` adds one
  row of padding (to a multiple of ``MATRIX_ROW_PADDING`` = 512 values) behind every quantized tensor whose
  rows are not a multiple of 512; the padding must hold zeros, and may only be cleared when the tensor is
  not a view of another one.
* ``repack_q4_k_to_q4_1`` / ``repack_q6_k_to_q8_0``: spacemit/repack.cpp turns each q4_K super-block into
  8 q4_1 blocks (scale and min products rounded to f16) and each q6_K super-block into 8 q8_0 blocks (the two
  16-value scales of every 32 merged into one, the codes rounded again): a requantization at load time.

Source: the llama.cpp that llama-cpp-python 0.3.36 vendors (src/llama-model-loader.cpp,
ggml/src/ggml-cuda/ggml-cuda.cu and mmvq.cu, ggml/src/ggml-cpu/spacemit/repack.cpp).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from . import _ggml as G
from .q8_1 import MATRIX_ROW_PADDING

N_BUFFERS = 4
BUFFER_SIZE = 1 << 20                   # 1 MiB per pinned buffer without direct I/O
DIRECT_IO_BUFFER_SIZE = 64 << 20        # plus 2 x alignment, with direct I/O


# ---------------------------------------------------------------- the async upload ring


@dataclass(frozen=True)
class Chunk:
    tensor: str
    buffer: int          # which of the N_BUFFERS pinned buffers it goes through
    read_bytes: int      # bytes read from the file (aligned)
    copy_bytes: int      # bytes of tensor data uploaded from it
    offset: int          # where in the tensor they land


def upload_chunks(tensors, alignment: int = 1, buffer_size: int | None = None, n_buffers: int = N_BUFFERS) -> list[Chunk]:
    """The chunks ``load_all_data`` reads and uploads for ``tensors`` = [(name, file offset, nbytes)], in order."""
    if buffer_size is None:
        buffer_size = DIRECT_IO_BUFFER_SIZE + 2 * alignment if alignment != 1 else BUFFER_SIZE
    out, buf = [], 0
    for name, offset, n_size in tensors:
        aligned = offset & ~(alignment - 1)
        lead = offset - aligned
        read_end = (offset + n_size + alignment - 1) & ~(alignment - 1)
        done = copied = 0
        while done < read_end - aligned:
            read = min(buffer_size, read_end - aligned - done)
            copy = read - (lead if done == 0 else 0)
            if aligned + done + read > offset + n_size:
                copy -= read_end - (offset + n_size)
            out.append(Chunk(name, buf, read, copy, copied))
            copied += copy
            done += read
            buf = (buf + 1) % n_buffers
    return out


def upload_timeline(chunks: list[Chunk], read_bytes_per_s: float, upload_bytes_per_s: float,
                    n_buffers: int = N_BUFFERS) -> np.ndarray:
    """(n, 4) array of [read start, read end, upload start, upload end] seconds per chunk.

    One reader thread and one upload stream: a read waits for the upload that last used its buffer
    (``ggml_backend_event_synchronize``); an upload waits for its read and for the previous upload.
    """
    t = np.zeros((len(chunks), 4))
    read_free = 0.0
    for i, c in enumerate(chunks):
        buffer_free = t[i - n_buffers, 3] if i >= n_buffers else 0.0
        t[i, 0] = max(read_free, buffer_free)
        t[i, 1] = read_free = t[i, 0] + c.read_bytes / read_bytes_per_s
        t[i, 2] = max(t[i, 1], t[i - 1, 3] if i else 0.0)
        t[i, 3] = t[i, 2] + c.copy_bytes / upload_bytes_per_s
    return t


# ---------------------------------------------------------------- padding behind quantized tensors


def cuda_alloc_size(type_name: str, shape) -> int:
    """``ggml_backend_cuda_buffer_type_get_alloc_size``: bytes of a tensor plus, for a quantized type whose
    rows are not a multiple of 512 values, one row's worth of padding (``MATRIX_ROW_PADDING - ne0 % 512`` values)."""
    t = G.ggml_type(type_name)
    ne0 = int(shape[0])
    nbytes = int(np.prod(shape)) // t.block_size * t.type_size
    if t.block_size > 1 and ne0 % MATRIX_ROW_PADDING:
        nbytes += (MATRIX_ROW_PADDING - ne0 % MATRIX_ROW_PADDING) // t.block_size * t.type_size
    return nbytes


def bad_padding_clear(compute_buffer: bool, nbytes: int, alloc_size: int, is_view: bool) -> bool:
    """True when a matrix product's weights sit in a compute buffer with padding behind them (which
    MMVQ/MMQ would clear with ``cudaMemsetAsync``) but are a view of another tensor, so clearing could
    overwrite that tensor's data: ``ggml_cuda_mul_mat`` then takes cuBLAS instead."""
    return compute_buffer and nbytes != alloc_size and is_view


# ---------------------------------------------------------------- SpacemiT IME: repacking is requantizing


def repack_q4_k_to_q4_1(raw: np.ndarray) -> np.ndarray:
    """q4_K super-blocks (bytes) -> 8 q4_1 blocks each (bytes): ``d1 = f16(d * sc)``, ``m1 = f16(-(dmin * m))``,
    the same 4-bit codes (spacemit ``repack_q4_k_to_q4_1_16_bl`` without its 16-row interleave)."""
    b = np.asarray(raw, np.uint8).reshape(-1).view(G.BLOCK_Q4_K)
    sc, mn = G.scale_min_k4(b["scales"])
    d, dmin = b["d"].astype(np.float32)[:, None], b["dmin"].astype(np.float32)[:, None]
    out = np.zeros((len(b), 8), G.BLOCK_Q4_1)
    out["d"] = (d * sc.astype(np.float32)).astype(np.float16)
    out["m"] = (-(dmin * mn.astype(np.float32))).astype(np.float16)
    q = G.q4k_codes(b["qs"]).reshape(len(b), 8, 32)
    out["qs"] = q[..., :16] | (q[..., 16:] << 4)
    return out.reshape(-1).view(np.uint8)


def repack_q6_k_to_q8_0(raw: np.ndarray) -> np.ndarray:
    """q6_K super-blocks (bytes) -> 8 q8_0 blocks each (bytes), as spacemit ``repack_q6_k_to_q8_0_32_bl`` does:
    per 32 values, ``reflect = max|code * scale_i * d| / 127`` and new codes ``clamp(nearbyint(code * scale_i * d / reflect))``."""
    b = np.asarray(raw, np.uint8).reshape(-1).view(G.BLOCK_Q6_K)
    a = G.q6k_codes(b).reshape(len(b), 8, 2, 16).astype(np.float32)
    scale = b["scales"].astype(np.float32).reshape(len(b), 8, 2, 1) * b["d"].astype(np.float32).reshape(-1, 1, 1, 1)
    amax = np.abs(a * scale).max(axis=(2, 3), keepdims=True)
    reflect = amax / np.float32(127)
    with np.errstate(divide="ignore", invalid="ignore"):
        codes = np.clip(np.rint(a * (scale / reflect)), -128, 127)
    codes = np.where(reflect > 0, codes, 0)            # an all-zero group: the C++ divides by zero; zeros are what it means
    out = np.zeros((len(b), 8), G.BLOCK_Q8_0)
    out["d"] = reflect.reshape(len(b), 8).astype(np.float16)
    out["qs"] = codes.reshape(len(b), 8, 32).astype(np.int8)
    return out.reshape(-1).view(np.uint8)
