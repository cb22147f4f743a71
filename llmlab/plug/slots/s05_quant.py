"""Notebook 05, quantization blocks: a q8_0 block dequantized (the token embedding's GET_ROWS) and the
q4_1 x q8_1 block dot product (every matmul of SmolLM2).

``dequantize_q8_0`` gets raw 34-byte blocks (an f16 scale d, then 32 signed codes) and returns 32
floats each. ``vec_dot_q4_1_q8_1`` gets the structured blocks of a chunk of weight rows and of the
activations (quantized to q8_1 by the engine, as ggml-cpu does) and returns every row's dot with
every activation row, in the order ggml-cpu's AVX2 kernel adds (``helpers.lane_dot``, ``helpers.fma_sum``).
"""
from __future__ import annotations

import contextlib

import numpy as np

from .. import helpers
from ..hooks import layer_of, op_slot, swap_item
from ..probe import Where
from ..registry import Mistake, Slot, register_slot

F32 = np.float32


# ---- dequantize_q8_0 ---------------------------------------------------------------------------

def dequantize_q8_0(blocks):
    """blocks: uint8 (n, 34): bytes 0-1 the scale d (f16, little-endian), bytes 2-33 the codes
    (int8). Value i of a block is d * q[i]."""
    d = blocks[:, 0:2].copy().view(np.float16).astype(F32)     # (n, 1)
    q = blocks[:, 2:34].view(np.int8).astype(F32)              # (n, 32)
    return d * q


def dequantize_q8_0_skeleton(blocks):
    # blocks: uint8 (n_blocks, 34) -> float32 (n_blocks, 32)
    raise NotImplementedError("dequantize_q8_0: your code here")


def _q8_unsigned(blocks):
    d = blocks[:, 0:2].copy().view(np.float16).astype(F32)
    return d * blocks[:, 2:34].astype(F32)


def _q8_no_scale(blocks):
    return blocks[:, 2:34].view(np.int8).astype(F32)


def _q8_scale_at_end(blocks):
    d = blocks[:, 32:34].copy().view(np.float16).astype(F32)
    return d * blocks[:, 0:32].view(np.int8).astype(F32)


def _q8_big_endian(blocks):
    d = blocks[:, 0:2].copy().view(">f2").astype(F32)
    return d * blocks[:, 2:34].view(np.int8).astype(F32)


def _q8_args(dst, cpu):
    a, ids = dst.src
    A = a.array()
    idx = ids.array()
    rows = []
    for i12 in range(ids.ne[2]):
        for i11 in range(ids.ne[1]):
            r = idx[0, i12, i11].astype(np.int64)
            rows.append(np.ascontiguousarray(A[i12 % a.ne[3], i11 % a.ne[2]][r]).view(np.uint8))
    raw = np.concatenate([x.reshape(len(x), -1) for x in rows])
    return (np.ascontiguousarray(raw).reshape(-1, 34).copy(),)


def _q8_engine(dst):
    return np.ascontiguousarray(dst.array(), dtype=F32).reshape(-1, 32).copy()


def _q8_write(dst, out):
    a = dst.array()
    a[...] = out.reshape(a.shape)


def _install_q8(probe):
    return op_slot("GET_ROWS", probe, _q8_args, _q8_engine, _q8_write,
                   applies=lambda dst: dst.src[0].type.name == "q8_0")


register_slot(Slot(
    name="dequantize_q8_0", notebook="05",
    signature="dequantize_q8_0(blocks: uint8[n_blocks, 34]) -> float32[n_blocks, 32]",
    used_for="the token embedding's GET_ROWS (token_embd is q8_0 in both models): each prompt token's row",
    reference=dequantize_q8_0, skeleton=dequantize_q8_0_skeleton, install=_install_q8, models=("smollm2", "gemma3"),
    mistakes=[
        Mistake("codes read unsigned", _q8_unsigned,
                "the 32 codes are signed bytes (int8): read as uint8, -1 becomes 255"),
        Mistake("scale forgotten", _q8_no_scale, "the codes are not multiplied by the block's scale d (bytes 0-1)"),
        Mistake("scale at the end", _q8_scale_at_end,
                "the scale d comes first in a block_q8_0 (bytes 0-1), then the 32 codes"),
        Mistake("big-endian scale", _q8_big_endian, "the f16 scale is little-endian, as everything in GGUF"),
    ],
    hint_different="the first difference is at {node} ({max_diff}): value i of a block is d * q[i], d the f16 at "
                   "bytes 0-1, q the int8 codes at 2-33"))


# ---- vec_dot_q4_1_q8_1 -------------------------------------------------------------------------

def vec_dot_q4_1_q8_1(w, a):
    """w: block_q4_1 (R, nb) with d, m (f16) and qs (16 bytes: value j in the low nibble of byte j,
    value j+16 in its high nibble), x = d*q + m; a: block_q8_1 (T, nb) with d, s = d*sum(q) (f16) and
    qs (32 int8). -> (T, R): sum over blocks of d_w d_a sum(q_w q_a) + m_w s_a, in ggml's order."""
    qs = w["qs"]
    codes = np.concatenate([qs & 0x0F, qs >> 4], axis=-1)                       # (R, nb, 32)
    dd = (a["d"].astype(F32).T[:, :, None] * w["d"].astype(F32).T[:, None, :]).astype(F32)   # (nb, T, R)
    main = helpers.lane_dot(dd, codes, a["qs"])
    mins = helpers.fma_sum(w["m"].astype(F32).T[:, None, :], a["s"].astype(F32).T[:, :, None])
    return (main + mins).astype(F32)


def vec_dot_q4_1_q8_1_skeleton(w, a):
    # w: block_q4_1 (R, nb): w["d"], w["m"] f16, w["qs"] uint8 (R, nb, 16); a: block_q8_1 (T, nb): a["d"],
    # a["s"] f16, a["qs"] int8 (T, nb, 32) -> float32 (T, R)
    raise NotImplementedError("vec_dot_q4_1_q8_1: your code here")


def _dot_interleaved(w, a):
    qs = w["qs"]
    codes = np.stack([qs & 0x0F, qs >> 4], axis=-1).reshape(qs.shape[:-1] + (32,))
    dd = (a["d"].astype(F32).T[:, :, None] * w["d"].astype(F32).T[:, None, :]).astype(F32)
    mins = helpers.fma_sum(w["m"].astype(F32).T[:, None, :], a["s"].astype(F32).T[:, :, None])
    return (helpers.lane_dot(dd, codes, a["qs"]) + mins).astype(F32)


def _dot_no_min(w, a):
    qs = w["qs"]
    codes = np.concatenate([qs & 0x0F, qs >> 4], axis=-1)
    dd = (a["d"].astype(F32).T[:, :, None] * w["d"].astype(F32).T[:, None, :]).astype(F32)
    return helpers.lane_dot(dd, codes, a["qs"])


def _dot_signed(w, a):
    qs = w["qs"]
    codes = np.concatenate([qs & 0x0F, qs >> 4], axis=-1).astype(np.int16) - 8
    dd = (a["d"].astype(F32).T[:, :, None] * w["d"].astype(F32).T[:, None, :]).astype(F32)
    mins = helpers.fma_sum(w["m"].astype(F32).T[:, None, :], a["s"].astype(F32).T[:, :, None])
    return (helpers.lane_dot(dd, codes, a["qs"]) + mins).astype(F32)


def _dot_float64(w, a):
    qs = w["qs"]
    q = np.concatenate([qs & 0x0F, qs >> 4], axis=-1).astype(np.float64)
    x = w["d"].astype(np.float64)[..., None] * q + w["m"].astype(np.float64)[..., None]      # (R, nb, 32)
    y = a["d"].astype(np.float64)[..., None] * a["qs"].astype(np.float64)                   # (T, nb, 32)
    return np.einsum("rbi,tbi->tr", x, y).astype(F32)


def _install_q4_1(probe):
    from ...ggml.cpu import quants
    from ...ggml.cpu.ops import COMPUTE
    current = [None]
    mm = COMPUTE["MUL_MAT"]

    def mul_mat(dst, cpu=None):
        current[0] = dst
        try:
            mm(dst, cpu)
        finally:
            current[0] = None

    def stack(traits):
        orig = traits.vec_dot

        def vec_dot(w, a, cpu=None):
            out = orig(w, a, cpu)
            node = current[0]
            where = Where(node.name if node is not None else "mul_mat", "MUL_MAT",
                          layer_of(node.name) if node is not None else None, f"{w.shape[0]} rows")
            return probe(where, (w.copy(), a.copy()), out)
        return quants.CPUTraits(traits.vec_dot_type, vec_dot)

    @contextlib.contextmanager
    def install():
        with contextlib.ExitStack() as st:
            st.enter_context(swap_item(COMPUTE, "MUL_MAT", mul_mat))
            table = quants.QUANT_KERNELS["x86"]
            st.enter_context(swap_item(table, "q4_1", stack(table["q4_1"])))
            yield
    return install()


register_slot(Slot(
    name="vec_dot_q4_1_q8_1", notebook="05",
    signature="vec_dot_q4_1_q8_1(w: block_q4_1[R, nb], a: block_q8_1[T, nb]) -> float32[T, R]",
    used_for="every q4_1 weight's MUL_MAT (SmolLM2's q, k, v, o, gate, up, down projections): the weight rows "
             "times the q8_1 activations, block by block (x86 profiles)",
    reference=vec_dot_q4_1_q8_1, skeleton=vec_dot_q4_1_q8_1_skeleton, install=_install_q4_1, models=("smollm2",),
    mistakes=[
        Mistake("nibbles interleaved", _dot_interleaved,
                "values j and j+16 share byte j: the low nibbles are values 0..15, the high nibbles 16..31"),
        Mistake("min term forgotten", _dot_no_min,
                "q4_1 stores x = d*q + m: the min term m_w * s_a of each block is missing"),
        Mistake("codes centred", _dot_signed, "q4_1 codes are 0..15 with the block's min m; subtracting 8 is q4_0's rule"),
        Mistake("float64 dot", _dot_float64,
                "a float64 dot of the dequantized values: ggml adds 8 integer lanes per block with fma, block after "
                "block (helpers.lane_dot), and the min terms apart (helpers.fma_sum); the bits differ at {node}",
                close=True),
    ],
    hint_close="the first difference at {node} is in the last bits ({max_diff}): ggml's lane order and fmas",
    hint_different="the first difference is at {node} ({max_diff}): sum over blocks of d_w d_a sum(q_w q_a) + m_w s_a"))
