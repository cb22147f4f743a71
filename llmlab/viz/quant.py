"""Pictures and tables for notebook 05 (quantization block formats). Every function takes its data
as parameters; nothing here knows about notebooks."""
from __future__ import annotations


import numpy as np

from ..ggml import quant as Q
from ..ggml.cpu.quants import TYPE_TRAITS_CPU
from ..ggml.types import TYPES, ggml_type
from .html import HTML, table

FIELD_COLORS = ["#f4a261", "#e9c46a", "#2a9d8f", "#8ab17d", "#e76f51", "#a8dadc", "#b5838d", "#6d6875"]


# ---------------------------------------------------------------- the type table

def type_traits_table(names: list[str] | None = None) -> HTML:
    """ggml's type_traits[] as llmlab has it: id, name, block, bytes, bpw, converters, CPU partner."""
    rows = []
    for t in TYPES.values():
        if names is not None and t.name not in names:
            continue
        cpu = TYPE_TRAITS_CPU.get(t.name)
        rows.append([t.id, t.name + (" (removed)" if t.removed else ""), t.block_size, t.type_size,
                     f"{t.bits_per_weight:.4g}" if t.type_size else "-",
                     "yes" if t.to_float else "-", "yes" if t.from_float else "-", cpu.vec_dot_type if cpu else "-"])
    return table(["id", "type_name", "blck_size", "type_size", "bpw", "to_float", "from_float_ref", "vec_dot_type"], rows)


def layout_table(qtype) -> HTML:
    """The fields of one block: name, numpy type, byte range (the C struct, field by field)."""
    t = ggml_type(qtype)
    rows = []
    for name in t.layout.names or ():
        dt, off = t.layout.fields[name]
        rows.append([name, str(dt.base) + (str(dt.shape) if dt.shape else ""), f"{off}..{off + dt.itemsize - 1}", dt.itemsize])
    rows.append(["total", "", "", t.layout.itemsize])
    return table(["field", "dtype", "bytes", "size"], rows)


# ---------------------------------------------------------------- one real row, cut into blocks

def plot_block_idea(row: np.ndarray, block_size: int = 32, n_blocks: int = 8, ax=None):
    """A stretch of a weight row with block boundaries, each block's max |x| (what its scale stores)."""
    import matplotlib.pyplot as plt
    ax = ax or plt.subplots(figsize=(10, 3.4))[1]
    x = np.asarray(row[: block_size * n_blocks], np.float32)
    ax.plot(np.arange(x.size), x, ".", ms=4, color="#264653")
    for b in range(n_blocks):
        seg = x[b * block_size:(b + 1) * block_size]
        amax = float(np.abs(seg).max())
        ax.axvspan(b * block_size - 0.5, (b + 1) * block_size - 0.5, color=FIELD_COLORS[b % 2 + 4], alpha=0.12)
        ax.hlines([amax, -amax], b * block_size, (b + 1) * block_size - 1, colors="#e76f51", lw=1.5)
    ax.set_xlabel("index in the row")
    ax.set_ylabel("weight")
    ax.set_title(f"{n_blocks} blocks of {block_size}: each gets its own scale (red: ±max|x| of the block)")
    return ax


# ---------------------------------------------------------------- bytes and bits of a block

def draw_block_bytes(qtype, raw: np.ndarray | None = None, per_row: int = 24, ax=None):
    """The bytes of one block as cells coloured by field (the struct laid out in memory), with hex
    values; a legend names each field and its first byte."""
    import matplotlib.pyplot as plt
    t = ggml_type(qtype)
    n = t.type_size
    rows = -(-n // per_row)
    cols = min(per_row, n)
    ax = ax or plt.subplots(figsize=(cols * 0.4 + 0.4, rows * 0.36 + 1.3))[1]
    handles = []
    for k, name in enumerate(t.layout.names or ("value",)):
        dt, off = t.layout.fields[name] if t.layout.names else (t.layout, 0)
        color = FIELD_COLORS[k % len(FIELD_COLORS)]
        for i in range(off, off + dt.itemsize):
            r, c = divmod(i, per_row)
            ax.add_patch(plt.Rectangle((c, -r), 0.95, 0.9, color=color, alpha=0.85))
            if raw is not None:
                ax.text(c + 0.47, -r + 0.45, f"{int(raw[i]):02x}", ha="center", va="center", fontsize=10,
                        family="monospace")
        handles.append(plt.Rectangle((0, 0), 1, 1, color=color, alpha=0.85, label=f"{name} [{off}..{off + dt.itemsize - 1}]"))
    ax.set_xlim(-0.1, cols + 0.05)
    ax.set_ylim(-rows + 0.9, 1.0)
    ax.axis("off")
    ax.legend(handles=handles, loc="lower left", bbox_to_anchor=(0, 1.0), ncol=min(len(handles), 4), frameon=False,
              fontsize=10, handlelength=1.2, borderaxespad=0.2)
    ax.set_title(f"block_{t.name}: {n} bytes for {t.block_size} weights = {t.bits_per_weight:.4g} bits per weight",
                 pad=28, fontsize=12)
    return ax


def bit_map(qtype, seed: int = 0) -> np.ndarray:
    """Which weight each bit of a block feeds, found by experiment: flip one bit at a time in a
    block with tame scales, dequantize, and see which outputs change. Returns (type_size, 8) ints:
    the weight index, -1 when the bit moves many weights (a scale bit), -2 when it moves none."""
    t = ggml_type(qtype)
    rng = np.random.default_rng(seed)
    base = Q.quantize(rng.standard_normal(t.block_size).astype(np.float32), t)
    y0 = Q.dequantize(base, t)
    out = np.full((t.type_size, 8), -2, np.int32)
    for byte in range(t.type_size):
        for bit in range(8):
            b = base.copy()
            b[byte] ^= np.uint8(1 << bit)
            changed = np.nonzero(Q.dequantize(b, t).view(np.uint32) != y0.view(np.uint32))[0]
            if changed.size == 1:
                out[byte, bit] = changed[0]
            elif changed.size > 1:
                out[byte, bit] = -1
    return out


def draw_bit_map(qtype, bmap: np.ndarray | None = None, start: int = 0, count: int | None = None, ax=None):
    """Bits of a block (rows: bytes, columns: bit 7..0) coloured by the weight they hold, the weight's
    index written in each cell; grey = scale bits."""
    import matplotlib.pyplot as plt
    from matplotlib.colors import ListedColormap
    t = ggml_type(qtype)
    bmap = bit_map(qtype) if bmap is None else bmap
    count = count or t.type_size - start
    m = bmap[start:start + count, ::-1].astype(float)           # bit 7 on the left, like a byte is written
    ax = ax or plt.subplots(figsize=(3.4, 0.26 * count + 1))[1]
    weights = np.where(m >= 0, m, np.nan)
    ax.imshow(np.where(m == -1, 1, np.nan), cmap=ListedColormap(["#999999"]), aspect="auto", vmin=0, vmax=1)
    ax.imshow(weights, cmap="viridis", aspect="auto", vmin=0, vmax=t.block_size - 1)
    for (i, j), v in np.ndenumerate(m):
        if v >= 0:
            ax.text(j, i, int(v), ha="center", va="center", fontsize=10, color="white" if v < t.block_size * 0.6 else "black")
    ax.set_xticks(range(8), [str(7 - k) for k in range(8)])
    ax.set_yticks(range(count), [str(start + i) for i in range(count)])
    ax.tick_params(length=2, pad=2)
    ax.set_xlabel("bit")
    ax.set_ylabel("byte")
    ax.set_title(t.name)
    return ax


def plot_bit_maps(maps: list[tuple], title: str = "which weight each bit belongs to (grey: scale bits)",
                  width: float = 10.0):
    """Several :func:`draw_bit_map` panels side by side, sized for a projector: ``maps`` holds
    (qtype, start, count) per panel."""
    import matplotlib.pyplot as plt
    count = max(c for _, _, c in maps)
    fig, axes = plt.subplots(1, len(maps), figsize=(width, 0.27 * count + 1.5))
    for ax, (qtype, start, cnt) in zip(np.atleast_1d(axes), maps):
        draw_bit_map(qtype, start=start, count=cnt, ax=ax)
    fig.suptitle(title)
    fig.tight_layout()
    return fig


# ---------------------------------------------------------------- q4_k's 12 packed scale bytes

def k4_scale_steps(scales: np.ndarray) -> list[list]:
    """get_scale_min_k4 for j = 0..7, spelled out: where the 6 bits come from and what they are."""
    q = [int(v) for v in scales]
    rows = []
    for j in range(8):
        if j < 4:
            sc, m = q[j] & 63, q[j + 4] & 63
            how_s, how_m = f"q[{j}] & 63", f"q[{j + 4}] & 63"
        else:
            sc = (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4)
            m = (q[j + 4] >> 4) | ((q[j] >> 6) << 4)
            how_s, how_m = f"(q[{j + 4}] & 15) | (q[{j - 4}] >> 6) << 4", f"(q[{j + 4}] >> 4) | (q[{j}] >> 6) << 4"
        rows.append([j, how_s, f"{sc:06b}", sc, how_m, f"{m:06b}", m])
    return rows


def k4_scale_table(scales: np.ndarray) -> HTML:
    return table(["j", "scale from", "bits", "scale", "min from", "bits", "min"], k4_scale_steps(scales))


def draw_k4_scales(scales: np.ndarray | None = None, ax=None):
    """The 12 bytes of q4_k/q5_k scales, each bit labelled with the 6-bit field it belongs to (s3.5 =
    bit 5 of sub-block 3's scale, m6.1 = bit 1 of sub-block 6's min)."""
    import matplotlib.pyplot as plt
    label = [[""] * 8 for _ in range(12)]
    owner = np.zeros((12, 8))
    for j in range(8):
        for kind, base in (("s", 0), ("m", 4)):
            for bit in range(6):
                if j < 4:
                    byte, pos = j + base, bit
                elif bit < 4:
                    byte, pos = j + 4, bit + (0 if kind == "s" else 4)
                else:
                    byte, pos = (j - 4 if kind == "s" else j), 6 + bit - 4
                label[byte][pos] = f"{kind}{j}.{bit}"
                owner[byte, pos] = j + (0 if kind == "s" else 8)
    ax = ax or plt.subplots(figsize=(8.5, 7))[1]
    ax.imshow(owner[:, ::-1], cmap="tab20", aspect="auto", vmin=0, vmax=19)
    for i in range(12):
        for p in range(8):
            txt = label[i][p] + ("" if scales is None else f" = {(int(scales[i]) >> p) & 1}")
            ax.text(7 - p, i, txt, ha="center", va="center", fontsize=10)
    ax.set_xticks(range(8), [str(7 - k) for k in range(8)])
    ax.set_yticks(range(12), [f"scales[{i}]" for i in range(12)])
    ax.set_xlabel("bit")
    ax.set_title("q4_k scales: 8 six-bit scales (s) and 8 six-bit mins (m) in 12 bytes")
    return ax


# ---------------------------------------------------------------- errors

def plot_reconstruction(row: np.ndarray, qtype, n: int = 128, ax=None):
    """Original vs dequantize(quantize(row)) and the error, for the first n values."""
    import matplotlib.pyplot as plt
    t = ggml_type(qtype)
    x = np.asarray(row, np.float32)
    x = x[: x.size // t.block_size * t.block_size]
    y = Q.dequantize(Q.quantize(x, t), t)
    axes = ax if ax is not None else plt.subplots(2, 1, figsize=(10, 4.8), sharex=True, height_ratios=[2, 1])[1]
    k = min(n, x.size)
    axes[0].plot(x[:k], ".-", lw=0.6, ms=3, label="original", color="#264653")
    axes[0].plot(y[:k], ".", ms=4, label=f"{t.name} reconstructed", color="#e76f51")
    axes[0].legend(loc="upper right")
    rel = float(np.sqrt(np.mean((x.astype(np.float64) - y) ** 2) / np.mean(x.astype(np.float64) ** 2)))
    axes[0].set_title(f"{t.name}: {t.bits_per_weight:.4g} bpw, relative RMS error {rel:.4f} (over the whole row)")
    axes[1].bar(np.arange(k), (y - x)[:k], color="#2a9d8f", width=1.0)
    for b in range(0, k, t.block_size):
        axes[1].axvline(b - 0.5, color="#999", lw=0.5)
    axes[1].set_ylabel("error")
    axes[1].set_xlabel("index (grey lines: block boundaries)")
    return axes


def error_vs_bpw(x: np.ndarray, names: list[str]) -> list[tuple[str, float, float]]:
    """(type, bits per weight, relative RMS error) of quantizing x to each type."""
    from ..ggml.quant.checklist import rms_error
    out = []
    for n in names:
        t = ggml_type(n)
        m = x.size // t.block_size * t.block_size
        out.append((t.name, t.bits_per_weight, rms_error(x[:m], t)))
    return out


def plot_error_vs_bpw(rows: list[tuple[str, float, float]], wide_from: float = 9.0):
    """Relative RMS error against bits per weight, one labelled point per type. The axis is broken
    before ``wide_from`` bits (f16, bf16, f32 on a narrow panel of their own), so the 4-5 bit types
    that crowd together get the room their labels need."""
    import matplotlib.pyplot as plt
    from .layout import place_labels
    wide = [r for r in rows if r[1] >= wide_from]
    fig, axes = plt.subplots(1, 2 if wide else 1, figsize=(10, 6), squeeze=False,
                             width_ratios=[6, 1] if wide else None)
    axes = axes[0]
    colors = {"K": "#e76f51", "legacy": "#264653", "other": "#2a9d8f"}
    for ax, part in zip(axes, ([r for r in rows if r[1] < wide_from], wide)):
        for name, bpw, err in part:
            fam = "K" if name.endswith("_k") else "legacy" if name.startswith("q") else "other"
            ax.scatter(bpw, err, color=colors[fam], zorder=3)
        ax.set_yscale("log")
        ax.grid(alpha=0.3)
    axes[0].set_xlabel("bits per weight")
    axes[0].set_ylabel("relative RMS error")
    if wide:                                   # its own error scale too: f16's error is far below the rest
        lo, hi = min(r[1] for r in wide), max(r[1] for r in wide)
        axes[1].set_xlim(lo - 1, hi + 1)
        axes[1].set_xticks(sorted({r[1] for r in wide}))
        axes[1].yaxis.tick_right()
        axes[1].yaxis.set_minor_formatter(plt.NullFormatter())
    fig.suptitle("error versus size (red: K-quants, dark: legacy, green: others)")
    fig.tight_layout()
    for ax, part in zip(axes, ([r for r in rows if r[1] < wide_from], wide)):
        place_labels(ax, [r[1] for r in part], [r[2] for r in part], [r[0] for r in part], fontsize=10)
    return fig
