"""Notebook 03's appendix B, the ARM column: one computation in x86's and ARM's arithmetic, step by step.

Each function runs the library's own kernels (``llmlab.ggml.cpu``) and keeps what a learner wants to
see on the way: the accumulator registers of a quantized dot product, the float16 running sums of
``ggml_vec_dot_f16`` on FP16_VA, the codes of the three q8_0 quantizers. Every final value is checked
against the kernel the engine runs, so a table can never show a result the engine does not compute.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
from numpy import float32, float64

from ..ggml.cpu import profiles, quants as Q
from ..ggml.cpu.simd import reduce_tree
from ..ggml.cpu.vec import soft_max_rows, vec_dot_f16
from ..ggml.quant import legacy as L
from ..ggml.quant.core import nibbles


def hex32(v) -> str:
    """A float32's bits, as a memory dump shows them."""
    return f"0x{np.asarray(v, float32).reshape(()).view(np.uint32):08x}"


# ---------------------------------------------------------------- one q4_1 x q8_1 dot product, two orders

@dataclass
class DotOrder:
    """One profile's way through ``ggml_vec_dot_q4_1_q8_1``: its float32 accumulator registers after the
    last block (name -> lanes), the reduction steps that follow (label, float32 value), the result."""
    profile: str
    registers: dict[str, np.ndarray]
    steps: list[tuple[str, float32]] = field(default_factory=list)
    value: float32 = float32(0)


def _x86_order(w, a, cpu) -> DotOrder:
    """arch/x86/quants.c: 8 lanes, ``acc = fma(d_w d_a, lane, acc)`` block after block, hsum_float_8,
    then the min terms' scalar sum."""
    lanes = Q.LaneSums(nibbles(w["qs"]), a["qs"])
    acc = Q.accumulate(Q._dd(w, a), lanes)                       # (8, 1, 1)
    main = Q.hsum(acc, cpu)
    summs = Q._scalar_fma_sum(w["m"].astype(float32).T[:, None, :], a["s"].astype(float32).T[:, :, None])
    value = (main + summs).astype(float32)
    return DotOrder(cpu.name, {"acc": acc[:, 0, 0]},
                    [("hsum_float_8(acc)", main[0, 0]), ("summs (min terms)", summs[0, 0]),
                     ("result", value[0, 0])], value[0, 0])


def _neon_order(w, a, cpu) -> DotOrder:
    """arch/arm/quants.c: two blocks a step, an even and an odd float32x4 accumulator, vaddvq_f32 of
    each, their sum, then the min terms (summed per pair of blocks)."""
    if w.shape[-1] % 2:
        raise ValueError("the step-by-step NEON view needs an even number of blocks")
    _, _, acc = Q.neon_accumulators(w, a, nibbles(w["qs"]))
    even, odd = (reduce_tree(np.moveaxis(x, 0, -1), cpu.quant_hsum_tree) for x in acc)
    summs = Q._neon_summs(w, a, w.shape[-1])
    both = (even + odd).astype(float32)
    value = (both + summs).astype(float32)
    return DotOrder(cpu.name, {"even blocks": acc[0][:, 0, 0], "odd blocks": acc[1][:, 0, 0]},
                    [("vaddvq_f32(even)", even[0, 0]), ("vaddvq_f32(odd)", odd[0, 0]), ("even + odd", both[0, 0]),
                     ("summs (min terms)", summs[0, 0]), ("result", value[0, 0])], value[0, 0])


_ORDERS = {"x86": (_x86_order, Q.vec_dot_q4_1_q8_1), "neon": (_neon_order, Q.vec_dot_q4_1_q8_1_neon)}


def q4_1_dot_orders(w_row: np.ndarray, x: np.ndarray, cpus=("avx2", "arm_dotprod_fp16"),
                    quantizer: str = "x86") -> dict[str, DotOrder]:
    """One weight row (q4_1 blocks) times one activation row, through each profile's vec_dot. The
    activations are quantized once, by ``quantizer``'s q8_1 (``"x86"`` or ``"neon"``), so the profiles
    see the same integers and only the order of the float steps differs."""
    w = np.asarray(w_row).reshape(1, -1)
    a = Q.ACTIVATION_QUANTIZERS[quantizer]["q8_1"](np.asarray(x, float32).reshape(1, -1)).reshape(1, -1)
    out = {}
    for name in cpus:
        cpu = profiles.get(name)
        order, kernel = _ORDERS[cpu.quant_kernels.split("_")[0]]
        got = order(w, a, cpu)
        engine = kernel(w, a, cpu)[0, 0]
        assert got.value.tobytes() == engine.tobytes(), f"{name}: the step-by-step view left the kernel's order"
        out[name] = got
    return out


def dot_order_rows(orders: dict[str, DotOrder]) -> tuple[list[str], list[list]]:
    """A side-by-side table: every accumulator lane, then the reduction steps, one column per profile."""
    names = list(orders)
    rows: list[list] = []
    for name in names:
        for reg, lanes in orders[name].registers.items():
            for j, v in enumerate(lanes):
                rows.append([f"{name}: {reg}[{j}]"] + ["" if n != name else f"{v:.7g}" for n in names])
    for name in names:
        for label, v in orders[name].steps:
            rows.append([f"{name}: {label}"] + ["" if n != name else f"{v:.9g} ({hex32(v)})" for n in names])
    return ["step"] + names, rows


# ---------------------------------------------------------------- f16 accumulation (FP16_VA) on a real layer

@dataclass
class F16Scores:
    """Attention scores of one layer, each query against the keys in the cache, by ``ggml_vec_dot_f16``
    in two profiles, and one softmax (the first profile's) over both."""
    scores: dict[str, np.ndarray]          # profile -> (n_head, n_q, n_kv) float32
    probs: dict[str, np.ndarray]
    exact: np.ndarray                      # the same products summed in float64

    def max_diff(self, what: str = "scores") -> float:
        a, b = getattr(self, what).values()
        return float(np.abs(a.astype(float64) - b).max())

    def max_error(self, cpu: str) -> float:
        return float(np.abs(self.scores[cpu].astype(float64) - self.exact).max())


def f16_scores(q: np.ndarray, k: np.ndarray, mask: np.ndarray, scale: float,
               cpus=("avx2", "arm_dotprod_fp16")) -> F16Scores:
    """q (n_head, n_q, d), k (n_head_kv, n_kv, d) as the trace recorded them (q is rounded to f16 first,
    as ggml converts src1 to the f16 vec_dot_type); grouped-query heads share their K head."""
    n_head, n_kv = q.shape[0], k.shape[1]
    qh = np.asarray(q, np.float16).astype(float32)
    kh = np.asarray(k, np.float16).astype(float32)[np.arange(n_head) // (n_head // k.shape[0])]
    scores = {cpu: vec_dot_f16(qh[:, :, None, :], kh[:, None, :, :], cpu) for cpu in cpus}
    exact = np.einsum("hqd,hkd->hqk", qh.astype(float64), kh.astype(float64))
    m = np.asarray(mask, float32)[:, :n_kv]
    probs = {cpu: soft_max_rows((s * float32(scale)).astype(float32) + m, cpus[0]) for cpu, s in scores.items()}
    return F16Scores(scores, probs, exact)


def running_f16_sum(x: np.ndarray, y: np.ndarray, cpu: str = "arm_dotprod_fp16") -> np.ndarray:
    """The dot product's running value after each step of ``f16_step`` elements, summing only what has
    been read so far (each prefix through ``vec_dot_f16``): how the float16 sum drifts."""
    step = profiles.get(cpu).f16_step
    x, y = np.asarray(x, float32), np.asarray(y, float32)
    return np.array([vec_dot_f16(x[:n], y[:n], cpu) for n in range(step, len(x) + 1, step)], float32)


# ---------------------------------------------------------------- the three q8_0 quantizers

Q8_0_QUANTIZERS = {
    "reference (1/d, roundf)": L.quantize_q8_0,
    "x86 (127/amax, nearest even)": Q.quantize_row_q8_0,
    "ARM (1/d, vcvtnq: nearest even)": Q.quantize_row_q8_0_neon,
}


def q8_0_codes(x: np.ndarray) -> dict[str, np.ndarray]:
    """The 8-bit codes of ``x`` (rows of a multiple of 32) by each q8_0 quantizer, as (rows, n) int."""
    x = np.asarray(x, float32)
    rows = x.reshape(-1, x.shape[-1])
    return {name: f(rows.reshape(-1, 32))["qs"].astype(np.int32).reshape(rows.shape) for name, f in Q8_0_QUANTIZERS.items()}


def q8_0_scaled(x: np.ndarray) -> dict[str, np.ndarray]:
    """The float32 products each quantizer rounds: x * (127/amax) on x86, x * (1/d) elsewhere."""
    x = np.asarray(x, float32).reshape(-1, 32)
    amax = np.abs(x).max(-1, keepdims=True)
    d = (amax / float32(127)).astype(float32)
    with np.errstate(divide="ignore", invalid="ignore"):
        x86 = (x * np.where(amax != 0, float32(127) / amax, 0).astype(float32)).astype(float32)
        inv = (x * np.where(d != 0, float32(1) / d, 0).astype(float32)).astype(float32)
    return {"127/amax": x86.reshape(-1), "1/d": inv.reshape(-1)}


def quantized_matmul_inputs(model, tokens, cpu=None) -> dict[str, np.ndarray]:
    """Every activation a quantized weight multiplies while ``model`` decodes ``tokens`` (one batch):
    ``{node name prefix: rows (T, n)}`` over all layers, each node once (attn_norm feeds Q, K and V).
    These are the values ggml-cpu quantizes to 8 bits before its integer dot products."""
    from ..ggml.cpu.ops import f32
    from ..llama import Batch, Context
    seen: dict[str, np.ndarray] = {}

    def on_node(t) -> None:
        if t.op == "MUL_MAT" and t.src[0].type.is_quantized and t.src[1].name not in seen:
            seen[t.src[1].name] = f32(t.src[1]).reshape(-1, t.src[1].ne[0]).copy()

    Context(model, n_ctx=max(64, len(tokens)), cpu=cpu).decode(Batch.from_tokens(list(tokens), logits="last"),
                                                                callback=on_node)
    out: dict[str, list] = {}
    for name, rows in seen.items():
        out.setdefault(name.rsplit("-", 1)[0], []).append(rows)
    return {k: np.concatenate(v) for k, v in out.items()}


def q8_0_changes(acts: dict[str, np.ndarray]) -> tuple[list[list], dict[str, list]]:
    """Per kind of activation: how many values there are and how many codes differ between the
    quantizers (x86 vs ARM, reference vs x86, reference vs ARM); and, per kind, the rows of
    :func:`q8_0_difference_rows` for the first row where x86 and ARM differ."""
    rows, examples = [], {}
    for name, X in acts.items():
        c = list(q8_0_codes(X).values())
        n = [int((c[i] != c[j]).sum()) for i, j in ((1, 2), (0, 1), (0, 2))]
        rows.append([name, X.size] + n)
        where = np.flatnonzero((c[1] != c[2]).any(1))
        if len(where):
            examples[name] = q8_0_difference_rows(X[where[0]])
    return rows, examples


Q8_0_CHANGE_HEADERS = ["activation", "values", "codes x86 != ARM", "reference != x86", "reference != ARM"]
Q8_0_DIFF_HEADERS = ["index", "x", "x * (127/amax)", "x * (1/d)"] + list(Q8_0_QUANTIZERS)


def q8_0_difference_rows(x: np.ndarray, limit: int = 6) -> list[list]:
    """Up to ``limit`` values of one row whose codes differ between quantizers: index, value, the two
    scaled products (9 digits: enough to see which side of .5 each lands) and the three codes."""
    x = np.asarray(x, float32).reshape(-1)
    codes = {k: v[0] for k, v in q8_0_codes(x).items()}
    sc = q8_0_scaled(x)
    c = list(codes.values())
    idx = np.flatnonzero((c[0] != c[1]) | (c[1] != c[2]))[:limit]
    return [[int(i), f"{x[i]:.9g}", f"{sc['127/amax'][i]:.9g}", f"{sc['1/d'][i]:.9g}"] + [int(v[i]) for v in c]
            for i in idx]


# ---------------------------------------------------------------- the profiles and their references

def profile_rows(names) -> list[list]:
    """What each profile changes: its build, float lanes, the f16 accumulators, the quantized kernels,
    tinyBLAS, REPACK layouts and notes."""
    rows = []
    for name in names:
        p = profiles.get(name)
        layouts = ", ".join(f"{k}->{v}" for k, v in sorted(p.repack_layouts.items())) or \
            ", ".join(sorted(p.repack_types))
        rows.append([p.name, p.build or p.arch, p.f32_lanes, p.f16_acc, p.quant_kernels,
                     "yes" if p.llamafile else "no", layouts, "; ".join(p.notes)])
    return rows


PROFILE_HEADERS = ["profile", "build", "float lanes", "vec_dot_f16 accumulates in", "quantized kernels",
                   "tinyBLAS", "REPACK", "notes"]


def ref_logit_rows(model: str, cpus, prompt: int = 0) -> list[list]:
    """For every pair of profiles with stored llama.cpp references: how far apart the last-position
    logits of one prompt are, and how long the greedy continuations agree."""
    from .. import data
    R = {cpu: data.ref_logits(model, cpu)[1] for cpu in cpus}
    rows = []
    for i, a in enumerate(cpus):
        for b in cpus[i + 1:]:
            ra, rb = R[a], R[b]
            if not np.array_equal(ra[f"p{prompt}_ids"], rb[f"p{prompt}_ids"]):
                raise ValueError(f"{a} and {b}: prompt {prompt} has different tokens")
            d = np.abs(ra[f"p{prompt}_last_logits"].astype(float64) - rb[f"p{prompt}_last_logits"])
            ga, gb = ra[f"p{prompt}_greedy"], rb[f"p{prompt}_greedy"]
            n = min(len(ga), len(gb))
            agree = next((k for k in range(n) if ga[k] != gb[k]), n)
            rows.append([f"{a} vs {b}", f"{(d > 0).mean():.0%}", f"{d.max():.3g}", f"{agree} / {n}"])
    return rows


REF_LOGIT_HEADERS = ["llama.cpp builds", "last-position logits that differ", "max |diff|", "greedy tokens in common"]


# ---------------------------------------------------------------- figures

def plot_dot_orders(orders: dict[str, DotOrder], ax=None):
    """Each profile's accumulator lanes as bars, one group per register: the same total, split differently."""
    import matplotlib.pyplot as plt
    ax = ax or plt.subplots(figsize=(9, 3))[1]
    pos = 0
    for name, o in orders.items():
        for reg, lanes in o.registers.items():
            xs = np.arange(pos, pos + len(lanes))
            ax.bar(xs, lanes, label=f"{name}: {reg}")
            pos += len(lanes) + 1
    ax.axhline(0, color="0.5", lw=0.8)
    ax.set_xticks([])
    ax.set_ylabel("lane value after the last block")
    ax.legend(fontsize="small", ncol=3)
    return ax


def plot_f16_errors(f: F16Scores, ax=None):
    """Each profile's score error against the float64 sum of the same products, per score, by size."""
    import matplotlib.pyplot as plt
    ax = ax or plt.subplots(figsize=(7, 3.5))[1]
    mag = np.maximum(np.abs(f.exact).reshape(-1), 1e-9)
    for cpu, s in f.scores.items():
        err = np.abs(s.astype(float64) - f.exact).reshape(-1)
        ax.scatter(mag, np.maximum(err, 1e-9), s=4, alpha=0.5, label=f"{cpu} ({profiles.get(cpu).f16_acc} accumulators)")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("|score| (exact)")
    ax.set_ylabel("|error| (1e-9: exact)")
    ax.legend(fontsize="small")
    return ax
