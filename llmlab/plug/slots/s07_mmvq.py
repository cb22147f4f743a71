"""Notebook 07, dp4a/MMVQ: one CUDA thread's ``vec_dot_q4_1_q8_1`` in the simulated launch.

With this slot plugged, every q4_1 matmul of a decode step (one token: where llama.cpp's CUDA backend
takes MMVQ) is also run as a simulated ``mul_mat_vec_q`` launch (``llmlab.cuda_sim``, an Ampere-class
GPU), in which every thread's ``vec_dot_q4_1_q8_1_impl`` is the learner's. The CPU's result is what
the model goes on with (a GPU adds in another order, so its bits are not the CPU's llama.cpp's): the
launch runs beside it, and each thread's value is compared with the reference thread's. So the text
cannot change here; the verdict is ``close`` when a thread's value departs by float32 rounding
only (a relative 1e-3 at most) and ``different`` beyond.
"""
from __future__ import annotations

import contextlib
import dataclasses

import numpy as np

from .. import helpers
from ..hooks import layer_of, swap_item
from ..probe import Where
from ..registry import Mistake, Slot, register_slot

F32 = np.float32
VDR, QI8_1, QR4_1 = 2, 8, 2


def vec_dot_q4_1_q8_1_impl(v, u, dm4, ds8, fast_fp16):
    """One thread: v int32[..., 2], two words of 8 packed q4_1 nibbles each; u int32[..., 4], the q8_1
    words they meet (u[2i] the low nibbles' values, u[2i+1] the high ones'); dm4 = (d, m) of the weight
    block, ds8 = (d, s) of the activation block, float32[..., 2]. dp4a on the packed bytes, then the
    scales once: sumi * d4*d8 + m4*s8 / 2 (the block's min term, shared by its two threads). With
    fast_fp16 the two products are rounded to half (__hmul2)."""
    sumi = 0
    for i in range(VDR):
        vi0 = (v[..., i] >> 0) & 0x0F0F0F0F
        vi1 = (v[..., i] >> 4) & 0x0F0F0F0F
        sumi = helpers.dp4a(vi0, u[..., 2 * i], sumi)
        sumi = helpers.dp4a(vi1, u[..., 2 * i + 1], sumi)
    d4d8 = dm4[..., 0] * ds8[..., 0]
    m4s8 = dm4[..., 1] * ds8[..., 1]
    if fast_fp16:
        d4d8 = d4d8.astype(np.float16).astype(F32)
        m4s8 = m4s8.astype(np.float16).astype(F32)
    return (np.asarray(sumi).astype(F32) * d4d8 + m4s8 / F32(QI8_1 // (VDR * QR4_1))).astype(F32)


def vec_dot_q4_1_q8_1_impl_skeleton(v, u, dm4, ds8, fast_fp16):
    # v: int32[..., 2] packed nibbles; u: int32[..., 4] packed int8; dm4, ds8: float32[..., 2] -> float32[...]
    raise NotImplementedError("vec_dot_q4_1_q8_1_impl: your code here")


def _no_mask(v, u, dm4, ds8, fast_fp16):
    sumi = 0
    for i in range(VDR):
        sumi = helpers.dp4a(v[..., i], u[..., 2 * i], sumi)
        sumi = helpers.dp4a(v[..., i] >> 4, u[..., 2 * i + 1], sumi)
    return _scales(sumi, dm4, ds8, fast_fp16, 2)


def _scales(sumi, dm4, ds8, fast_fp16, share):
    d4d8 = dm4[..., 0] * ds8[..., 0]
    m4s8 = dm4[..., 1] * ds8[..., 1]
    if fast_fp16:
        d4d8 = d4d8.astype(np.float16).astype(F32)
        m4s8 = m4s8.astype(np.float16).astype(F32)
    return (np.asarray(sumi).astype(F32) * d4d8 + m4s8 / F32(share)).astype(F32)


def _paired_wrong(v, u, dm4, ds8, fast_fp16):
    sumi = 0
    for i in range(VDR):
        sumi = helpers.dp4a((v[..., i] >> 0) & 0x0F0F0F0F, u[..., 2 * i + 1], sumi)
        sumi = helpers.dp4a((v[..., i] >> 4) & 0x0F0F0F0F, u[..., 2 * i], sumi)
    return _scales(sumi, dm4, ds8, fast_fp16, 2)


def _min_whole(v, u, dm4, ds8, fast_fp16):
    r = vec_dot_q4_1_q8_1_impl(v, u, dm4, ds8, fast_fp16)
    m4s8 = dm4[..., 1] * ds8[..., 1]
    if fast_fp16:
        m4s8 = m4s8.astype(np.float16).astype(F32)
    return (r + m4s8 / F32(2)).astype(F32)


def _no_half(v, u, dm4, ds8, fast_fp16):
    return vec_dot_q4_1_q8_1_impl(v, u, dm4, ds8, False)


def _install(probe):
    from ...cuda_sim import vecdotq as V
    from ...cuda_sim.dp4a import get_int_b4, load_half
    from ...cuda_sim.mmvq import simulate
    from ...ggml.cpu.ops import COMPUTE
    orig_t = V.CUDA_TYPES["q4_1"]
    orig_vec_dot = orig_t.vec_dot
    current = [None]

    def vec_dot(vx, vy, kbx, kby, iqs, *, fast_fp16=True, ints=None):
        engine = orig_vec_dot(vx, vy, kbx, kby, iqs, fast_fp16=fast_fp16, ints=ints)
        bq4_1, bq8_1 = np.asarray(kbx) * V.G.BLOCK_Q4_1.itemsize, np.asarray(kby) * V.Q8_1_SIZE
        qs = V._field(V.G.BLOCK_Q4_1, "qs")
        v = np.stack([np.broadcast_to(get_int_b4(vx, bq4_1 + qs, iqs + i), engine.shape) for i in range(VDR)], -1)
        u = np.stack([np.broadcast_to(get_int_b4(vy, bq8_1 + V.Q8_1_QS, iqs + i + k * 4), engine.shape)
                      for i in range(VDR) for k in (0, 1)], -1)
        dm4 = np.stack([np.broadcast_to(load_half(vx, bq4_1 + o), engine.shape) for o in (0, 2)], -1)
        ds8 = np.stack([np.broadcast_to(load_half(vy, bq8_1 + o), engine.shape) for o in (0, 2)], -1)
        node = current[0]
        where = Where(node.name if node is not None else "mul_mat_vec_q", "MUL_MAT",
                      layer_of(node.name) if node is not None else None, "simulated MMVQ launch, every thread")
        return probe(where, (v.astype(np.int32), u.astype(np.int32), dm4.astype(F32), ds8.astype(F32),
                             bool(fast_fp16)), np.asarray(engine, F32))

    mm = COMPUTE["MUL_MAT"]

    def mul_mat(dst, cpu=None):
        mm(dst, cpu)
        a, b = dst.src
        if a.type.name != "q4_1" or b.ne[1] != 1 or b.ne[2] != 1 or b.ne[3] != 1 or a.view_src is not None \
                or layer_of(dst.name) is None:       # the layers' matmuls (a q4_1 LM head would be 49k rows)
            return
        current[0] = dst
        try:
            x = np.ascontiguousarray(b.array(), dtype=F32).reshape(-1)
            simulate(np.ascontiguousarray(a.array()).view(np.uint8).reshape(a.ne[1], -1), "q4_1", x)
        finally:
            current[0] = None

    @contextlib.contextmanager
    def install():
        with contextlib.ExitStack() as st:
            st.enter_context(swap_item(V.CUDA_TYPES, "q4_1", dataclasses.replace(orig_t, vec_dot=vec_dot)))
            st.enter_context(swap_item(COMPUTE, "MUL_MAT", mul_mat))
            yield
    return install()


register_slot(Slot(
    name="vec_dot_q4_1_q8_1_impl", notebook="07",
    signature="vec_dot_q4_1_q8_1_impl(v: int32[..., 2], u: int32[..., 4], dm4: float32[..., 2], "
              "ds8: float32[..., 2], fast_fp16: bool) -> float32[...]",
    used_for="every thread of a simulated MMVQ launch (cuda_sim, Ampere) of each q4_1 matmul of a decode step "
             "of SmolLM2, run beside the CPU's product (the text stays the CPU's)",
    reference=vec_dot_q4_1_q8_1_impl, skeleton=vec_dot_q4_1_q8_1_impl_skeleton, install=_install,
    models=("smollm2",), shadow=True,
    mistakes=[
        Mistake("nibbles not masked", _no_mask,
                "the nibbles were not masked: (v >> 4) & 0x0F0F0F0F keeps four 4-bit values, one per byte"),
        Mistake("low and high swapped", _paired_wrong,
                "the low nibbles meet u[2i] (values 0..15 of the block), the high ones u[2i+1] (values 16..31)"),
        Mistake("whole min term", _min_whole,
                "each of the block's two threads adds half the min term m*s: the warp's sum adds both"),
        Mistake("no half products", _no_half,
                "with fast half math (sm_60+) d4*d8 and m4*s8 are rounded to half (__hmul2)", close=True),
    ],
    hint_close="the first thread that departs is in {node}'s launch by float rounding only ({max_diff}): "
               "check the half products",
    hint_different="the first thread that departs is in {node}'s launch ({max_diff}): dp4a of the masked nibbles, "
                   "then sumi * d4*d8 + m4*s8 / 2"))
