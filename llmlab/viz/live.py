"""Widget views that render once, in one place, with or without a widget front-end.

``live(render, controls)`` calls ``render(**values)`` now and after every change of a control.
What it returns (a matplotlib figure, an HTML object or markup string, Graphviz source, or a list
of those) goes into *image and HTML widgets* whose values are replaced: nothing is cleared and
redrawn, so the front end cannot lose a view between two updates.

The cell shows a single output holding both the live widget and a static copy of its first
render. JupyterLab draws the widget (it ranks the widget MIME type first) and so shows one
figure, not two; a headless run, a notebook opened without its kernel, or the HTML export
(which drops the widget MIME type) show the static copy. So a viz module never needs to know
whether a widget front-end is present: it returns a figure and calls ``live``.
"""
from __future__ import annotations

import base64
import html as _html
import io
import struct


# PNG pixels per CSS pixel of a live view's image: it is shown at its figure's own size (never stretched
# to the cell's width) and drawn at twice the resolution, so it stays sharp on a dense screen or a projector
HIDPI = 2


def compact_png(png: bytes, colors: int = 256) -> bytes:
    """The same picture as a palette PNG of at most ``colors`` colours, when that is smaller (a plot has
    a few hundred to a few thousand colours, most of them anti-aliased edges; no dithering, so flat
    areas stay flat). A committed notebook stores every figure, so this is what keeps one under 1 MB:
    about a third of matplotlib's RGBA PNG, and the eye sees no difference at display size."""
    try:
        from PIL import Image        # matplotlib's own dependency
    except ImportError:  # pragma: no cover
        return png
    im = Image.open(io.BytesIO(png))
    if im.mode == "P":
        return png
    rgb = im.convert("RGB")
    few = rgb.getcolors(colors)              # None when there are more than ``colors``
    pal = rgb.quantize(colors, method=Image.Quantize.MEDIANCUT, dither=Image.Dither.NONE) if few is None \
        else rgb.quantize(len(few), method=Image.Quantize.MEDIANCUT, dither=Image.Dither.NONE)
    buf = io.BytesIO()
    pal.save(buf, format="png", optimize=True)
    out = buf.getvalue()
    return out if len(out) < len(png) else png


def figure_png(fig, close: bool = True, scale: float = 1) -> bytes:
    """PNG bytes of a matplotlib figure at its own dpi times ``scale`` (the notebooks' default dpi is
    modest), as a palette PNG (``compact_png``)."""
    import matplotlib.pyplot as plt
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=fig.dpi * scale, bbox_inches="tight", facecolor="white")
    if close:
        plt.close(fig)
    return compact_png(buf.getvalue())


def png_size(png: bytes) -> tuple[int, int]:
    """(width, height) in pixels, from the PNG's IHDR chunk."""
    return struct.unpack(">II", png[16:24])


def _css_width(png: bytes) -> int:
    return -(-png_size(png)[0] // HIDPI)


def _figure_of(obj):
    """The matplotlib Figure behind ``obj`` (a Figure, an Axes, an array of Axes), or None."""
    try:
        from matplotlib.axes import Axes
        from matplotlib.figure import Figure
    except ImportError:  # pragma: no cover
        return None
    if isinstance(obj, Figure):
        return obj
    if isinstance(obj, Axes):
        return obj.figure
    if hasattr(obj, "flat"):
        first = next(iter(obj.flat), None)
        if isinstance(first, Axes):
            return first.figure
    return None


def _parts(result, static: bool = False) -> list[tuple[str, object]]:
    """("png", bytes) or ("html", markup) for each piece of a render's result; with ``static`` also the
    picture at display size for the static copy: ("png", (hidpi, display))."""
    import matplotlib.pyplot as plt
    items = list(result) if isinstance(result, (list, tuple)) else [result]
    if result is None or not items:   # the render drew with pyplot and returned nothing
        items = [plt.gcf()] if plt.get_fignums() else []
    out = []
    for it in items:
        fig = _figure_of(it)
        if fig is not None:
            sharp = figure_png(fig, close=False, scale=HIDPI)
            out.append(("png", (sharp, figure_png(fig, close=False)) if static else sharp))
            plt.close(fig)
        elif hasattr(it, "_repr_svg_") and callable(it._repr_svg_):   # graphviz sources
            out.append(("html", f"<div style='max-width:100%;overflow:auto'>{it._repr_svg_()}</div>"))
        elif hasattr(it, "_repr_html_"):
            out.append(("html", it._repr_html_()))
        elif isinstance(it, str):
            out.append(("html", it))
        else:
            out.append(("html", f"<pre>{_html.escape(str(it))}</pre>"))
    plt.close("all")
    return out


def _static_html(parts) -> str:
    chunks = []
    for kind, val in parts:
        if kind == "png":     # the display-size picture: the notebook file stores it, the widget the sharp one
            sharp, shown = val if isinstance(val, tuple) else (val, val)
            chunks.append(f"<img width='{_css_width(sharp)}' style='max-width:100%;height:auto' "
                          f"src='data:image/png;base64,{base64.b64encode(shown).decode()}'/>")
        else:
            chunks.append(val)
    return "<div>" + "".join(chunks) + "</div>"


class LiveView:
    """The widgets of one view: controls on top, one image/HTML widget per rendered piece below."""

    def __init__(self, render, controls, columns: int = 1):
        import ipywidgets as W
        self.render = render
        self.controls = dict(controls) if not isinstance(controls, dict) else controls
        self.W = W
        self.panes_box = W.VBox(layout=W.Layout(width="100%"))
        self.status = W.HTML(value="")
        children = list(self.controls.values())
        for c in children:      # descriptions in full ("values shown", not "values sh...")
            if getattr(c, "description", "") and hasattr(c, "style") and hasattr(c.style, "description_width"):
                c.style.description_width = "initial"
        ctl = W.HBox(children, layout=W.Layout(flex_flow="row wrap")) if columns > 1 else W.VBox(children)
        self.box = W.VBox([ctl, self.status, self.panes_box])
        self.first = self.update(static=True)
        for c in self.controls.values():
            c.observe(self._changed, names="value")

    def values(self) -> dict:
        return {k: c.value for k, c in self.controls.items()}

    def _changed(self, _change=None):
        if self.values() != self._last:      # linked controls may fire twice for one change
            self.update()

    def update(self, static: bool = False):
        W = self.W
        self._last = self.values()
        try:
            parts = _parts(self.render(**self.values()), static)
            self.status.value = ""
        except Exception as e:  # a bad combination of values: say so, keep the last view
            self.status.value = f"<span style='color:#b00'>{_html.escape(type(e).__name__)}: {_html.escape(str(e))}</span>"
            return None
        panes = list(self.panes_box.children)
        kinds = [getattr(p, "_llmlab_kind", None) for p in panes]
        if kinds != [k for k, _ in parts]:
            panes = []
            for kind, _ in parts:
                p = W.Image(format="png", layout=W.Layout(max_width="100%", height="auto")) if kind == "png" else W.HTML()
                p._llmlab_kind = kind
                panes.append(p)
            self.panes_box.children = panes
        for p, (kind, val) in zip(panes, parts):
            if kind == "png" and isinstance(val, tuple):
                val = val[0]
            if kind == "png":        # its own size in CSS pixels: a flex box would otherwise stretch it
                p.layout.width = f"{_css_width(val)}px"
            p.value = val
        return parts

    def _repr_mimebundle_(self, include=None, exclude=None):
        bundle = self.box._repr_mimebundle_(include=include, exclude=exclude) or {}
        if isinstance(bundle, tuple):
            bundle = bundle[0]
        bundle = dict(bundle)
        bundle["text/html"] = _static_html(self.first or [])
        bundle["text/plain"] = "(live view: run the notebook in JupyterLab to change it)"
        return bundle


def live(render, controls, columns: int = 1, show: bool = True) -> LiveView:
    """Wire ``controls`` (a dict name -> widget; names are ``render``'s keyword arguments) to
    ``render`` and display the view. Returns the LiveView (``.box`` is the widget)."""
    view = LiveView(render, controls, columns)
    if show:
        from IPython.display import display
        display(view)
    return view
