"""Reading ggml's ``struct ggml_tensor`` from Python, with ctypes.

The layout below is ``ggml/include/ggml.h`` of the llama.cpp that
llama-cpp-python 0.3.36 vendors (GGML_MAX_DIMS 4, GGML_MAX_OP_PARAMS 64,
GGML_MAX_SRC 10, GGML_MAX_NAME 64)::

    struct ggml_tensor {
        enum ggml_type type;
        struct ggml_backend_buffer * buffer;
        int64_t ne[4];          // elements per dimension, fastest first
        size_t  nb[4];          // strides in bytes
        enum ggml_op op;
        int32_t op_params[16];
        int32_t flags;
        struct ggml_tensor * src[10];
        struct ggml_tensor * view_src;
        size_t  view_offs;
        void  * data;
        char    name[64];
        void  * extra;
        char    padding[8];
    };

:func:`check_layout` proves the layout against the library itself:
``ggml_tensor_overhead()`` is ``sizeof(ggml_object) + sizeof(ggml_tensor)``,
and a tensor made by ``ggml_new_tensor_2d`` + ``ggml_set_name`` in a scratch
context must read back with the type, shape, strides and name it was given.
Op and type names come from the library (``ggml_op_name``, ``ggml_op_desc``,
``ggml_type_name``) of the bundled ``libggml-base``.
"""
from __future__ import annotations

import ctypes
import functools
from pathlib import Path

import numpy as np

from .. import LLAMA_CPP_PYTHON, LLMLabError
from ..ggml.defs import GGML_MAX_DIMS, GGML_MAX_NAME, GGML_MAX_OP_PARAMS, GGML_MAX_SRC
GGML_OBJECT_SIZE = 32   # struct ggml_object: offs, size, next, type + 4 bytes padding


class GGMLTensor(ctypes.Structure):
    _fields_ = [
        ("type", ctypes.c_int),
        ("buffer", ctypes.c_void_p),
        ("ne", ctypes.c_int64 * GGML_MAX_DIMS),
        ("nb", ctypes.c_size_t * GGML_MAX_DIMS),
        ("op", ctypes.c_int),
        ("op_params", ctypes.c_int32 * (GGML_MAX_OP_PARAMS // 4)),
        ("flags", ctypes.c_int32),
        ("src", ctypes.c_void_p * GGML_MAX_SRC),
        ("view_src", ctypes.c_void_p),
        ("view_offs", ctypes.c_size_t),
        ("data", ctypes.c_void_p),
        ("name", ctypes.c_char * GGML_MAX_NAME),
        ("extra", ctypes.c_void_p),
        ("padding", ctypes.c_char * 8),
    ]


class GGMLInitParams(ctypes.Structure):
    _fields_ = [("mem_size", ctypes.c_size_t), ("mem_buffer", ctypes.c_void_p), ("no_alloc", ctypes.c_bool)]


# numpy element types of the plain ggml types whose values we read (ggml_type ids)
NUMPY_OF_TYPE = {0: np.float32, 1: np.float16, 24: np.int8, 25: np.int16, 26: np.int32, 27: np.int64, 28: np.float64}


def llama_cpp_lib_dir() -> Path:
    """The folder of llama-cpp-python's bundled shared libraries (found without importing llama_cpp)."""
    import importlib.util
    spec = importlib.util.find_spec("llama_cpp")
    if spec is None or not spec.submodule_search_locations:
        raise LLMLabError(f"llama-cpp-python is not installed (pip install llama-cpp-python=={LLAMA_CPP_PYTHON})")
    return Path(list(spec.submodule_search_locations)[0]) / "lib"


@functools.cache
def ggml_base() -> ctypes.CDLL:
    """``libggml-base`` of llama-cpp-python, with the few functions we call declared."""
    d = llama_cpp_lib_dir()
    for name in ("libggml-base.so", "libggml-base.dylib", "ggml-base.dll"):
        if (d / name).exists():
            lib = ctypes.CDLL(str(d / name))
            break
    else:
        raise LLMLabError(f"libggml-base not found in {d}")
    for fn, args, res in [
        ("ggml_op_name", [ctypes.c_int], ctypes.c_char_p),
        ("ggml_op_desc", [ctypes.c_void_p], ctypes.c_char_p),
        ("ggml_type_name", [ctypes.c_int], ctypes.c_char_p),
        ("ggml_tensor_overhead", [], ctypes.c_size_t),
        ("ggml_nbytes", [ctypes.c_void_p], ctypes.c_size_t),
        ("ggml_init", [GGMLInitParams], ctypes.c_void_p),
        ("ggml_free", [ctypes.c_void_p], None),
        ("ggml_new_tensor_2d", [ctypes.c_void_p, ctypes.c_int, ctypes.c_int64, ctypes.c_int64], ctypes.c_void_p),
        ("ggml_set_name", [ctypes.c_void_p, ctypes.c_char_p], ctypes.c_void_p),
        ("ggml_transpose", [ctypes.c_void_p, ctypes.c_void_p], ctypes.c_void_p),
    ]:
        f = getattr(lib, fn)
        f.argtypes, f.restype = args, res
    return lib


@functools.cache
def check_layout() -> None:
    """Prove that :class:`GGMLTensor` matches the library's ``struct ggml_tensor``; raise if not."""
    lib = ggml_base()
    want = lib.ggml_tensor_overhead() - GGML_OBJECT_SIZE
    if ctypes.sizeof(GGMLTensor) != want:
        raise LLMLabError(f"ggml_tensor layout mismatch: ctypes struct is {ctypes.sizeof(GGMLTensor)} bytes, "
                          f"the library's is {want}; this llama-cpp-python is not the {LLAMA_CPP_PYTHON} layout llmlab reads")
    ctx = lib.ggml_init(GGMLInitParams(16 * 1024, None, False))
    try:
        p = lib.ggml_new_tensor_2d(ctx, 0, 3, 5)                 # f32, ne = [3, 5]
        lib.ggml_set_name(p, b"llmlab-probe")
        q = lib.ggml_transpose(ctx, p)
        t, tt = GGMLTensor.from_address(p), GGMLTensor.from_address(q)
        ok = (t.type == 0 and list(t.ne) == [3, 5, 1, 1] and list(t.nb) == [4, 12, 60, 60]
              and t.name == b"llmlab-probe" and op_name(t.op) == "NONE" and t.data
              and op_name(tt.op) == "TRANSPOSE" and tt.src[0] == p and tt.view_src == p
              and list(tt.ne) == [5, 3, 1, 1] and tt.data == t.data)
    finally:
        lib.ggml_free(ctx)
    if not ok:
        raise LLMLabError("ggml_tensor layout mismatch: a probe tensor does not read back as written")


@functools.cache
def op_name(op: int) -> str:
    return ggml_base().ggml_op_name(op).decode()


@functools.cache
def type_name(t: int) -> str:
    return ggml_base().ggml_type_name(t).decode()


def op_desc(ptr: int) -> str:
    """``ggml_op_desc``: the unary or GLU sub-op (``SILU``, ``SWIGLU``, ``GEGLU``...) or the op name."""
    return ggml_base().ggml_op_desc(ptr).decode()


def tensor_name(ptr: int | None) -> str:
    return GGMLTensor.from_address(ptr).name.decode(errors="replace") if ptr else ""


def read_values(t: GGMLTensor) -> np.ndarray | None:
    """Copy the tensor's elements into a NumPy array of shape ``ne[::-1]`` (C order), honouring strides.

    Block-quantized tensors (a q8_0 KV cache) come back as their raw rows:
    uint8 of shape ``(ne3, ne2, ne1, row bytes)``. ``None`` without host data.
    """
    if not t.data:
        return None
    ne = [int(x) for x in t.ne]
    nb = [int(x) for x in t.nb]
    dt = NUMPY_OF_TYPE.get(t.type)
    if dt is None:                      # quantized: rows of blocks
        from ..ggml.types import ggml_type
        row = ggml_type(int(t.type)).row_size(ne[0])
        shape, strides, dt = [ne[3], ne[2], ne[1], row], [nb[3], nb[2], nb[1], 1], np.uint8
    else:
        shape, strides = ne[::-1], nb[::-1]
    if min(shape) <= 0:
        return np.zeros(shape, dt)
    span = sum((n - 1) * s for n, s in zip(shape, strides)) + np.dtype(dt).itemsize
    buf = (ctypes.c_char * span).from_address(t.data)
    return np.ndarray(shape=shape, dtype=dt, buffer=buf, strides=strides).copy()
