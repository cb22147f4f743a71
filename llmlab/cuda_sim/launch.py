"""Which kernel, and in what shape: the host side of ggml-cuda's mmvq.cu.

``should_use_mmvq`` decides whether a quantized matrix product with ``ncols_dst`` activation columns
goes to MMVQ at all (else MMQ or cuBLAS): up to 8 columns, fewer for the K-quants on some GPUs,
because MMVQ decodes the weights again for every column. Then the launch shape:

* ``nwarps``: how many warps of one CUDA block share the K loop of a row (a parameter table per GPU family);
* ``rows_per_block``: 1 for one column, 2 for 2..8 columns (the q8_1 loads are shared between the rows),
  or ``nwarps`` when K is so short that part of the block has nothing to do (``small_k``): the busy
  threads then do ``nwarps`` rows each and the grid shrinks by that factor;
* ``blocks_per_iter = vdr * nwarps * warp_size / qi``: weight blocks the CUDA block eats per trip of the K loop;
* grid ``(ceil(nrows / rows_per_block), 1, 1)``, block ``(warp_size, nwarps, 1)``.

Numbers follow the llama.cpp that llama-cpp-python 0.3.36 vendors, NVIDIA GPUs only.
"""
from __future__ import annotations

from dataclasses import dataclass

from .vecdotq import cuda_type

MMVQ_MAX_BATCH_SIZE = 8
MMQ_DP4A_MAX_BATCH_SIZE = 64     # mmq.cuh: with FP16 tensor cores, dp4a MMQ only below 64 columns
MMF_ROWS_PER_BLOCK = 32          # mmf.cuh (NVIDIA)
WARP_SIZE = 32
K_QUANTS = ("q2_K", "q3_K", "q4_K", "q5_K", "q6_K")
FLOAT_TYPES = ("f32", "f16", "bf16")
MMQ_TYPES = ("q4_0", "q4_1", "q5_0", "q5_1", "q8_0") + K_QUANTS


@dataclass(frozen=True)
class Arch:
    """A GPU as the dispatcher sees it: its compute capability, MMVQ parameter table and half-math support."""
    name: str
    cc: int
    table: str            # mmvq_parameter_table_id: generic, turing or gb10
    fast_fp16: bool       # FAST_FP16_AVAILABLE: sm_60 and newer, except sm_61
    thresholds: tuple = ()  # (types, max ncols_dst) pairs of ggml_cuda_should_use_mmvq
    example: str = ""

    @property
    def dp4a(self) -> bool:
        """``__dp4a`` exists from compute capability 6.1 (GGML_CUDA_CC_DP4A); below it ggml_cuda_dp4a multiplies four bytes one by one."""
        return self.cc >= CC_DP4A


CC_PASCAL, CC_DP4A, CC_VOLTA, CC_TURING, CC_AMPERE, CC_ADA = 600, 610, 700, 750, 800, 890

ARCHS: dict[str, Arch] = {a.name: a for a in [
    Arch("generic", 800, "generic", True, (), "Ampere (A100, RTX 30) and any GPU without a table of its own"),
    Arch("sm_60", 600, "generic", True, (), "Tesla P100: Pascal with fast half math, but no dp4a"),
    Arch("sm_61", 610, "generic", False, (), "GTX 10x0, Tesla P40/P4: Pascal with dp4a, but no fast half math"),
    Arch("volta", 700, "generic", True, ((("q2_K",), 4), (("q3_K",), 6), (("q4_K",), 5), (("q5_K",), 6), (("q6_K",), 7)), "V100"),
    Arch("turing", 750, "turing", True, (), "RTX 20, T4"),
    Arch("orin", 870, "generic", True, ((K_QUANTS, 1),), "Jetson Orin"),
    Arch("ada", 890, "generic", True, ((("q2_K",), 4), (("q3_K",), 6)), "RTX 40 (tuned on an RTX 4090)"),
    Arch("hopper", 900, "generic", True, (), "H100, H200"),
    Arch("blackwell", 1200, "generic", True, ((("q2_K", "q3_K", "q4_K"), 5), (("q5_K",), 6), (("q6_K",), 7)),
         "RTX 50 (tuned on an RTX 5090)"),
    Arch("gb10", 1210, "gb10", True, ((("q2_K",), 6),), "DGX Spark"),
]}
ARCHS["ampere"] = ARCHS["generic"]


def arch_of(arch) -> Arch:
    if isinstance(arch, Arch):
        return arch
    if arch not in ARCHS:
        raise ValueError(f"unknown arch {arch!r} (known: {', '.join(ARCHS)})")
    return ARCHS[arch]


def should_use_mmvq(type_name, ncols_dst: int, arch="generic") -> bool:
    """``ggml_cuda_should_use_mmvq``: quantized weights and at most the arch's column limit for that type."""
    t = cuda_type(type_name).name
    limit = next((n for types, n in arch_of(arch).thresholds if t in types), MMVQ_MAX_BATCH_SIZE)
    return ncols_dst <= limit


def calc_nwarps(type_name, ncols_dst: int, arch="generic", halve_iters: bool = False) -> int:
    """Warps per CUDA block: 4 for 1-4 columns, 2 for 5-8 (Turing: 2 for the K-quants' single column;
    GB10: doubled when ``halve_iters``)."""
    a, t = arch_of(arch), cuda_type(type_name).name
    generic = 4 if ncols_dst <= 4 else 2 if ncols_dst <= MMVQ_MAX_BATCH_SIZE else 1
    if a.table == "turing" and ncols_dst == 1:
        return 2 if t in K_QUANTS else 4
    if a.table == "gb10" and ncols_dst == 1 and halve_iters and t in ("q4_0", "q4_1", "q5_0", "q5_1", "q8_0", "q4_K", "q5_K", "q6_K"):
        return 2 * generic
    return generic


def calc_rows_per_block(ncols_dst: int, small_k: bool = False, nwarps: int = 1) -> int:
    """Output rows per CUDA block: 1 for one column (``nwarps`` if small_k), 2 for 2..8 columns."""
    if ncols_dst == 1:
        return nwarps if small_k else 1
    return 2 if ncols_dst <= MMVQ_MAX_BATCH_SIZE else 1


def blocks_per_iter(type_name, nwarps: int, warp_size: int = WARP_SIZE) -> int:
    """Weight blocks one CUDA block covers per trip of the K loop: vdr * nwarps * warp_size / qi."""
    t = cuda_type(type_name)
    return t.vdr * nwarps * warp_size // t.qi


def small_k(type_name, ncols: int, ncols_dst: int = 1, arch="generic") -> bool:
    """``should_use_small_k``: one column, and fewer blocks per row than ``nwarps`` warps take in one trip,
    so some threads never get a block; then each CUDA block does ``nwarps`` rows, giving its busy threads more work."""
    t, a = cuda_type(type_name), arch_of(arch)
    nwarps = calc_nwarps(t.name, ncols_dst, a)
    use = ncols_dst == 1 and nwarps > 1 and ncols // t.qk < nwarps * blocks_per_iter(t.name, 1)
    if a.cc < 700 and t.name in ("q2_K", "q3_K"):          # slow on Pascal and older
        use = False
    return use


def halve_iters(type_name, ncols: int, arch="generic") -> bool:
    """GB10 only: double nwarps for one column when that halves the K-loop trips without a long idle tail."""
    t, a = cuda_type(type_name), arch_of(arch)
    if a.table != "gb10" or calc_nwarps(t.name, 1, a, True) == calc_nwarps(t.name, 1, a, False):
        return False
    bpr, bpi = ncols // t.qk, calc_nwarps(t.name, 1, a) * blocks_per_iter(t.name, 1)
    iters, iters_wide = -(-bpr // bpi), -(-bpr // (2 * bpi))
    return (iters_wide * 2 - iters) * 8 <= iters_wide * 2


def launch_params(type_name, nrows: int, ncols: int, ncols_dst: int = 1, arch="generic") -> dict:
    """Everything about one MMVQ launch for a ``nrows x ncols`` weight matrix and ``ncols_dst`` columns."""
    t, a = cuda_type(type_name), arch_of(arch)
    if ncols % t.qk:
        raise ValueError(f"{t.name}: K = {ncols} is not a multiple of the block size {t.qk}")
    if not 1 <= ncols_dst <= MMVQ_MAX_BATCH_SIZE:
        raise ValueError(f"MMVQ takes 1..{MMVQ_MAX_BATCH_SIZE} columns, not {ncols_dst} (llama.cpp uses MMQ or cuBLAS)")
    sk = small_k(t.name, ncols, ncols_dst, a)
    hi = ncols_dst == 1 and not sk and halve_iters(t.name, ncols, a)
    nwarps = calc_nwarps(t.name, ncols_dst, a, hi)
    rows = calc_rows_per_block(ncols_dst, sk, nwarps)
    bpr, bpi = ncols // t.qk, blocks_per_iter(t.name, nwarps)
    iters = -(-bpr // bpi)
    nblocks = -(-nrows // rows)
    threads_per_block = WARP_SIZE * nwarps
    busy = min(threads_per_block, bpr * t.threads_per_block)
    return dict(type=t.name, nrows=nrows, ncols=ncols, ncols_dst=ncols_dst, arch=a.name,
                qk=t.qk, qi=t.qi, vdr=t.vdr, blocks_per_row=bpr, threads_per_weight_block=t.threads_per_block,
                nwarps=nwarps, rows_per_block=rows, small_k=sk, halve_iters=hi,
                blocks_per_iter=bpi, iters=iters,
                grid=(nblocks, 1, 1), block=(WARP_SIZE, nwarps, 1),
                threads=nblocks * threads_per_block, idle_threads_per_block=threads_per_block - busy,
                weights_per_call=t.weights_per_call,
                weights_per_thread=iters * rows * t.weights_per_call,
                shared_floats=max(nwarps - 1, 1) * ncols_dst * rows * WARP_SIZE,
                use_mmvq=should_use_mmvq(t.name, ncols_dst, a))


# ---------------------------------------------------------------- MUL_MAT_ID (mixture of experts)

# get_mmvq_mmid_max_batch_pascal_older / _turing_plus: most tokens per expert product that still go to MMVQ
MMID_MAX_BATCH = {
    "pascal_older": {"iq1_s": 6, "iq1_m": 6, "iq2_s": 4, "iq2_xs": 5, "iq2_xxs": 5, "iq3_s": 4, "iq3_xxs": 4,
                     "iq4_nl": 6, "iq4_xs": 5, "mxfp4": 4, "nvfp4": 4, "q2_K": 4, "q3_K": 4, "q4_0": 6, "q4_1": 6,
                     "q4_K": 5, "q5_0": 6, "q5_1": 6, "q5_K": 5, "q6_K": 4, "q8_0": 4},
    "turing_plus": {"iq2_s": 7, "iq3_s": 6, "iq3_xxs": 7, "mxfp4": 7, "nvfp4": 8, "q2_K": 7, "q3_K": 5},
}


def mmid_table(arch="generic") -> str | None:
    """Which MUL_MAT_ID table a GPU uses: none (always 8) on Volta and on Ada and newer."""
    cc = arch_of(arch).cc
    if cc == CC_VOLTA or cc >= CC_ADA:
        return None
    return "turing_plus" if cc >= CC_TURING else "pascal_older"


def mmid_max_batch(type_name: str, arch="generic") -> int:
    """``get_mmvq_mmid_max_batch``: up to how many tokens an expert product (MUL_MAT_ID) stays on MMVQ."""
    table = mmid_table(arch)
    name = cuda_type(type_name).name
    return MMVQ_MAX_BATCH_SIZE if table is None else MMID_MAX_BATCH[table].get(name, MMVQ_MAX_BATCH_SIZE)


def moe_launch_params(type_name, nrows: int, ncols: int, ntokens: int, n_expert_used: int, arch="generic") -> dict:
    """One MUL_MAT_ID on MMVQ: ``ntokens`` tokens, each routed to ``n_expert_used`` experts of ``nrows x ncols``.

    One token: the ordinary kernel, with ``blockIdx.y`` walking the expert slots (``channel_x = ids[slot]``).
    Several tokens: ``mul_mat_vec_q_moe``, one warp per token, 2 rows per CUDA block, no shared memory.
    """
    t, a = cuda_type(type_name), arch_of(arch)
    limit = mmid_max_batch(t.name, a)
    if not 1 <= ntokens <= limit:
        raise ValueError(f"{t.name} on {a.name}: MMVQ takes 1..{limit} tokens per expert product, not {ntokens}")
    if ntokens == 1:
        p = launch_params(t.name, nrows, ncols, 1, a)
        p.update(kernel="mul_mat_vec_q", grid=(p["grid"][0], n_expert_used, 1),
                 threads=p["threads"] * n_expert_used)
    else:
        rows, bpr = 2, ncols // t.qk
        bpi = t.vdr * WARP_SIZE // t.qi
        nblocks = -(-nrows // rows)
        p = dict(type=t.name, nrows=nrows, ncols=ncols, ncols_dst=ntokens, arch=a.name, kernel="mul_mat_vec_q_moe",
                 nwarps=ntokens, rows_per_block=rows, blocks_per_row=bpr, blocks_per_iter=bpi, iters=-(-bpr // bpi),
                 grid=(nblocks, n_expert_used, 1), block=(WARP_SIZE, ntokens, 1),
                 threads=nblocks * n_expert_used * WARP_SIZE * ntokens, shared_floats=0)
    p.update(mmid_max_batch=limit, n_expert_used=n_expert_used,
             weight_decodes=ntokens * n_expert_used * nrows * ncols)   # every token's warp decodes its expert's rows
    return p


# ---------------------------------------------------------------- __launch_bounds__


def launch_bounds(type_name, ncols_dst: int = 1, arch="generic", small_k: bool = False, halve_iters: bool = False,
                  moe: bool = False, regs_per_sm: int = 65536, max_regs: int = 255) -> dict:
    """``__launch_bounds__(max_threads, 1)`` of the kernel, and the register budget that allows per thread.

    The bound promises the compiler at most ``max_threads`` threads per block, and asks that one block fit
    on an SM: registers per thread are then capped at ``regs_per_sm / max_threads`` (and at 255). A launch
    with more threads than promised fails, which is why small_k and halve_iters are template flags: the
    bound is computed from the same ``calc_nwarps`` as the launch.
    """
    t, a = cuda_type(type_name), arch_of(arch)
    warps = mmid_max_batch(t.name, a) if moe else calc_nwarps(t.name, ncols_dst, a, halve_iters)
    threads = warps * WARP_SIZE
    return dict(type=t.name, ncols_dst=ncols_dst, max_threads=threads, min_blocks=1,
                regs_per_thread=min(max_regs, regs_per_sm // threads),
                small_k=small_k, halve_iters=halve_iters)


# ---------------------------------------------------------------- ggml_cuda_mul_mat: which kernel


def should_use_mmq(type_name, ncols_dst: int, arch="generic", n_experts: int = 0) -> bool:
    """``ggml_cuda_should_use_mmq`` on NVIDIA (a GPU with at least 48 KiB of shared memory per block)."""
    a = arch_of(arch)
    if cuda_type(type_name).name not in MMQ_TYPES:
        return False
    if a.cc >= CC_TURING:                               # turing_mma_available: int8 tensor cores
        return True
    if not a.dp4a:                                      # "for MoE, mmq is faster even without native dp4a"
        return a.cc >= CC_PASCAL and n_experts > 0
    return a.cc < CC_VOLTA or ncols_dst < MMQ_DP4A_MAX_BATCH_SIZE   # fp16 tensor cores: cuBLAS from 64 columns


def should_use_mmvf(type_name, ncols_dst: int, arch="generic", nrows: int = 4096, nmat: int = 1) -> bool:
    """``ggml_cuda_should_use_mmvf`` on NVIDIA for contiguous F32/F16 weights: the float matrix x vector kernel."""
    a, t = arch_of(arch), type_name.lower()
    if t == "f32":
        return ncols_dst <= (3 if a.cc >= CC_AMPERE else 4 if a.cc >= CC_TURING else 3)
    if t in ("f16", "bf16"):
        small = nrows <= 512 or nmat == 1
        if a.cc >= CC_AMPERE:
            return small and ncols_dst == 1
        if a.cc >= CC_VOLTA and t == "f16":
            return small and ncols_dst <= 3
        return ncols_dst <= 8
    return False


def should_use_mmf(type_name, ncols_dst: int, arch="generic", nrows: int = 4096) -> bool:
    """``ggml_cuda_should_use_mmf`` on NVIDIA for contiguous float weights (MUL_MAT): tensor-core tiles, up to 16 columns."""
    a, t = arch_of(arch), type_name.lower()
    if t not in ("f32", "f16", "bf16") or nrows % MMF_ROWS_PER_BLOCK or ncols_dst > 16:
        return False
    return {"f32": a.cc >= CC_AMPERE, "f16": a.cc >= CC_VOLTA, "bf16": a.cc >= CC_AMPERE}[t]


# the order of ggml_cuda_mul_mat: the first kernel whose test passes runs the product
MUL_MAT_CHAIN = (
    ("MMVF", lambda t, n, a, rows: should_use_mmvf(t, n, a, rows)),
    ("MMF", lambda t, n, a, rows: should_use_mmf(t, n, a, rows)),
    ("MMVQ", lambda t, n, a, rows: t.lower() not in FLOAT_TYPES and should_use_mmvq(t, n, a)),
    ("MMQ", lambda t, n, a, rows: t.lower() not in FLOAT_TYPES and should_use_mmq(t, n, a)),
    ("cuBLAS", lambda t, n, a, rows: True),
)


def mul_mat_kernel(type_name, ncols_dst: int, arch="generic", nrows: int = 4096) -> str:
    """Which kernel ``ggml_cuda_mul_mat`` picks for weights of ``type_name`` and ``ncols_dst`` activation columns
    (contiguous tensors, F32 activations, a weight buffer that needs no padding clear)."""
    return next(name for name, test in MUL_MAT_CHAIN if test(type_name, ncols_dst, arch, nrows))
