"""Pictures and tables for notebook 07 (the MMVQ decode kernel). Every function takes its data as parameters."""
from __future__ import annotations

import numpy as np

from .. import cuda_sim as cs
from .html import HTML, table

LINE = 128     # bytes of one L2 cache line / coalesced transaction


# ---------------------------------------------------------------- roofline


def plot_roofline(machines: dict[str, tuple[float, float]], kernels: dict[str, float], ax=None):
    """Attainable FLOP/s = min(peak, intensity x bandwidth) per machine, log-log, with each kernel's intensity."""
    import matplotlib.pyplot as plt
    if ax is None:
        _, ax = plt.subplots(figsize=(7, 3.8))
    ai = np.logspace(-1, 3.3, 200)
    for (name, (peak, bw)), color in zip(machines.items(), ["#2a9d8f", "#e76f51", "#6d6875", "#e9c46a"]):
        ax.loglog(ai, np.minimum(peak, ai * bw), color=color, label=f"{name}: ridge {peak / bw:.0f} FLOP/B")
        ax.plot([peak / bw], [peak], "o", color=color)
    for k, (name, x) in enumerate(kernels.items()):
        ax.axvline(x, color="k", ls="--", lw=1)
        ax.text(x * 1.08, ax.get_ylim()[0] * 10 ** (1 + 1.5 * k), f"{name}: {x:.2f} FLOP/B", fontsize=8)
    ax.set_xlabel("arithmetic intensity (FLOP per byte of weights)")
    ax.set_ylabel("attainable FLOP/s")
    ax.legend(fontsize=8, loc="upper left")
    ax.set_title("roofline: a kernel left of a ridge point is bandwidth bound there", fontsize=10)
    return ax.figure


# ---------------------------------------------------------------- which lane reads which bytes


def lane_byte_map(launch: cs.Launch, block: int = 0, warp: int = 0, trip: int = 0, memory: str = "weights",
                  nbytes: int | None = None) -> np.ndarray:
    """(32, nbytes) array: 0 where a lane did not read the byte, else the load width (1, 2 or 4) it used."""
    reads = [launch.thread_reads(block, warp, lane) for lane in range(32)]
    top = max(a + n for r in reads for it, m, a, n in r if m == memory and it == trip)
    out = np.zeros((32, nbytes or top), np.uint8)
    for lane, r in enumerate(reads):
        for it, m, a, n in r:
            if m == memory and it == trip and a + n <= out.shape[1]:
                out[lane, a:a + n] = np.maximum(out[lane, a:a + n], n)
    return out


def plot_lane_bytes(bmap: np.ndarray, block_bytes: int, fields: dict[str, tuple[int, int]], ax=None, title: str = ""):
    """Draw a lane x byte map: weight blocks and their fields along x, 128-byte lines as dashed rules."""
    import matplotlib.pyplot as plt
    from matplotlib.colors import ListedColormap
    if ax is None:
        _, ax = plt.subplots(figsize=(10, 4))
    ax.imshow(bmap, aspect="auto", interpolation="nearest", cmap=ListedColormap(["#f7f7f7", "#e9c46a", "#e76f51", "#264653"]),
              vmin=0, vmax=4, extent=(0, bmap.shape[1], 31.5, -0.5))
    for x in range(0, bmap.shape[1] + 1, LINE):
        ax.axvline(x, color="k", ls="--", lw=0.8)
    for b in range(0, bmap.shape[1], block_bytes):
        for name, (lo, hi) in fields.items():
            ax.text(b + (lo + hi) / 2, -0.7, name, ha="center", va="bottom", fontsize=7)
        ax.axvline(b, color="#2a9d8f", lw=2)
    ax.set_xlabel("byte address in the weight matrix (dashed: 128-byte lines; teal: block starts)")
    ax.set_ylabel("lane")
    ax.set_title(title or "one warp, one trip: loads of 1 byte (yellow), 2 bytes (red), 4 bytes (dark)", fontsize=10, pad=14)
    return ax.figure


def lines_touched(bmap: np.ndarray, lanes) -> list[int]:
    """The 128-byte lines that the given lanes' loads fall in."""
    cols = np.nonzero(bmap[list(lanes)].any(0))[0]
    return sorted(set((cols // LINE).tolist()))


# ---------------------------------------------------------------- tables


def nwarps_table(type_name: str = "q4_K", archs=("generic", "turing")) -> HTML:
    """nwarps and rows_per_block per ncols_dst, per parameter table (long K, so no small_k)."""
    rows = []
    for arch in archs:
        for n in range(1, 9):
            p = cs.launch_params(type_name, 4096, 4096, n, arch)
            rows.append([arch, n, p["nwarps"], p["rows_per_block"], p["blocks_per_iter"], p["block"], p["grid"]])
    return table(["arch", "ncols_dst", "nwarps", "rows_per_block", "blocks_per_iter", "block", "grid (4096 rows)"], rows)


def types_table(ncols: int = 4096) -> HTML:
    """qk, qi, vdr and what they imply, per weight type, for a one-column launch."""
    rows = []
    for t in cs.CUDA_TYPES.values():
        p = cs.launch_params(t.name, 4096, ncols)
        rows.append([t.name, t.qk, t.bs, t.qi, t.vdr, t.threads_per_block, t.weights_per_call, p["blocks_per_iter"],
                     "yes" if t.vec_dot else "-"])
    return table(["type", "qk", "bytes", "qi", "vdr", "threads per block (qi/vdr)", "weights per call",
                  "blocks_per_iter (4 warps)", "vec_dot here"], rows)


def arch_label(arch: str) -> str:
    """An arch's name with its compute capability, as ggml-cuda compares it: "blackwell" is ggml's
    ``GGML_CUDA_CC_BLACKWELL`` = 1200, the RTX 50 cards, not the B200 (cc 1000, no table of its own)."""
    a = cs.launch.arch_of(arch)
    gpus = {"generic": "A100, RTX 30; B200 too", "blackwell": "RTX 50", "hopper": "H100, H200", "ada": "RTX 40",
            "volta": "V100", "turing": "RTX 20, T4", "gb10": "DGX Spark", "orin": "Jetson Orin"}.get(a.name)
    return f"{arch} ({gpus}, cc {a.cc})" if gpus else f"{arch} (cc {a.cc})"


def dispatch_table(archs=("generic", "volta", "ada", "blackwell", "gb10", "orin")) -> HTML:
    """Largest ncols_dst that still goes to MMVQ, per arch and type (``ggml_cuda_should_use_mmvq``)."""
    names = list(cs.CUDA_TYPES)
    rows = [[arch_label(a)] + [max(n for n in range(1, 9) if cs.should_use_mmvq(t, n, a) or n == 1) for t in names]
            for a in archs]
    return table(["arch (GPUs, compute capability)"] + [cs.CUDA_TYPES[t].name for t in names], rows)


# ---------------------------------------------------------------- reduction


def plot_reduction(launch: cs.Launch, block: int = 0, column: int = 0, row: int = 0):
    """Registers of every (warp, lane) after the K loop, warp 0 after the shared-memory adds, and each butterfly step."""
    import matplotlib.pyplot as plt
    reg = launch.partial[block, column, row]                   # (nwarps, 32)
    steps = [("registers, warp 0 + shared", launch.warp0[block, column, row])] + \
            [(f"after xor {o}", v[block, column, row]) for o, v in launch.shuffle]
    fig, axes = plt.subplots(1 + len(steps), 1, figsize=(9, 1.0 + 0.55 * (reg.shape[0] + len(steps))),
                             gridspec_kw={"height_ratios": [reg.shape[0]] + [1] * len(steps)})
    lim = np.abs(reg).max()
    axes[0].imshow(reg, aspect="auto", cmap="coolwarm", vmin=-lim, vmax=lim)
    axes[0].set_ylabel("warp")
    axes[0].set_title(f"block {block}: partial sums in registers (rows: warps; columns: lanes); sum = {steps[-1][1][0]:.4f}",
                      fontsize=9)
    for ax, (name, v) in zip(axes[1:], steps):
        m = np.abs(v).max()                                     # each step on its own colour scale
        ax.imshow(v[None], aspect="auto", cmap="coolwarm", vmin=-m, vmax=m)
        ax.set_yticks([0], [name], fontsize=7)
    for ax in axes:
        ax.set_xticks([])
    fig.tight_layout()
    return fig


# ---------------------------------------------------------------- a CUDA primer


def plot_cuda_hierarchy(nwarps: int = 4, nblocks: int = 6, lanes_shown: int = 32):
    """Grid -> CUDA blocks -> warps -> lanes, with each block's shared memory and the global memory all share,
    labelled with the names MMVQ gives them (blockIdx.x = row, threadIdx.y = warp, threadIdx.x = lane)."""
    import matplotlib.pyplot as plt
    from matplotlib.patches import FancyBboxPatch, Rectangle
    fig, ax = plt.subplots(figsize=(11, 5.2))
    ax.set_xlim(0, 121)
    ax.set_ylim(-12, 52)
    ax.axis("off")
    # the grid: a row of CUDA blocks
    for b in range(nblocks):
        x = 2 + b * 9
        ax.add_patch(Rectangle((x, 40), 8, 8, fc="#2a9d8f" if b == 1 else "#cfe8e4", ec="k"))
        ax.text(x + 4, 44, f"block\n{b}", ha="center", va="center", fontsize=9)
    ax.text(2, 50, "grid: one CUDA block per output row (blockIdx.x); blocks run in any order, on any SM",
            fontsize=10, va="bottom")
    # block 1, enlarged: warps x lanes
    x0, y0, cw, ch = 14, 6, 2.6, 6
    top = y0 + nwarps * ch + 6          # the enlarged block's top edge: room for the lane numbers and a title
    ax.add_patch(FancyBboxPatch((x0 - 1.5, y0 - 1.5), lanes_shown * cw + 3, top - (y0 - 1.5),
                                boxstyle="round,pad=0.3", fc="#f4faf9", ec="#2a9d8f", lw=2))
    ax.plot([11, x0 - 1.5], [40, top], color="#2a9d8f", lw=1)
    ax.plot([19, x0 + lanes_shown * cw + 1.5], [40, top], color="#2a9d8f", lw=1)
    for w in range(nwarps):
        for lane in range(lanes_shown):
            ax.add_patch(Rectangle((x0 + lane * cw, y0 + (nwarps - 1 - w) * ch), cw, ch - 0.8,
                                   fc="#e9c46a" if w == 0 else "#f6e3b4", ec="#8a6d1f", lw=0.4))
        ax.text(x0 - 2.5, y0 + (nwarps - 1 - w) * ch + ch / 2 - 0.4, f"warp {w}", ha="right", va="center", fontsize=9)
    for lane in (0, 15, 31):
        ax.text(x0 + lane * cw + cw / 2, y0 + nwarps * ch + 0.3, str(lane), ha="center", va="bottom", fontsize=8)
    ax.text(x0 + lanes_shown * cw / 2, y0 + nwarps * ch + 3.2,
            f"CUDA block = {nwarps} warps x 32 lanes = {32 * nwarps} threads (threadIdx.y = warp, threadIdx.x = lane)",
            ha="center", va="bottom", fontsize=9.5)
    # shared memory of the block, global memory of the GPU
    ax.add_patch(Rectangle((x0, y0 - 7), lanes_shown * cw, 4.2, fc="#e76f51", ec="k", alpha=0.85))
    ax.text(x0 + lanes_shown * cw / 2, y0 - 4.9, "shared memory: on the SM, visible to this block only, fast;\n"
            "MMVQ uses it once, to add the warps' partial sums", ha="center", va="center", fontsize=9, color="w")
    ax.add_patch(Rectangle((2, -11), 114, 6, fc="#264653", ec="k"))
    ax.text(59, -8, "global memory (HBM or GDDR), shared by all blocks: weights, activations, outputs.\n"
            "It moves 32-byte sectors of 128-byte lines: a warp's loads are cheap when its lanes read neighbouring bytes",
            ha="center", va="center", fontsize=9, color="w")
    ax.text(x0 + lanes_shown * cw + 3.5, y0 + 12, "a warp runs\none instruction\nfor its 32 lanes\nat once",
            fontsize=9, va="center")
    fig.tight_layout()
    return fig


def coalescing_patterns(block_bytes: int = 144) -> dict[str, np.ndarray]:
    """Byte addresses that 32 lanes load with one 4-byte instruction, for three access patterns. MMVQ's
    is ``vec_dot_q4_K_q8_1``'s first load (vecdotq.cuh: ``q4 = qs + 16*bq8_offset + 4*((iqs/2)%4)``,
    ``v[0] = q4[0]``) with ``iqs = 2t`` for lane ``t`` of the 16 on a super-block: ``qs`` (16 bytes into
    the block) + ``32*(t/4) + 4*(t%4)``; its second load, ``q4[4]``, is the 16 bytes after each."""
    lanes = np.arange(32)
    t = lanes % 16
    return {"lane i reads word i (adjacent)": 4 * lanes,
            "16 lanes per q4_K block, 2 blocks (MMVQ, first load)":
                (lanes // 16) * block_bytes + 16 + 32 * (t // 4) + 4 * (t % 4),
            f"one {block_bytes}-byte block per lane": lanes * block_bytes}


def coalescing_table(width: int = 4) -> HTML:
    """For each pattern: 128-byte lines and 32-byte sectors one warp-wide load touches, and the share of moved bytes used."""
    rows = []
    for name, addr in coalescing_patterns().items():
        lines = np.unique(np.concatenate([(addr + k) // LINE for k in range(width)]))
        sectors = np.unique(np.concatenate([(addr + k) // 32 for k in range(width)]))
        rows.append([name, len(lines), len(sectors), f"{32 * width / (32 * len(sectors)):.0%}"])
    return table(["pattern", "128-byte lines", "32-byte sectors", "bytes used / bytes moved"], rows)


def plot_coalescing(width: int = 4):
    """Which bytes each lane loads, per pattern: adjacent lanes on adjacent words share a few lines."""
    import matplotlib.pyplot as plt
    pats = coalescing_patterns()
    fig, axes = plt.subplots(len(pats), 1, figsize=(10, 1.5 * len(pats) + 0.6))
    for ax, (name, addr) in zip(axes, pats.items()):
        top = int(addr.max()) + width
        for lane, a in enumerate(addr):
            ax.add_patch(plt.Rectangle((a, lane), width, 1, color="#e76f51"))
        for x in range(0, top + LINE, LINE):
            ax.axvline(x, color="k", ls="--", lw=0.7)
        nl = len(np.unique(np.concatenate([(addr + k) // LINE for k in range(width)])))
        ax.set_xlim(0, max(top, LINE))
        ax.set_ylim(32, 0)
        ax.set_ylabel("lane")
        ax.set_title(f"{name}: {nl} line{'s' if nl > 1 else ''} of 128 bytes", fontsize=10)
    axes[-1].set_xlabel("byte address (dashed: 128-byte lines)")
    fig.tight_layout()
    return fig


# ---------------------------------------------------------------- appendix: dispatch, MoE, bounds, halve_iters

KERNEL_COLORS = {"MMVF": "#8ecae6", "MMF": "#219ebc", "MMVQ": "#e9c46a", "MMQ": "#e76f51", "cuBLAS": "#6d6875"}


def plot_kernel_choice(type_names=("q4_0", "q4_K", "q6_K", "f16"), archs=("sm_61", "volta", "turing", "ampere", "ada",
                                                                          "hopper", "blackwell"),
                       ncols=(1, 2, 3, 4, 5, 6, 7, 8, 9, 16, 32, 63, 64, 512)):
    """One panel per weight type: which kernel ``ggml_cuda_mul_mat`` runs, per GPU and number of activation columns."""
    import matplotlib.pyplot as plt
    from matplotlib.colors import ListedColormap
    from matplotlib.patches import Patch
    names = list(KERNEL_COLORS)
    fig, axes = plt.subplots(len(type_names), 1, figsize=(10, 1.9 * len(type_names) + 0.8), sharex=True)
    for ax, t in zip(np.atleast_1d(axes), type_names):
        grid = np.array([[names.index(cs.mul_mat_kernel(t, n, a)) for n in ncols] for a in archs])
        ax.imshow(grid, cmap=ListedColormap(list(KERNEL_COLORS.values())), vmin=0, vmax=len(names) - 1, aspect="auto")
        ax.set_yticks(range(len(archs)), [a + " (RTX 50)" if a == "blackwell" else a for a in archs], fontsize=8)
        ax.set_title(f"{t} weights", fontsize=10)
    ax.set_xticks(range(len(ncols)), ncols, fontsize=8)
    ax.set_xlabel("activation columns (tokens in the batch)")
    fig.legend(handles=[Patch(color=c, label=k) for k, c in KERNEL_COLORS.items()], loc="upper center", ncol=5, fontsize=9)
    fig.tight_layout(rect=(0, 0, 1, 0.95))
    return fig


def moe_table(type_names=("q4_0", "q4_K", "q6_K", "q2_K", "q3_K"), archs=("sm_61", "volta", "turing", "ampere", "ada")) -> HTML:
    """Most tokens per expert product that stay on MMVQ (``get_mmvq_mmid_max_batch``), with the ordinary MUL_MAT limit beside it."""
    rows = [[a, cs.launch.mmid_table(a) or "(none: 8)"] +
            [f"{cs.launch.mmid_max_batch(t, a)} / {max(n for n in range(1, 9) if cs.should_use_mmvq(t, n, a) or n == 1)}"
             for t in type_names] for a in archs]
    return table(["arch", "MUL_MAT_ID table"] + [f"{t}: experts / dense" for t in type_names], rows)


def launch_bounds_table(cases=(("q4_K", 1, "ampere", False), ("q4_K", 6, "ampere", False), ("q4_K", 1, "gb10", True),
                               ("q4_K", 4, "ampere", "moe"), ("q2_K", 4, "turing", "moe"), ("q2_K", 4, "sm_61", "moe"))) -> HTML:
    """``__launch_bounds__`` of MMVQ kernels and the per-thread register budget it leaves the compiler."""
    rows = []
    for t, n, a, flag in cases:
        moe = flag == "moe"
        b = cs.launch.launch_bounds(t, n, a, halve_iters=flag is True, moe=moe)
        rows.append(["mul_mat_vec_q_moe" if moe else "mul_mat_vec_q" + (" (halve_iters)" if flag is True else ""),
                     t, n, a, b["max_threads"], b["regs_per_thread"]])
    return table(["kernel", "type", "columns", "arch", "max threads per block (the bound)",
                  "register ceiling per thread (65536 / threads, at most 255)"], rows)


def halve_iters_table(type_name: str = "q4_K", ks=(2048, 2304, 3072, 4096, 5120, 8192, 14336)) -> HTML:
    """GB10, one column: K, trips of the K loop with 4 and 8 warps, idle tail, and the choice."""
    rows = []
    for k in ks:
        t = cs.cuda_type(type_name)
        bpr, bpi = k // t.qk, cs.calc_nwarps(t.name, 1, "gb10") * cs.blocks_per_iter(t.name, 1)
        iters, wide = -(-bpr // bpi), -(-bpr // (2 * bpi))
        p = cs.launch_params(type_name, 4096, k, 1, "gb10")
        rows.append([k, bpr, iters, wide, wide * 2 - iters, "small_k" if p["small_k"] else
                     ("yes: 8 warps" if p["halve_iters"] else "no: 4 warps")])
    return table(["K", "blocks per row", "trips, 4 warps", "trips, 8 warps", "idle half-trips", "halve_iters"], rows)
