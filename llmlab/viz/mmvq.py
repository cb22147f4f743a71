"""Pictures and tables for notebook 07 (the MMVQ decode kernel). Every function takes its data as parameters."""
from __future__ import annotations

import time

import numpy as np

from .. import cuda_sim as cs
from .html import HTML, table

LINE = 128     # bytes of one L2 cache line / coalesced transaction


# ---------------------------------------------------------------- roofline


def measure_cpu(seconds: float = 0.3) -> tuple[float, float]:
    """(FLOP/s of a float32 matmul, bytes/s of a large array copy) on this machine: rough peak and bandwidth."""
    a = np.random.default_rng(0).standard_normal((768, 768)).astype(np.float32)
    big = np.ones(32 << 20, np.uint8)
    out = big.copy()                                  # touched once, so the timing sees no page faults

    def best(fn, work):
        rate, t_end = 0.0, time.perf_counter() + seconds
        while time.perf_counter() < t_end:
            t0 = time.perf_counter()
            fn()
            rate = max(rate, work / (time.perf_counter() - t0))
        return rate
    return best(lambda: a @ a, 2 * 768**3), best(lambda: np.copyto(out, big), 2 * big.nbytes)


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


def dispatch_table(archs=("generic", "volta", "ada", "blackwell", "gb10", "orin")) -> HTML:
    """Largest ncols_dst that still goes to MMVQ, per arch and type (``ggml_cuda_should_use_mmvq``)."""
    names = list(cs.CUDA_TYPES)
    rows = [[a] + [max(n for n in range(1, 9) if cs.should_use_mmvq(t, n, a) or n == 1) for t in names] for a in archs]
    return table(["arch"] + [cs.CUDA_TYPES[t].name for t in names], rows)


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
