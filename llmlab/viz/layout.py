"""Text placement for figures that a projector shows: point labels that do not overlap each other
or the points, and numbers written inside boxes only where they fit.

Both work in display pixels, measured with the figure's renderer, so they must run once the
figure's size and layout are final (after ``tight_layout``, before ``show``); saving with
``bbox_inches="tight"`` only crops, which keeps them valid.
"""
from __future__ import annotations

import math

import numpy as np

# directions tried around a point, in order of preference: right, above right, below right, above,
# below, left ... (degrees, counter-clockwise from the x axis)
DIRECTIONS = (0, 30, -30, 60, -60, 90, -90, 150, -150, 180, 120, -120)
RADII = (5, 12, 22, 34, 48, 64, 82)          # points between the marker and the nearest edge of its label


def _renderer(fig):
    if not hasattr(fig.canvas, "get_renderer"):     # a closed figure: measure it on an Agg canvas
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        FigureCanvasAgg(fig)
    fig.canvas.draw()                          # lays out everything (and gives Agg its renderer)
    return fig.canvas.get_renderer()


def _overlap(a, b) -> float:
    w = min(a.x1, b.x1) - max(a.x0, b.x0)
    h = min(a.y1, b.y1) - max(a.y0, b.y0)
    return w * h if w > 0 and h > 0 else 0.0


def place_labels(ax, x, y, labels, marker_px: float = 6.0, pad_px: float = 2.0, **text_kw) -> list:
    """Write ``labels[i]`` next to the point (``x[i]``, ``y[i]``) where it overlaps no other label,
    no point and stays inside the axes: the first free spot of a few directions at growing distances,
    joined to its point by a thin line when it had to move away. Crowded points are placed first.
    Returns the annotations."""
    fig = ax.figure
    renderer = _renderer(fig)
    pts = ax.transData.transform(np.column_stack([np.asarray(x, float), np.asarray(y, float)]))
    inside = ax.get_window_extent(renderer)
    from matplotlib.transforms import Bbox
    markers = [Bbox.from_extents(px - marker_px, py - marker_px, px + marker_px, py + marker_px) for px, py in pts]
    dist = np.hypot(*(pts[:, None, :] - pts[None, :, :]).transpose(2, 0, 1))
    order = np.argsort(-(dist < 60).sum(axis=1), kind="stable")
    px_per_pt = fig.dpi / 72
    placed, out = [], [None] * len(labels)
    for i in order:
        best = None
        for r in RADII:
            for deg in DIRECTIONS:
                c, s = math.cos(math.radians(deg)), math.sin(math.radians(deg))
                where = dict(xytext=(r * c, r * s), ha="left" if c > 0.3 else "right" if c < -0.3 else "center",
                             va="bottom" if s > 0.3 else "top" if s < -0.3 else "center")
                a = ax.annotate(labels[i], (x[i], y[i]), textcoords="offset points", **where, **text_kw)
                box = a.get_window_extent(renderer).padded(pad_px)
                a.remove()
                cost = sum(_overlap(box, b) for b in placed) + sum(
                    _overlap(box, m) for k, m in enumerate(markers) if k != i)
                cost += box.width * box.height - _overlap(box, inside)      # the part outside the axes
                if best is None or cost < best[0]:
                    best = (cost, r, where, box)
                if cost == 0:
                    break
            if best[0] == 0:
                break
        _, r, where, box = best
        line = {} if r <= RADII[0] else {        # moved away: a thin line says whose label it is
            "arrowprops": dict(arrowstyle="-", color="#555", lw=0.8, shrinkA=0, shrinkB=marker_px / px_per_pt)}
        out[i] = ax.annotate(labels[i], (x[i], y[i]), textcoords="offset points", **where, **line, **text_kw)
        placed.append(box)
    return out


def label_boxes(ax, boxes, labels, pad_px: float = 2.0, **text_kw) -> list:
    """Write ``labels[i]`` in the middle of the data rectangle ``boxes[i]`` = (x0, y0, x1, y1) when
    it fits inside; a box too small for its label stays unlabelled (no digits piled on each other).
    Returns the texts written."""
    renderer = _renderer(ax.figure)
    out = []
    for (x0, y0, x1, y1), label in zip(boxes, labels):
        t = ax.text((x0 + x1) / 2, (y0 + y1) / 2, label, ha="center", va="center", **text_kw)
        (ax0, ay0), (ax1, ay1) = ax.transData.transform([(x0, y0), (x1, y1)])
        ext = t.get_window_extent(renderer)
        if ext.width + 2 * pad_px > abs(ax1 - ax0) or ext.height + pad_px > abs(ay1 - ay0):
            t.remove()
        else:
            out.append(t)
    return out


def overlaps(texts, renderer=None) -> list[tuple[str, str]]:
    """The pairs of texts whose drawn extents overlap (for tests of the figures)."""
    if not texts:
        return []
    renderer = renderer or _renderer(texts[0].figure)
    from matplotlib.text import Text
    boxes = [(t.get_text(), Text.get_window_extent(t, renderer)) for t in texts]    # the text, not its line
    return [(a, b) for k, (a, ba) in enumerate(boxes) for b, bb in boxes[k + 1:] if _overlap(ba, bb) > 0]
