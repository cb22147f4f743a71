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

Numbers follow the llama.cpp that llama-cpp-python 0.3.36 vendors (late 2025), NVIDIA GPUs only.
"""
from __future__ import annotations

from dataclasses import dataclass

from .vecdotq import cuda_type

MMVQ_MAX_BATCH_SIZE = 8
WARP_SIZE = 32
K_QUANTS = ("q2_K", "q3_K", "q4_K", "q5_K", "q6_K")


@dataclass(frozen=True)
class Arch:
    """A GPU as the dispatcher sees it: its compute capability, MMVQ parameter table and half-math support."""
    name: str
    cc: int
    table: str            # mmvq_parameter_table_id: generic, turing or gb10
    fast_fp16: bool       # FAST_FP16_AVAILABLE: sm_60+ except sm_61
    thresholds: tuple = ()  # (types, max ncols_dst) pairs of ggml_cuda_should_use_mmvq
    example: str = ""


ARCHS: dict[str, Arch] = {a.name: a for a in [
    Arch("generic", 800, "generic", True, (), "Ampere (A100, RTX 30), Hopper (H100) and any GPU without a table"),
    Arch("pascal", 610, "generic", False, (), "GTX 10x0: dp4a, but no fast half math"),
    Arch("volta", 700, "generic", True, ((("q2_K",), 4), (("q3_K",), 6), (("q4_K",), 5), (("q5_K",), 6), (("q6_K",), 7)), "V100"),
    Arch("turing", 750, "turing", True, (), "RTX 20, T4"),
    Arch("orin", 870, "generic", True, ((K_QUANTS, 1),), "Jetson Orin"),
    Arch("ada", 890, "generic", True, ((("q2_K",), 4), (("q3_K",), 6)), "RTX 40 (tuned on an RTX 4090)"),
    Arch("blackwell", 1200, "generic", True, ((("q2_K", "q3_K", "q4_K"), 5), (("q5_K",), 6), (("q6_K",), 7)),
         "RTX 50 (tuned on an RTX 5090)"),
    Arch("gb10", 1210, "gb10", True, ((("q2_K",), 6),), "DGX Spark"),
]}
ARCHS["hopper"] = ARCHS["ampere"] = ARCHS["generic"]


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
