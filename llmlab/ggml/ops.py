"""Op constructors with ggml's names and shape rules: each one records a node, none computes.

``mul_mat(ctx, a, b)`` follows ggml: ``a`` is the weight ``[K, M]``, ``b`` the
activations ``[K, N, ...]``, the result ``[M, N, ...]`` (ne order). Views,
reshapes, permutes and transposes only make new ne/nb over the same bytes.
The element-wise unary and gated ops are named by what they compute (SILU,
GELU, SWIGLU, GEGLU), as ``ggml_op_desc`` prints them; ggml files them under
GGML_OP_UNARY and GGML_OP_GLU.
"""
from __future__ import annotations

from .context import GGMLContext
from .tensor import F32, FLAG_INPUT, FLAG_OUTPUT, FLAG_PARAM, I32, Tensor, row_strides

# ggml.h's rope mode bits (``mode & GGML_ROPE_TYPE_NEOX``: rotate pairs (i, i + n_dims/2), not (2i, 2i+1));
# which mode an architecture uses is llama.h's LLAMA_ROPE_TYPE_* (llmlab.llama.hparams)
GGML_ROPE_TYPE_NEOX = 2


def _node(ctx: GGMLContext, op: str, type, ne, src, params=None, name: str = "") -> Tensor:
    return ctx.new(Tensor(type, ne, op=op, src=[s for s in src if s is not None], op_params=params, name=name))


def _check(cond: bool, msg: str) -> None:
    if not cond:
        raise ValueError(msg)


# ---- leafs
def new_tensor(ctx: GGMLContext, type, *ne: int, name: str = "") -> Tensor:
    return ctx.new(Tensor(type, ne, name=name))


def set_input(t: Tensor) -> Tensor:
    t.flags |= FLAG_INPUT
    return t


def set_output(t: Tensor) -> Tensor:
    t.flags |= FLAG_OUTPUT
    return t


def set_param(t: Tensor) -> Tensor:
    t.flags |= FLAG_PARAM
    return t


def set_name(t: Tensor, name: str) -> Tensor:
    t.name = name
    return t


def can_repeat(b: Tensor, a: Tensor) -> bool:
    """b can be broadcast to a (ggml_can_repeat): each ne of a is a multiple of b's."""
    return all(b.ne[i] and a.ne[i] % b.ne[i] == 0 for i in range(4))


# ---- arithmetic
def add(ctx, a: Tensor, b: Tensor) -> Tensor:
    _check(can_repeat(b, a), f"add: {b.shape_str()} cannot be broadcast to {a.shape_str()}")
    return _node(ctx, "ADD", F32, a.ne, (a, b))


def mul(ctx, a: Tensor, b: Tensor) -> Tensor:
    _check(can_repeat(b, a), f"mul: {b.shape_str()} cannot be broadcast to {a.shape_str()}")
    return _node(ctx, "MUL", F32, a.ne, (a, b))


def scale(ctx, a: Tensor, s: float) -> Tensor:
    return _node(ctx, "SCALE", F32, a.ne, (a,), {"scale": float(s)})


def mul_mat(ctx, a: Tensor, b: Tensor) -> Tensor:
    _check(a.ne[0] == b.ne[0], f"mul_mat: inner dimensions differ ({a.name or 'a'} ne0={a.ne[0]}, {b.name or 'b'} ne0={b.ne[0]})")
    _check(b.ne[2] % a.ne[2] == 0 and b.ne[3] % a.ne[3] == 0,
           f"mul_mat: {a.shape_str()} cannot be broadcast over {b.shape_str()}")
    return _node(ctx, "MUL_MAT", F32, (a.ne[1], b.ne[1], b.ne[2], b.ne[3]), (a, b))


def get_rows(ctx, a: Tensor, b: Tensor) -> Tensor:
    _check(b.type is I32, "get_rows: the row ids must be i32")
    return _node(ctx, "GET_ROWS", F32, (a.ne[0], b.ne[0], b.ne[1], b.ne[2]), (a, b))


def rms_norm(ctx, a: Tensor, eps: float) -> Tensor:
    return _node(ctx, "RMS_NORM", F32, a.ne, (a,), {"eps": float(eps)})


def norm(ctx, a: Tensor, eps: float) -> Tensor:
    return _node(ctx, "NORM", F32, a.ne, (a,), {"eps": float(eps)})


def rope_ext(ctx, a: Tensor, pos: Tensor, freq_factors: Tensor | None, n_dims: int, mode: int,
             n_ctx_orig: int = 0, freq_base: float = 10000.0, freq_scale: float = 1.0,
             ext_factor: float = 0.0, attn_factor: float = 1.0, beta_fast: float = 32.0,
             beta_slow: float = 1.0) -> Tensor:
    _check(pos.type is I32 and pos.ne[0] == a.ne[2], f"rope: need one i32 position per token ({pos.ne[0]} vs {a.ne[2]})")
    _check(n_dims <= a.ne[0] and n_dims % 2 == 0, f"rope: n_dims={n_dims} does not fit rows of {a.ne[0]}")
    params = dict(n_dims=n_dims, mode=mode, n_ctx_orig=n_ctx_orig, freq_base=float(freq_base),
                  freq_scale=float(freq_scale), ext_factor=float(ext_factor), attn_factor=float(attn_factor),
                  beta_fast=float(beta_fast), beta_slow=float(beta_slow))
    return _node(ctx, "ROPE", F32, a.ne, (a, pos, freq_factors), params)


def soft_max_ext(ctx, a: Tensor, mask: Tensor | None, scale: float = 1.0, max_bias: float = 0.0) -> Tensor:
    if mask is not None:
        _check(mask.ne[0] == a.ne[0] and mask.ne[1] >= a.ne[1],
               f"soft_max_ext: mask {mask.shape_str()} does not cover {a.shape_str()}")
    _check(max_bias == 0.0, "soft_max_ext: ALiBi (max_bias != 0) is not implemented")
    return _node(ctx, "SOFT_MAX", F32, a.ne, (a, mask), {"scale": float(scale), "max_bias": float(max_bias)})


def soft_max(ctx, a: Tensor) -> Tensor:
    return soft_max_ext(ctx, a, None, 1.0, 0.0)


def silu(ctx, a: Tensor) -> Tensor:
    return _node(ctx, "SILU", F32, a.ne, (a,))


def gelu(ctx, a: Tensor) -> Tensor:
    """GELU, tanh form (ggml_gelu)."""
    return _node(ctx, "GELU", F32, a.ne, (a,))


def _glu(ctx, op: str, a: Tensor, b: Tensor | None) -> Tensor:
    if b is None:                      # fused input: gate in the first half of each row, up in the second
        _check(a.ne[0] % 2 == 0, f"{op.lower()}: row length must be even")
        ne = (a.ne[0] // 2,) + a.ne[1:]
        return _node(ctx, op, F32, ne, (a,), {"swapped": False})
    _check(a.ne == b.ne, f"{op.lower()}: gate {a.shape_str()} and up {b.shape_str()} differ")
    return _node(ctx, op, F32, a.ne, (a, b), {"swapped": False})


def swiglu(ctx, a: Tensor) -> Tensor:
    return _glu(ctx, "SWIGLU", a, None)


def swiglu_split(ctx, a: Tensor, b: Tensor) -> Tensor:
    """silu(a) * b (ggml_swiglu_split: a is the gate)."""
    return _glu(ctx, "SWIGLU", a, b)


def geglu(ctx, a: Tensor) -> Tensor:
    return _glu(ctx, "GEGLU", a, None)


def geglu_split(ctx, a: Tensor, b: Tensor) -> Tensor:
    """gelu(a) * b (ggml_geglu_split)."""
    return _glu(ctx, "GEGLU", a, b)


def glu(ctx, a: Tensor, b: Tensor | None, kind: str) -> Tensor:
    return _glu(ctx, kind.upper(), a, b)


# ---- views: new ne/nb over the same bytes
def _view(ctx, op: str, a: Tensor, ne, nb, offs: int, name: str, params=None) -> Tensor:
    t = Tensor(a.type, ne, nb=nb, op=op, src=(a,), op_params=params, name=name,
               view_src=a, view_offs=offs)
    return ctx.new(t)


def view_1d(ctx, a: Tensor, ne0: int, offset: int) -> Tensor:
    return view_4d(ctx, a, ne0, 1, 1, 1, 0, 0, 0, offset)


def view_2d(ctx, a: Tensor, ne0: int, ne1: int, nb1: int, offset: int) -> Tensor:
    return view_4d(ctx, a, ne0, ne1, 1, 1, nb1, nb1 * ne1, nb1 * ne1, offset)


def view_3d(ctx, a: Tensor, ne0: int, ne1: int, ne2: int, nb1: int, nb2: int, offset: int) -> Tensor:
    return view_4d(ctx, a, ne0, ne1, ne2, 1, nb1, nb2, nb2 * ne2, offset)


def view_4d(ctx, a: Tensor, ne0, ne1, ne2, ne3, nb1, nb2, nb3, offset: int) -> Tensor:
    ne = (ne0, ne1, ne2, ne3)
    if ne1 == 1 and ne2 == 1 and ne3 == 1 and nb1 == 0:   # 1d view: contiguous strides
        nb = row_strides(a.type, ne)
    else:
        nb = (a.nb[0], nb1, nb2, nb3)
    t = Tensor(a.type, ne, nb=nb, op="VIEW", src=(a,), op_params={"offset": offset},
               name=f"{a.name} (view)", view_src=a, view_offs=offset)   # offsets of views of views add up
    need = t.view_offs + t.nbytes()
    root = t.view_src
    _check(need <= root.nbytes(), f"view of {a.name or '?'} out of bounds ({need} > {root.nbytes()} bytes)")
    return ctx.new(t)


def reshape(ctx, a: Tensor, *ne: int) -> Tensor:
    _check(a.is_contiguous(), f"reshape: {a.name or '?'} is not contiguous (ggml_reshape needs cont first)")
    ne = tuple(ne) + (1,) * (4 - len(ne))
    _check(ne[0] * ne[1] * ne[2] * ne[3] == a.nelements(),
           f"reshape: {a.shape_str()} has {a.nelements()} elements, {list(ne)} has {ne[0]*ne[1]*ne[2]*ne[3]}")
    return _view(ctx, "RESHAPE", a, ne, row_strides(a.type, ne), 0, f"{a.name} (reshaped)")


def reshape_1d(ctx, a, ne0):
    return reshape(ctx, a, ne0)


def reshape_2d(ctx, a, ne0, ne1):
    return reshape(ctx, a, ne0, ne1)


def reshape_3d(ctx, a, ne0, ne1, ne2):
    return reshape(ctx, a, ne0, ne1, ne2)


def reshape_4d(ctx, a, ne0, ne1, ne2, ne3):
    return reshape(ctx, a, ne0, ne1, ne2, ne3)


def permute(ctx, a: Tensor, ax0: int, ax1: int, ax2: int, ax3: int) -> Tensor:
    """Source dimension i becomes dimension ax_i of the result (ggml_permute)."""
    axes = (ax0, ax1, ax2, ax3)
    _check(sorted(axes) == [0, 1, 2, 3], f"permute: {axes} is not a permutation of 0..3")
    ne, nb = [0] * 4, [0] * 4
    for i, ax in enumerate(axes):
        ne[ax], nb[ax] = a.ne[i], a.nb[i]
    return _view(ctx, "PERMUTE", a, ne, nb, 0, f"{a.name} (permuted)", {"axes": axes})


def transpose(ctx, a: Tensor) -> Tensor:
    ne = (a.ne[1], a.ne[0], a.ne[2], a.ne[3])
    nb = (a.nb[1], a.nb[0], a.nb[2], a.nb[3])
    return _view(ctx, "TRANSPOSE", a, ne, nb, 0, f"{a.name} (transposed)")


def cont(ctx, a: Tensor) -> Tensor:
    return _node(ctx, "CONT", a.type, a.ne, (a,), name=f"{a.name} (cont)")


def cont_2d(ctx, a: Tensor, ne0: int, ne1: int) -> Tensor:
    return cont_4d(ctx, a, ne0, ne1, 1, 1)


def cont_4d(ctx, a: Tensor, ne0, ne1, ne2, ne3) -> Tensor:
    _check(ne0 * ne1 * ne2 * ne3 == a.nelements(), "cont: element count changes")
    return _node(ctx, "CONT", a.type, (ne0, ne1, ne2, ne3), (a,), name=f"{a.name} (cont)")


def cpy(ctx, a: Tensor, b: Tensor) -> Tensor:
    """Copy a into b, converting the type; the result is a view of b (ggml_cpy)."""
    _check(a.nelements() == b.nelements(), f"cpy: {a.shape_str()} and {b.shape_str()} differ in size")
    t = Tensor(b.type, b.ne, nb=b.nb, op="CPY", src=(a, b), name=f"{b.name} (copy of {a.name})",
               view_src=b, view_offs=0)
    return ctx.new(t)


def set_rows(ctx, a: Tensor, b: Tensor, c: Tensor) -> Tensor:
    """Write the rows of b into the rows of a listed in c (converting the type); the result is a view of a
    (ggml_set_rows: how the KV cache is written)."""
    _check(a.ne[0] == b.ne[0], f"set_rows: rows of {a.shape_str()} and {b.shape_str()} differ in length")
    _check(c.type is I32 and c.ne[0] == b.ne[1], f"set_rows: need one i32 row index per row of {b.shape_str()}")
    t = Tensor(a.type, a.ne, nb=a.nb, op="SET_ROWS", src=(b, c), name=f"{a.name} (view)", view_src=a, view_offs=0)
    return ctx.new(t)


def cast(ctx, a: Tensor, type) -> Tensor:
    return _node(ctx, "CPY", type, a.ne, (a,), name=f"{a.name} (copy)")


# ---- attention
def flash_attn_ext(ctx, q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, scale: float,
                   max_bias: float = 0.0, logit_softcap: float = 0.0) -> Tensor:
    """softmax(scale * q k^T + mask) v, tiled; result [Dv, n_head, n_tokens] (already permuted)."""
    _check(q.ne[0] == k.ne[0], "flash_attn_ext: q and k head sizes differ")
    _check(k.ne[1] == v.ne[1], "flash_attn_ext: k and v lengths differ")
    _check(q.ne[2] % k.ne[2] == 0, "flash_attn_ext: query heads are not a multiple of kv heads")
    _check(max_bias == 0.0 and logit_softcap == 0.0, "flash_attn_ext: ALiBi and softcap are not implemented")
    return _node(ctx, "FLASH_ATTN_EXT", F32, (v.ne[0], q.ne[2], q.ne[1], q.ne[3]), (q, k, v, mask),
                 {"scale": float(scale), "max_bias": max_bias, "logit_softcap": logit_softcap})


# ---- mixture of experts and the other ops MoE/MLA graphs need (ggml_mul_mat_id, ggml_argsort, ...)
def mul_mat_id(ctx, as_: Tensor, b: Tensor, ids: Tensor) -> Tensor:
    """One matrix per expert: as_ [K, M, n_expert], b [K, n_b1, n_tokens], ids [n_used, n_tokens] (i32)
    -> [M, n_used, n_tokens]; output (j, t) is expert ids[j, t]'s matrix times row j % n_b1 of token t."""
    _check(ids.type is I32, "mul_mat_id: the expert ids must be i32")
    _check(as_.ne[3] == 1 and b.ne[3] == 1, "mul_mat_id: the experts and the activations must be 3-D")
    _check(ids.ne[2] == 1 and ids.ne[3] == 1 and ids.ne[1] == b.ne[2],
           f"mul_mat_id: ids {ids.shape_str()} need one expert list per token of {b.shape_str()}")
    _check(as_.ne[0] == b.ne[0], f"mul_mat_id: inner dimensions differ ({as_.ne[0]} vs {b.ne[0]})")
    _check(ids.ne[0] % b.ne[1] == 0, f"mul_mat_id: {b.shape_str()} cannot be broadcast over {ids.ne[0]} experts")
    return _node(ctx, "MUL_MAT_ID", F32, (as_.ne[1], ids.ne[0], b.ne[2], 1), (as_, b, ids))


GGML_SORT_ORDER_ASC, GGML_SORT_ORDER_DESC = 0, 1


def argsort(ctx, a: Tensor, order: int = GGML_SORT_ORDER_ASC) -> Tensor:
    """The indices that sort each row (i32, same shape as a)."""
    return _node(ctx, "ARGSORT", I32, a.ne, (a,), {"order": int(order)})


def argsort_top_k(ctx, a: Tensor, k: int) -> Tensor:
    """ggml_argsort_top_k: a descending ARGSORT, then a view of its first k columns."""
    _check(a.ne[0] >= k, f"argsort_top_k: k={k} exceeds the row length {a.ne[0]}")
    r = argsort(ctx, a, GGML_SORT_ORDER_DESC)
    return view_4d(ctx, r, k, r.ne[1], r.ne[2], r.ne[3], r.nb[1], r.nb[2], r.nb[3], 0)


def sigmoid(ctx, a: Tensor) -> Tensor:
    return _node(ctx, "SIGMOID", F32, a.ne, (a,))


def sum_rows(ctx, a: Tensor) -> Tensor:
    return _node(ctx, "SUM_ROWS", F32, (1,) + a.ne[1:], (a,))


def clamp(ctx, a: Tensor, lo: float, hi: float) -> Tensor:
    """min(max(x, lo), hi), element by element (ggml_clamp)."""
    return _node(ctx, "CLAMP", F32, a.ne, (a,), {"min": float(lo), "max": float(hi)})


def div(ctx, a: Tensor, b: Tensor) -> Tensor:
    _check(can_repeat(b, a), f"div: {b.shape_str()} cannot be broadcast to {a.shape_str()}")
    return _node(ctx, "DIV", F32, a.ne, (a, b))


def concat(ctx, a: Tensor, b: Tensor, dim: int) -> Tensor:
    _check(0 <= dim < 4 and a.type is b.type, "concat: same types, dim in 0..3")
    _check(all(a.ne[d] == b.ne[d] for d in range(4) if d != dim), f"concat: {a.shape_str()} and {b.shape_str()} differ")
    ne = tuple(a.ne[d] + b.ne[d] if d == dim else a.ne[d] for d in range(4))
    return _node(ctx, "CONCAT", a.type, ne, (a, b), {"dim": int(dim)})


# the ops that compute nothing (ggml_op_is_empty): a leaf (NONE) and the views over other tensors' bytes
VIEW_OPS = frozenset({"NONE", "VIEW", "RESHAPE", "PERMUTE", "TRANSPOSE"})
