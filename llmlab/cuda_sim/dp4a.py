"""32-bit registers as the GPU sees them: ``dp4a``, byte-wise tricks, and aligned loads from device memory.

A CUDA thread works on ``int``: four int8 lanes packed in one 32-bit register. ``dp4a`` multiplies the
four lanes of two registers pairwise and adds the four products to a 32-bit accumulator, in one
instruction; everything the kernels do around it (masks, shifts, ``__vsub4``) keeps data in that shape.

Device memory is modelled as a flat byte buffer (:class:`Memory`). Loads take byte addresses, check the
alignment their width needs (a misaligned 4-byte load is a fault on the GPU, here an error), and can be
logged, so a simulated launch can later draw which thread read which bytes.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

I32 = np.int32
_LANES = np.arange(4, dtype=np.int64) * 8


def _u32(x) -> np.ndarray:
    """Any int, int32 or uint32 (scalar or array) as its 32 bits in an int64 array, 0 .. 2**32-1."""
    return np.asarray(x, dtype=np.int64) & 0xFFFFFFFF


def wrap_i32(x) -> np.ndarray:
    """Two's-complement wrap of integers to int32, as a 32-bit register overflows."""
    return ((_u32(x) ^ 0x80000000) - 0x80000000).astype(I32)


def bytes_s8(x) -> np.ndarray:
    """The four signed bytes of 32-bit registers, lowest byte first: shape ``(..., 4)``, int64."""
    b = (_u32(x)[..., None] >> _LANES) & 0xFF
    return (b ^ 0x80) - 0x80


def pack_s8(b) -> np.ndarray:
    """Inverse of :func:`bytes_s8`: four bytes (signed or unsigned, last axis) into int32 registers."""
    b = np.asarray(b, dtype=np.int64) & 0xFF
    return wrap_i32((b << _LANES).sum(-1))


def dp4a(a, b, c):
    """PTX ``dp4a.s32.s32 d, a, b, c``: ``c + sum_k a_k * b_k`` over the four signed bytes, wrapping like int32.

    Scalars give a numpy int32 scalar, arrays broadcast. ``a``/``b`` may be given as unsigned
    hex constants (``0xE0E0E0E0``): only their 32 bits count.
    """
    d = wrap_i32((bytes_s8(a) * bytes_s8(b)).sum(-1) + np.asarray(c, dtype=np.int64))
    return d[()] if d.ndim == 0 else d


def vsub4(a, b):
    """CUDA's ``__vsub4``: byte-wise ``a - b``, each byte wrapping on its own (no borrow between bytes)."""
    d = pack_s8(bytes_s8(a) - bytes_s8(b))
    return d[()] if d.ndim == 0 else d


def vsubss4(a, b):
    """CUDA's ``__vsubss4``: byte-wise signed ``a - b``, each byte saturating to -128..127 (older llama.cpp's q6_K)."""
    d = pack_s8(np.clip(bytes_s8(a).astype(np.int64) - bytes_s8(b), -128, 127))
    return d[()] if d.ndim == 0 else d


# ---------------------------------------------------------------- device memory


@dataclass
class Read:
    """One load instruction over a grid of threads: byte addresses (any shape) and the bytes each reads."""
    memory: str
    addr: np.ndarray
    nbytes: int


@dataclass
class Memory:
    """A flat buffer of device memory, padded to whole 32-bit words; ``log`` collects :class:`Read` records."""
    data: np.ndarray
    name: str = "mem"
    log: list | None = field(default=None, repr=False)

    def __post_init__(self):
        raw = np.ascontiguousarray(self.data, dtype=np.uint8).reshape(-1)
        self.nbytes = raw.size
        self.data = np.concatenate([raw, np.zeros(-raw.size % 4, np.uint8)])

    def load(self, addr, dtype: str) -> np.ndarray:
        """Load one value of ``dtype`` ('<i4', '<u2', '<f2', 'i1', 'u1') at each byte address; addresses must be aligned."""
        addr = np.asarray(addr, dtype=np.int64)
        size = np.dtype(dtype).itemsize
        if np.any(addr % size):
            raise ValueError(f"{self.name}: misaligned {size}-byte load at byte {int(addr[addr % size != 0].flat[0])}")
        if self.log is not None:
            self.log.append(Read(self.name, addr, size))
        return self.data.view(dtype)[addr // size]


def get_int_b2(mem: Memory, ptr, i32) -> np.ndarray:
    """Word ``i32`` after byte ``ptr``, read as two 16-bit halves: for fields only 2-byte aligned (q4_0's ``qs``)."""
    addr = np.asarray(ptr, dtype=np.int64) + 4 * np.asarray(i32, dtype=np.int64)
    lo = mem.load(addr, "<u2").astype(np.int64)
    hi = mem.load(addr + 2, "<u2").astype(np.int64)
    return wrap_i32(lo | hi << 16)


def get_int_b4(mem: Memory, ptr, i32) -> np.ndarray:
    """Word ``i32`` after byte ``ptr`` in one 32-bit load: the address must be 4-byte aligned (q8_1's ``qs``)."""
    addr = np.asarray(ptr, dtype=np.int64) + 4 * np.asarray(i32, dtype=np.int64)
    return mem.load(addr, "<i4").astype(I32)


def load_half(mem: Memory, addr) -> np.ndarray:
    """An f16 at ``addr``, widened to float32 (``__half2float``, exact)."""
    return mem.load(addr, "<f2").astype(np.float32)
