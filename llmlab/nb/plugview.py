"""``nb.plug(rms_norm=my_rms_norm)``: a learner's own functions run inside the engine on the real model.

As the last line of a cell it shows one verdict line (``correct: ...`` when every function keeps the
engine bit for bit llama.cpp's, ``not yet: ...`` with the first node that departs and a hint, ``no
answer yet: ...`` for a skeleton) and, when a node departs, a small picture: where the difference
starts and how it grows through the layers. As a context manager (``with nb.plug(rms_norm=f) as
probes: ...``) it plugs the functions into the reference kernels for the block and restores the
engine afterwards, whatever happens. ``.report`` is the full :class:`llmlab.plug.runner.PlugReport`.
"""
from __future__ import annotations

import math
import sys

from ..plug import guard


class Plug:
    def __init__(self, model: str = "smollm2", prompt: str | None = None, n: int = 4,
                 limit: float = guard.DEFAULT_LIMIT_S, temp: float = 0.0, seed: int = 42, **fns):
        if not fns:
            raise TypeError("nb.plug needs at least one slot=function, e.g. nb.plug(rms_norm=my_rms_norm)")
        self.model, self.n, self.limit, self.temp, self.seed, self.fns = model, n, limit, temp, seed, fns
        self.prompt = prompt if prompt is not None else "The history of the printing press begins in"
        self._report = None
        self._ctx = None

    # ---- the run -------------------------------------------------------------------------------
    @property
    def report(self):
        if self._report is None:
            from ..plug.runner import run
            self._report = run(self.model, self.prompt, self.n, self.fns, limit=self.limit, temp=self.temp,
                               seed=self.seed)
        return self._report

    @property
    def ok(self) -> bool:
        return self.report.ok

    def __bool__(self) -> bool:
        return self.ok

    def verdict(self) -> str:
        """The one line: correct, not yet, or no answer yet."""
        r = self.report
        skeleton = [s for s in r.slots if s.status == "error" and s.hint.startswith("not written yet")]
        if skeleton:
            return (f"no answer yet: {', '.join(s.slot for s in skeleton)} is not written yet (the skeleton raises "
                    f"NotImplementedError); write its body, then run the cell again")
        tok = f"tokens equal to {r.compared_with}: {r.n_equal}/{r.n_compared}"
        idle = [s.slot for s in r.slots if s.status == "bit-identical" and s.calls == 0]
        if idle:
            return (f"not yet: the engine never called {', '.join(idle)} on {self.model} with this prompt: plug it "
                    f"where the model uses it (python -m llmlab plug --list shows each slot's models)")
        if r.ok:
            calls = sum(s.calls for s in r.slots)
            return f"correct: {', '.join(s.slot for s in r.slots)} bit-identical in {calls} calls; {tok}"
        bad = [s for s in r.slots if s.status != "bit-identical"]
        parts = []
        for s in bad:
            where = ""
            if s.first is not None:
                lay = "" if s.first.layer is None else f", layer {s.first.layer}"
                md = "" if s.max_diff is None or s.status == "error" else \
                    f", max |diff| {s.max_diff:.3g}" if math.isfinite(s.max_diff) else ", max |diff| inf"
                where = f" at {s.first.name} ({s.first.op}{lay}{md})"
            parts.append(f"{s.slot} {s.status}{where}" + (f": {s.error}" if s.error else ""))
        hints = "; ".join(s.hint for s in bad if s.hint)
        return f"not yet: {'; '.join(parts)}; {tok}: {hints}"

    def table(self):
        """The slots' statuses, one row each (for notebook 08's "your engine")."""
        from ..viz.html import table
        rows = []
        for s in self.report.slots:
            first = "-" if s.first is None else s.first.name
            md = "-" if s.max_diff is None else (f"{s.max_diff:.3g}" if math.isfinite(s.max_diff) else "inf")
            rows.append([s.slot, s.status, first, md, s.hint])
        return table(["slot", "status", "first node", "max |diff|", "hint"], rows)

    def figure(self):
        """Where the difference starts and how it grows through the layers (None when nothing departs)."""
        r = self.report
        if r.first_node is None or not r.layers:
            return None
        import matplotlib.pyplot as plt
        import numpy as np
        fig, ax = plt.subplots(figsize=(7, 2.6))
        layers = [d.layer for d in r.layers]
        vals = [d.max_abs_diff if math.isfinite(d.max_abs_diff) else np.nan for d in r.layers]
        floor = min([v for v in vals if v and v > 0] + [1e-9]) / 10
        ax.bar(layers, [v if v and v > 0 else floor for v in vals], color="#c44e52")
        ax.set_yscale("log")
        ax.set_xlabel("layer (l_out)")
        ax.set_ylabel("max |diff|")
        fn = r.first_node
        ax.set_title(f"first departure: {fn.name} ({fn.op}), step {r.step}; then through the layers", fontsize=9)
        if fn.layer is not None:
            ax.axvline(fn.layer - 0.5, color="k", lw=0.8, ls="--")
        fig.tight_layout()
        return fig

    def _ipython_display_(self) -> None:
        sys.stdout.write(self.verdict() + "\n")
        sys.stdout.flush()
        fig = self.figure()
        if fig is not None:
            from IPython.display import display
            import matplotlib.pyplot as plt
            display(fig)
            plt.close(fig)

    def __repr__(self) -> str:
        return self.verdict()

    # ---- as a context manager -------------------------------------------------------------------
    def __enter__(self):
        from ..plug.runner import plugged
        self._ctx = plugged(limit=self.limit, **self.fns)
        return self._ctx.__enter__()

    def __exit__(self, *exc):
        ctx, self._ctx = self._ctx, None
        return ctx.__exit__(*exc)


def plug(model: str = "smollm2", prompt: str | None = None, n: int = 4, limit: float = guard.DEFAULT_LIMIT_S,
         temp: float = 0.0, seed: int = 42, **fns) -> Plug:
    """Plug ``fns`` ({slot name: your function}) into the engine and run ``model`` on ``prompt`` for ``n``
    tokens (run when shown, or on ``.report``), diffed against llama.cpp's path node by node."""
    return Plug(model, prompt, n, limit, temp, seed, **fns)
