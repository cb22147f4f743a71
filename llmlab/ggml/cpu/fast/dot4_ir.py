"""LLVM IR builders of the byte-dot kernels (``dot4``): numba has no vector types, so the inner steps of
``dot4_legacy`` and ``dot4_kquants`` are written as LLVM IR in ``@intrinsic`` codegens from these pieces:
vector loads and stores, a broadcast, the f16 widening (vcvtph2ps) and :func:`dot4`, 16 int32 lanes of
4 byte products each (``llvm.x86.avx512.vpdpbusd.512``, or ``llvm.x86.avx2.pmadd.ub.sw`` then
``pmadd.wd`` by ones)."""
from __future__ import annotations

from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic

I8, I16, I32 = ir.IntType(8), ir.IntType(16), ir.IntType(32)
I8x64 = ir.VectorType(I8, 64)
I32x16 = ir.VectorType(I32, 16)
F32x16 = ir.VectorType(ir.FloatType(), 16)


def data(context, builder, arrty, arr, elem):
    """The data pointer of a contiguous array, as a pointer to ``elem``."""
    return builder.bitcast(context.make_array(arrty)(context, builder, arr).data, elem.as_pointer())


def at(context, builder, arrty, arr, indices, elem):
    """The address of ``arr[indices...]`` (leading indices, each an (LLVM value, numba type) pair; the
    rest of the axes from 0), as a pointer to ``elem``: a kernel passes an array and indices rather than
    a view made per block, whose reference count numba updates with an atomic instruction per view (on
    a shared array, a cache line the threads pass back and forth)."""
    ary = context.make_array(arrty)(context, builder, arr)
    strides = cgutils.unpack_tuple(builder, ary.strides, arrty.ndim)
    intp = context.get_value_type(types.intp)
    p = builder.ptrtoint(ary.data, intp)
    for (v, ty), st in zip(indices, strides):
        p = builder.add(p, builder.mul(context.cast(builder, v, ty, types.intp), st))
    return builder.inttoptr(p, elem.as_pointer())


def vload(builder, ptr, index, vec):
    p = builder.gep(ptr, [index])
    return builder.load(builder.bitcast(p, vec.as_pointer()), align=1)


def vstore(builder, ptr, index, value):
    p = builder.gep(ptr, [index])
    builder.store(value, builder.bitcast(p, value.type.as_pointer()), align=1)


def splat(builder, x, vec):
    v = builder.insert_element(ir.Constant(vec, None), x, ir.Constant(I32, 0))
    return builder.shuffle_vector(v, ir.Constant(vec, None), ir.Constant(I32x16, [0] * vec.count))


def intrinsic_fn(builder, name, ret, args):
    return cgutils.get_or_insert_function(builder.module, ir.FunctionType(ret, args), name)


def f16x16(builder, ptr):
    """16 float16 bits at ptr -> <16 x float> (vcvtph2ps)."""
    h = vload(builder, ptr, ir.Constant(I32, 0), ir.VectorType(I16, 16))
    return builder.fpext(builder.bitcast(h, ir.VectorType(ir.HalfType(), 16)), F32x16)


def dot4(builder, isa: str, acc, u8, word, signed: bool = False):
    """acc + the 16 lanes' sums of 4 byte products: u8 (<64 x i8>, unsigned codes; with ``signed`` the
    bytes are signed codes) times the 4 signed bytes of the int32 ``word`` (broadcast). VNNI: one
    vpdpbusd. AVX2: pmaddubsw (pairs, int16) then pmaddwd by ones (quads, int32), per 8 rows; exact
    while a pair cannot saturate int16: unsigned codes up to 63 (2 * 63 * 128 < 2^15), or, for signed
    codes (q8_0), ggml's |w| x sign(a, w) with activations in -127..127, as ggml's quantizers make them."""
    w = splat(builder, word, I32x16)
    if isa == "vnni":
        if signed:
            raise ValueError("vpdpbusd takes unsigned codes")
        fn = intrinsic_fn(builder, "llvm.x86.avx512.vpdpbusd.512", I32x16, [I32x16] * 3)
        return builder.call(fn, [acc, builder.bitcast(u8, I32x16), w])
    sb = builder.bitcast(w, I8x64)
    I8x32, I16x16, I32x8 = ir.VectorType(I8, 32), ir.VectorType(I16, 16), ir.VectorType(I32, 8)
    maddubs = intrinsic_fn(builder, "llvm.x86.avx2.pmadd.ub.sw", I16x16, [I8x32, I8x32])
    maddwd = intrinsic_fn(builder, "llvm.x86.avx2.pmadd.wd", I32x8, [I16x16, I16x16])
    ones = ir.Constant(I16x16, [1] * 16)
    halves = []
    for h in range(2):
        idx = ir.Constant(ir.VectorType(I32, 32), list(range(32 * h, 32 * h + 32)))
        uh = builder.shuffle_vector(u8, ir.Constant(I8x64, None), idx)
        sh = builder.shuffle_vector(sb, ir.Constant(I8x64, None), idx)
        if signed:                  # ggml's _mm256_sign_epi8(a, w) and |w| (vpsignb, vpabsb; -128 -> 128 unsigned)
            sh = builder.call(intrinsic_fn(builder, "llvm.x86.avx2.psign.b", I8x32, [I8x32, I8x32]), [sh, uh])
            uh = builder.call(intrinsic_fn(builder, "llvm.abs.v32i8", I8x32, [I8x32, ir.IntType(1)]),
                              [uh, ir.Constant(ir.IntType(1), 0)])
        halves.append(builder.call(maddwd, [builder.call(maddubs, [uh, sh]), ones]))
    both = builder.shuffle_vector(halves[0], halves[1], ir.Constant(I32x16, list(range(16))))
    return builder.add(acc, both)


def dot4_scaled(builder, isa: str, acc, u8, word, scale):
    """acc + per row (lane) ``scale`` x the lane's 4-product sum of :func:`dot4` (unsigned codes up to 63),
    ``scale`` <16 x i16> (one value per row, |scale| < 128). AVX2: pmaddubsw (pairs, int16) then
    pmaddwd by the scale, twice per row (ggml's q6_K step, ``_mm256_madd_epi16(scale, p16)``): the
    scaled sum costs what the plain one does. VNNI: vpdpbusd, then times the scale widened to int32.
    Exact in int32 (|sum| <= 4 * 63 * 128 * 127)."""
    if isa == "vnni":
        return builder.add(acc, builder.mul(dot4(builder, isa, ir.Constant(I32x16, [0] * 16), u8, word),
                                            builder.sext(scale, I32x16)))
    sb = builder.bitcast(splat(builder, word, I32x16), I8x64)
    I8x32, I16x16, I32x8 = ir.VectorType(I8, 32), ir.VectorType(I16, 16), ir.VectorType(I32, 8)
    maddubs = intrinsic_fn(builder, "llvm.x86.avx2.pmadd.ub.sw", I16x16, [I8x32, I8x32])
    maddwd = intrinsic_fn(builder, "llvm.x86.avx2.pmadd.wd", I32x8, [I16x16, I16x16])
    halves = []
    for h in range(2):
        idx = ir.Constant(ir.VectorType(I32, 32), list(range(32 * h, 32 * h + 32)))
        uh = builder.shuffle_vector(u8, ir.Constant(I8x64, None), idx)
        sh = builder.shuffle_vector(sb, ir.Constant(I8x64, None), idx)
        pair = ir.Constant(ir.VectorType(I32, 16), [8 * h + i // 2 for i in range(16)])   # row r's scale, twice
        sc = builder.shuffle_vector(scale, ir.Constant(scale.type, None), pair)
        halves.append(builder.call(maddwd, [builder.call(maddubs, [uh, sh]), sc]))
    both = builder.shuffle_vector(halves[0], halves[1], ir.Constant(I32x16, list(range(16))))
    return builder.add(acc, both)


def c32(v: int):
    return ir.Constant(I32x16, [v] * 16)


def high_bits(builder, qh, shift: int):
    """q5_0's fifth bits: from each row's 32-bit qh, bits shift .. shift+3 spread to bit 4 of the lane's
    4 bytes (t * 0x00204081 puts bit k of a 4-bit t at bit 8k, with no carries)."""
    t = builder.and_(builder.lshr(qh, c32(shift)), c32(15))
    spread = builder.and_(builder.mul(t, c32(0x00204081)), c32(0x01010101))
    return builder.bitcast(builder.shl(spread, c32(4)), I8x64)


def block_words(context, builder, signature, args, w0_at: int = 2):
    """The operands every byte-dot intrinsic starts from: the weight block's bytes (argument 0, as i8*),
    the activation words (argument 1, as i32*) and ``word(p, j)``, the int32 j past the first word's index
    (argument ``w0_at``) in p (the words, or an array beside them such as their code sums)."""
    t = signature.args
    bp = data(context, builder, t[0], args[0], I8)
    ap = data(context, builder, t[1], args[1], I32)
    w0 = context.cast(builder, args[w0_at], t[w0_at], types.intp)
    return bp, ap, lambda p, j: builder.load(builder.gep(p, [builder.add(w0, ir.Constant(w0.type, j))]))


def block_words_at(context, builder, signature, args):
    """:func:`block_words` for intrinsics called as (qs, g, b, aq4, t, w0, out): the block qs[g, b] and the
    words aq4[t] addressed from their indices (no array views per block), and ``word(p, j)``."""
    t = signature.args
    bp = at(context, builder, t[0], args[0], [(args[1], t[1]), (args[2], t[2])], I8)
    ap = at(context, builder, t[3], args[3], [(args[4], t[4])], I32)
    w0 = context.cast(builder, args[5], t[5], types.intp)
    return bp, ap, lambda p, j: builder.load(builder.gep(p, [builder.add(w0, ir.Constant(w0.type, j))]))


def block_codes(builder, bp, nibbles: bool, signed: bool = False) -> list:
    """A legacy block's codes for 16 rows, one <64 x i8> per lane j (4 codes per row): from 4 chunks of
    nibbles (q4 types: the low nibbles are lanes 0-3, the high ones lanes 4-7) or 8 chunks of bytes (q5_0's
    expanded codes, q8_0's; ``signed``: q8_0's stored w + 128 back to w)."""
    if nibbles:
        raw = [vload(builder, bp, ir.Constant(I32, 64 * j), I8x64) for j in range(4)]
        return ([builder.and_(v, ir.Constant(I8x64, [15] * 64)) for v in raw]
                + [builder.lshr(v, ir.Constant(I8x64, [4] * 64)) for v in raw])
    codes = [vload(builder, bp, ir.Constant(I32, 64 * j), I8x64) for j in range(8)]
    return [builder.xor(c, ir.Constant(I8x64, [0x80] * 64)) for c in codes] if signed else codes


@intrinsic
def fetch_add(typingctx, counter, v):
    """counter[0] += v as one atomic instruction (``lock xadd``), returning the value before: the tasks of
    a parallel region take their next chunk of rows from a shared counter, as ggml's threads do
    (``ggml_threadpool_chunk_add``)."""
    def codegen(context, builder, signature, args):
        p = data(context, builder, signature.args[0], args[0], ir.IntType(64))
        val = context.cast(builder, args[1], signature.args[1], types.int64)
        return builder.atomic_rmw("add", p, val, "monotonic")
    return types.int64(counter, v), codegen
