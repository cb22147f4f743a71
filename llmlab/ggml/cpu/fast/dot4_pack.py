"""The byte-dot kernels' packed layouts (``dot4_legacy``, ``dot4_kquants``), made once per weight at load.

Legacy quants (the one legacy packer, ``quants.pack_legacy``, in its ``quads`` layout): ``qs[g, b, c]``
bytes of row group g (rows 16g .. 16g+15, the last group zero-padded), block b, chunk c
of 64 bytes: q4 types 4 chunks, chunk j holding for each row r the 4 bytes 4j..4j+3 of its block (low
nibbles: values 4j+k, lane j; high nibbles: values 16+4j+k, lane j+4), i.e. the file's bytes regrouped;
q5_0 the same plus ``qh[g, b, r]`` (its 32 fifth bits); q8_0 8 chunks, chunk j the 4 codes of lane j
plus 128. ``d[g, b, r]`` (q4_1's ``m``): the float16 scales as their bits. q4_K: see ``pack_q4_k``."""
from __future__ import annotations

import numpy as np

from .dot4_legacy import R16
from .quants import groups as _groups, pack_legacy


def pack_legacy_quads(raw: np.ndarray, tname: str, K: int) -> tuple:
    """Raw rows of q4_0 / q4_1 / q5_0 / q8_0 -> (qs, qh, d, m) in this layout."""
    return pack_legacy(raw, tname, K, "quads")


def _groups16(a: np.ndarray, R: int) -> np.ndarray:
    """(R, nb, ...) -> (ng, nb, ..., 16): per-row values (scales) of 16-row groups, the rows last."""
    return _groups(a, R, R16)


def _chunks(q: np.ndarray, R: int) -> np.ndarray:
    """Codes (R, nb, ..., 4) -> (ng, nb, n * 64) bytes: for each block the chunks of 64 bytes, each the
    4 codes of 16 rows side by side (the rows moved before the last axis)."""
    g = _groups(q, R, R16, axis=-2)
    return g.reshape(g.shape[0], g.shape[1], -1)


def pack_q4_k(raw: np.ndarray, tname: str, K: int) -> tuple:
    """Raw rows (R, row_bytes) of q4_K -> (qs, sc, mn, d, dmin) in the layout of _mul_mat_q4_k."""
    from ...quant import k_quants as KQ
    nb = K // 256
    w = np.ascontiguousarray(raw).reshape(-1).view(KQ.BLOCK_Q4_K).reshape(-1, nb)
    R = w.shape[0]
    qs = _chunks(np.ascontiguousarray(w["qs"]).reshape(R, nb, 4, 8, 4), R)  # (row, block, j, q, k)
    sc, mn = KQ.scale_min_k4(w.reshape(-1)["scales"])
    return (qs, _groups16(sc.astype(np.uint8).reshape(R, nb, 8), R), _groups16(mn.astype(np.uint8).reshape(R, nb, 8), R),
            _groups16(np.ascontiguousarray(w["d"]).view(np.uint16), R),
            _groups16(np.ascontiguousarray(w["dmin"]).view(np.uint16), R))


def pack_q6_k(raw: np.ndarray, tname: str, K: int) -> tuple:
    """Raw rows (R, row_bytes) of q6_K -> (qs, sc, d) in the layout of _mul_mat_q6_k: the unsigned 6-bit
    codes as bytes, chunk 8u + c holding quad u of 32-value chunk c for 16 rows (the order the vec_dot
    step reads them: one lane's 8 chunks in a row, the block's 4 KiB read straight through); scales int8; d f16 bits."""
    from ...quant import k_quants as KQ
    nb = K // 256
    w = np.ascontiguousarray(raw).reshape(-1).view(KQ.BLOCK_Q6_K).reshape(-1, nb)
    R = w.shape[0]
    codes = (KQ.q6k_codes(w.reshape(-1)).astype(np.int16) + 32).astype(np.uint8)
    qs = _chunks(codes.reshape(R, nb, 8, 8, 4).swapaxes(2, 3), R)           # (row, block, u, c, k)
    return (qs, _groups16(np.ascontiguousarray(w["scales"]).view(np.int8).reshape(R, nb, 16), R),
            _groups16(np.ascontiguousarray(w["d"]).view(np.uint16), R))
