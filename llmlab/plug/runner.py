"""Run generation with learners' functions plugged into the engine, and say where they depart.

``run(model, prompt, n, {slot: fn})`` generates twice on the NumPy reference kernels: once with the
slots plugged, once without (llmlab's own exact path, bit-identical to llama.cpp's: kept per process,
so several checks of one prompt pay for it once). Per slot, the probe has compared every call with
the engine's own piece on the same inputs, so the status follows:

- ``bit-identical``: every call gave the engine's bits;
- ``close``: some call did not, yet the generated tokens are the same;
- ``different``: the tokens differ;
- ``error``: the function raised, ran past its time limit, returned what the engine cannot take
  (shape, dtype, NaN), or the engine itself stopped on what it returned.

The first departing call names the node (its name, op, layer and max |difference|). The graph is
also compared node by node with the unplugged run at the step where the first departure happened,
which gives the first node of the whole run that differs and how the difference grows from layer to
layer (the ``l_out-N`` nodes). The generated tokens are compared with llama.cpp's: its stored
references where the prompt is one of them (greedy), else the live llama.cpp where it is installed
and computes this CPU profile, else llmlab's own exact path, and the report says which.
"""
from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import numpy as np

from .. import LLMLabError
from . import guard, helpers
from .hints import hint as hint_for
from .probe import Probe, SlotStopped, Where
from .registry import Slot, get_slot

STATUSES = ("bit-identical", "close", "different", "error")


@dataclass
class SlotResult:
    slot: str
    source: str
    status: str
    hint: str
    first: Where | None = None
    max_diff: float | None = None
    step: int | None = None
    calls: int = 0
    departures: int = 0
    error: str | None = None

    def to_json(self) -> dict:
        md = self.max_diff
        return {"slot": self.slot, "source": self.source, "status": self.status, "hint": self.hint,
                "first_node": None if self.first is None else {
                    **self.first.to_json(), "max_abs_diff": md if md is None or math.isfinite(md) else "inf",
                    "step": self.step},
                "calls": self.calls, "departures": self.departures, "error": self.error}

    def line(self) -> str:
        head = f"{self.slot}: {self.status}"
        if self.error:
            head += f": {self.error}"
        if self.first is not None and self.status != "error":
            md = "inf" if self.max_diff is None or not math.isfinite(self.max_diff) else f"{self.max_diff:.3g}"
            lay = "" if self.first.layer is None else f", layer {self.first.layer}"
            head += f"; first at {self.first.name} ({self.first.op}{lay}, step {self.step}), max |diff| {md}"
        return head + (f"\n  hint: {self.hint}" if self.hint else "")


@dataclass
class NodeDelta:
    name: str
    op: str
    layer: int | None
    max_abs_diff: float
    max_rel_diff: float

    def to_json(self) -> dict:
        f = (lambda v: v if math.isfinite(v) else "inf")
        return {"name": self.name, "op": self.op, "layer": self.layer, "max_abs_diff": f(self.max_abs_diff),
                "max_rel_diff": f(self.max_rel_diff)}


@dataclass
class PlugReport:
    model: str
    prompt: str
    n_predict: int
    cpu: str
    prompt_ids: list[int]
    ids: list[int]
    text: str
    exact_ids: list[int]
    exact_text: str
    compared_with: str           # whose tokens n_equal counts against
    reference_ids: list[int]
    n_equal: int
    n_compared: int
    sampling: str
    slots: list[SlotResult]
    first_node: NodeDelta | None = None
    step: int | None = None      # the decode step the node diff is of
    layers: list[NodeDelta] = field(default_factory=list)
    engine_error: str | None = None
    llama_cpp_first: str | None = None   # with the live llama.cpp: the first node differing from its own ("": none)

    @property
    def ok(self) -> bool:
        return all(s.status == "bit-identical" for s in self.slots)

    def to_json(self) -> dict:
        return {"model": self.model, "prompt": self.prompt, "n_predict": self.n_predict, "cpu": self.cpu,
                "sampling": self.sampling, "prompt_ids": self.prompt_ids, "ids": self.ids, "text": self.text,
                "exact_ids": self.exact_ids, "exact_text": self.exact_text,
                "llama_cpp": {"compared_with": self.compared_with, "ids": self.reference_ids,
                              "n_equal": self.n_equal, "n_compared": self.n_compared,
                              "first_node": self.llama_cpp_first},
                "slots": [s.to_json() for s in self.slots],
                "first_node": None if self.first_node is None else {**self.first_node.to_json(), "step": self.step},
                "layers": [d.to_json() for d in self.layers], "engine_error": self.engine_error,
                "ok": self.ok}

    def verdict(self) -> str:
        """One line for all the slots."""
        parts = [f"{s.slot} {s.status}" for s in self.slots]
        return (f"{'; '.join(parts)}; tokens equal to {self.compared_with}: {self.n_equal}/{self.n_compared}")

    def summary(self) -> str:
        lines = [f"text: {self.text!r}", f"ids: {self.ids}",
                 f"tokens equal to {self.compared_with}: {self.n_equal}/{self.n_compared}"]
        if self.sampling != "greedy":
            lines.append(f"sampling: {self.sampling}")
        for s in self.slots:
            lines.append(s.line())
        if self.first_node is not None:
            fn = self.first_node
            lines.append(f"first node that differs from the unplugged run (step {self.step}): {fn.name} ({fn.op}"
                         + ("" if fn.layer is None else f", layer {fn.layer}") + f"), max |diff| {fn.max_abs_diff:.3g}")
        if self.layers:
            lines.append("difference through the layers (l_out, max |diff|): "
                         + ", ".join(f"{d.layer}: {d.max_abs_diff:.2g}" for d in self.layers))
        if self.llama_cpp_first is not None:
            lines.append(f"node by node against the live llama.cpp (the prompt): first node that differs: "
                         f"{self.llama_cpp_first or 'none (bit-identical)'}")
        if self.engine_error:
            lines.append(f"engine stopped: {self.engine_error}")
        return "\n".join(lines)


# ---- one generation on the reference kernels ---------------------------------------------------

@dataclass
class Run:
    prompt_ids: list[int]
    ids: list[int]
    text: str
    captures: dict[int, list] = field(default_factory=dict)   # step -> [(label, op, ne, values)]


def _labels(seen):
    from ..llamacpp.eval_callback import labels
    names = labels([("" if name.startswith("__") else name, op) for name, op, _, _ in seen])
    return [(lab, op, ne, vals) for lab, (_, op, ne, vals) in zip(names, seen)]


def generate_once(path, prompt: str, n: int, cpu, params, probes: list[Probe] = (),
                  capture: Callable[[int], bool] = lambda s: False,
                  keep: Callable[[int], bool] = lambda s: True) -> Run:
    """Tokenize, decode the prompt, then ``n`` tokens (greedy, or llama.cpp's chain for ``params``),
    on the reference kernels. ``capture(step)``: record every node of that step; ``keep(step)``,
    asked after it: keep the record (else dropped)."""
    from ..ggml.ops import VIEW_OPS
    from ..llama import Batch, Context, Model
    from ..llama.sampling import Greedy, SamplerChain, common_sampler_init
    from ..llama.validate import check_finite
    from ..llama.vocab import Tokenizer
    tok = Tokenizer.from_model(path)
    ids = tok.tokenize(prompt, add_bos=True, special=True)
    if not ids:
        raise LLMLabError("the prompt produced no tokens")
    model = Model(path, cpu=cpu)
    n_ctx = len(ids) + max(n, 1)
    if n_ctx > model.hparams.n_ctx_train:
        raise LLMLabError(f"prompt + {n} tokens exceed the model's context of {model.hparams.n_ctx_train}")
    ctx = Context(model, n_ctx=n_ctx, n_batch=n_ctx, kernels="reference", cpu=cpu)
    sampler = common_sampler_init(params) if params is not None else SamplerChain([Greedy()])
    for t in ids:
        sampler.accept(t)
    eog = tok.vocab.eog
    run = Run(list(ids), [], "")
    tokens, pos = list(ids), 0
    for step in range(n):
        for p in probes:
            p.step = step
        seen: list = []
        cb = None
        if capture(step):
            def cb(t, seen=seen):
                if t.op in VIEW_OPS or t.view_src is not None:
                    return
                seen.append((t.name, t.op, tuple(t.ne), t.numpy()))
        logits = ctx.decode(Batch.from_tokens(tokens, pos0=pos, logits="last"), callback=cb)[-1]
        check_finite(logits)
        if seen and keep(step):
            run.captures[step] = _labels(seen)
        token = int(sampler(logits))
        if token in eog:
            break
        run.ids.append(token)
        pos += len(tokens)
        tokens = [token]
    run.text = tok.detokenize(run.ids)
    return run


_EXACT: dict[tuple, Run] = {}


def exact_run(path, prompt, n, cpu, params, capture_step: int | None) -> Run:
    """llmlab's own exact path (no slot), kept per process; with the nodes of ``capture_step``."""
    st = Path(path).stat()
    key = (str(path), st.st_size, st.st_mtime_ns, prompt, n, cpu.name, repr(params))
    run = _EXACT.get(key)
    if run is None or (capture_step is not None and capture_step not in run.captures):
        new = generate_once(path, prompt, n, cpu, params,
                            capture=lambda s: s == capture_step)
        if run is not None:
            new.captures.update(run.captures)
        if len(_EXACT) > 8:
            _EXACT.clear()
        run = _EXACT[key] = new
    return run


# ---- comparing two runs' nodes ---------------------------------------------------------------

def node_deltas(mine: list, exact: list) -> list[NodeDelta]:
    """Every node of ``mine`` with the unplugged run's node of the same label (k-th occurrence)."""
    from ..llamacpp.eval_callback import layer_of
    from .probe import max_diff
    idx: dict[tuple, int] = {}
    count: dict[str, int] = {}
    for i, (lab, *_r) in enumerate(exact):
        k = count.get(lab, 0)
        idx[(lab, k)] = i
        count[lab] = k + 1
    out, count = [], {}
    for lab, op, _ne, vals in mine:
        k = count.get(lab, 0)
        count[lab] = k + 1
        j = idx.get((lab, k))
        if j is None:
            continue
        ev = exact[j][3]
        if vals is None or ev is None:
            continue
        if vals.shape != ev.shape:
            d = r = math.inf
        else:
            d = max_diff(vals.astype(np.float32) if vals.dtype.kind == "f" else vals,
                         ev.astype(np.float32) if ev.dtype.kind == "f" else ev)
            scale = float(np.abs(ev[np.isfinite(ev)]).max()) if ev.dtype.kind == "f" and np.isfinite(ev).any() else 0.0
            r = d / scale if scale > 0 else (0.0 if d == 0 else math.inf)
        out.append(NodeDelta(lab, op, layer_of(lab), d, r))
    return out


# ---- whose tokens ---------------------------------------------------------------------------

def _model_name(model: str, path) -> str | None:
    from ..data import REF_STEMS
    if model in REF_STEMS:
        return model
    from .. import models
    for name in REF_STEMS:
        try:
            if Path(models.resolve(name)).resolve() == Path(path).resolve():
                return name
        except Exception:
            continue
    return None


def llama_cpp_tokens(model: str, path, prompt: str, prompt_ids: list[int], n: int, cpu, greedy: bool,
                     exact: Run, oracle: bool = True) -> tuple[str, list[int]]:
    """(whose tokens, the tokens) to count the generated ones against."""
    name = _model_name(model, path)
    if greedy and name is not None:
        from ..data import REF_DIRS, ref_logits
        if cpu.name in REF_DIRS:
            meta, npz = ref_logits(name, cpu.name)
            for i, p in enumerate(meta["prompts"]):
                if p["prompt"] == prompt and [int(x) for x in npz[f"p{i}_ids"]] == list(prompt_ids):
                    ids = [int(x) for x in npz[f"p{i}_greedy"]][:n]
                    return f"llama.cpp's stored references ({cpu.name})", ids
    if greedy and oracle:
        got = _live_greedy(path, prompt_ids, n, cpu)
        if got is not None:
            return "llama.cpp (live)", got
    return "llmlab's exact path (bit-identical to llama.cpp's)", list(exact.ids)


def _live_greedy(path, prompt_ids, n, cpu) -> list[int] | None:
    """Greedy tokens from the installed llama.cpp, where it computes this CPU profile; else None."""
    from .. import llamacpp
    from ..ggml.cpu import profiles
    from ..llamacpp.eval_callback import run_logits
    if not llamacpp.available():
        return None
    try:
        if profiles.resolve("auto").name != cpu.name:
            return None
        toks = list(prompt_ids)
        out: list[int] = []
        for _ in range(n):
            logits = np.asarray(run_logits(path, toks))
            t = int(np.argmax(logits.reshape(-1, logits.shape[-1])[-1]))
            out.append(t)
            toks.append(t)
        return out
    except Exception:
        return None


# ---- the run ---------------------------------------------------------------------------------

def _relative(dep) -> float:
    """The first departure's max |diff| relative to the engine's largest magnitude there."""
    e = np.asarray(dep.engine, np.float64)
    scale = float(np.abs(e[np.isfinite(e)]).max()) if e.size and np.isfinite(e).any() else 0.0
    return dep.max_diff / scale if scale > 0 else (0.0 if dep.max_diff == 0 else math.inf)


def _result(p: Probe, engine_error, mine, same_tokens: bool) -> SlotResult:
    if p.fault is not None:
        status, err = "error", str(p.fault)
    elif engine_error is not None and p.first is not None:
        status, err = "error", f"the engine stopped on what it returned: {engine_error}"
    elif mine is None:
        status, err = "error", "the run did not finish (another slot stopped it)"
    elif p.first is None:
        status, err = "bit-identical", None
    elif p.slot.shadow:
        status, err = ("close" if _relative(p.first) <= 1e-3 else "different"), None
    else:
        status, err = ("close" if same_tokens else "different"), None
    where = p.fault_where if p.fault is not None else (p.first.where if p.first is not None else None)
    return SlotResult(p.slot.name, p.label, status, hint_for(p, status), where,
                      None if p.first is None else p.first.max_diff,
                      p.step if p.fault is not None else (None if p.first is None else p.first.step),
                      p.calls, p.departures, err)


def resolve_fn(slot: Slot, fn) -> tuple[Any, str]:
    if isinstance(fn, str):
        if fn == "reference":
            return slot.reference, "reference"
        if fn == "skeleton":
            return slot.skeleton, "skeleton"
        raise LLMLabError(f"slot {slot.name}: {fn!r} is neither a function nor 'reference' or 'skeleton'")
    if not callable(fn):
        raise LLMLabError(f"slot {slot.name}: {type(fn).__name__} is not a function")
    return fn, getattr(fn, "__name__", "function")


def run(model: str = "smollm2", prompt: str = "The history of the printing press begins in", n: int = 4,
        plugs: dict[str, Any] | None = None, cpu=None, limit: float = guard.DEFAULT_LIMIT_S,
        temp: float = 0.0, seed: int = 42, oracle: bool = True, sources: dict[str, str] | None = None) -> PlugReport:
    """Generate ``n`` tokens with ``plugs`` ({slot name: function, "reference" or "skeleton"}) plugged in."""
    from .. import models
    from ..ggml.cpu import profiles
    from ..llama.sampling import SamplingParams
    if not plugs:
        raise LLMLabError("no slot to plug: give at least one (--slot NAME=FILE.py)")
    if n < 1:
        raise LLMLabError("-n must be at least 1")
    path = models.resolve(model)
    cpu = profiles.resolve(cpu)
    probes = []
    for name, fn in plugs.items():
        slot = get_slot(name)
        f, label = resolve_fn(slot, fn)
        probes.append(Probe(slot, f, limit, (sources or {}).get(name, label)))
    sampled = temp > 0 or any(p.slot.sampling for p in probes)
    params = None
    sampling = "greedy"
    if sampled:
        t = temp if temp > 0 else SamplingParams().temp
        params = SamplingParams(seed=seed, temp=t)
        sampling = (f"llama.cpp's default chain (top-k 40, top-p 0.95, min-p 0.05, temperature {t:g}), seed {seed}"
                    + ("" if temp > 0 else ": a sampling slot needs a sampled generation"))

    first_step = [None]

    def departed(step: int) -> bool:
        hit = any((p.first is not None and p.first.step <= step) or p.fault is not None for p in probes)
        if hit and first_step[0] is None:
            first_step[0] = step
        return hit

    engine_error = None
    mine = None
    try:
        with contextlib.ExitStack() as stack:
            stack.enter_context(helpers.profile(cpu))
            for p in probes:
                stack.enter_context(p.slot.install(p))
            mine = generate_once(path, prompt, n, cpu, params, probes,
                                 capture=lambda s: first_step[0] is None, keep=departed)
    except SlotStopped:
        pass
    except (KeyboardInterrupt, MemoryError):
        raise
    except Exception as e:
        if not any(p.first is not None for p in probes):
            raise
        engine_error = f"{type(e).__name__}: {' '.join(str(e).split())[:300]}"
    step = first_step[0]
    if step is None:
        dep_steps = [p.first.step for p in probes if p.first is not None] + [p.step for p in probes if p.fault]
        step = min(dep_steps) if dep_steps else None
    if mine is None:              # the run stopped: a verdict per slot, no tokens to compare (and no second run)
        results = [_result(p, engine_error, None, False) for p in probes]
        return PlugReport(model, prompt, n, cpu.name, [], [], "", [], "", "nothing (the run stopped)", [], 0, 0,
                          sampling, results, None, step, [], engine_error)
    exact = exact_run(path, prompt, n, cpu, params, step)
    ids, text, prompt_ids = mine.ids, mine.text, mine.prompt_ids
    whose, ref_ids = llama_cpp_tokens(model, path, prompt, exact.prompt_ids, n, cpu, params is None, exact, oracle)
    n_cmp = min(n, len(ref_ids)) if ref_ids else 0
    n_eq = 0
    for a, b in zip(ids, ref_ids[:n_cmp]):
        if a != b:
            break
        n_eq += 1
    same_tokens = mine is not None and prompt_ids == exact.prompt_ids and ids == exact.ids

    first_node, layers = None, []
    if mine is not None and step is not None and step in mine.captures and step in exact.captures:
        deltas = node_deltas(mine.captures[step], exact.captures[step])
        first_node = next((d for d in deltas if d.max_abs_diff != 0), None)
        layers = [d for d in deltas if d.name.startswith("l_out-")]
        if first_node is None:
            layers = []

    llama_first = None
    if oracle and step == 0 and 0 in mine.captures and params is None and prompt_ids == exact.prompt_ids:
        llama_first = _llama_cpp_first(path, prompt_ids, mine.captures[0], cpu)
    results = [_result(p, engine_error, mine, same_tokens) for p in probes]
    return PlugReport(model, prompt, n, cpu.name, prompt_ids, ids, text, exact.ids, exact.text, whose, ref_ids[:n_cmp],
                      n_eq, n_cmp, sampling, results, first_node, step, layers, engine_error, llama_first)


def _llama_cpp_first(path, ids, nodes, cpu):
    """With the live llama.cpp (of this profile): the first node of the plugged prompt's graph whose values
    differ from llama.cpp's own, through diff-llama-cpp's machinery (``llmlab.llamacpp``); else None."""
    from .. import llamacpp
    from ..ggml.cpu import profiles
    if not llamacpp.available():
        return None
    try:
        if profiles.resolve("auto").name != cpu.name:
            return None
        rep = llamacpp.diff(nodes, llamacpp.capture(path, ids, output="last"))
        return rep.first_inexact or ""
    except Exception:
        return None


@contextlib.contextmanager
def plugged(cpu=None, limit=None, **fns):
    """Plug ``fns`` ({slot name: function, "reference" or "skeleton"}) into the engine for the block and
    yield their probes ({name: Probe}); every piece is restored on the way out, whatever happens.
    Contexts made inside with ``kernels="reference"`` run through the plugged functions."""
    from ..ggml.cpu import profiles
    probes = {}
    for name, fn in fns.items():
        slot = get_slot(name)
        f, label = resolve_fn(slot, fn)
        probes[name] = Probe(slot, f, guard.DEFAULT_LIMIT_S if limit is None else limit, label)
    with contextlib.ExitStack() as stack:
        stack.enter_context(helpers.profile(profiles.resolve(cpu)))
        for p in probes.values():
            stack.enter_context(p.slot.install(p))
        yield probes
