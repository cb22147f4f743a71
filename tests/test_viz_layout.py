"""Figures for a projector: labels that overlap nothing, numbers only where they fit, no small text."""
from __future__ import annotations

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402
from matplotlib.text import Text  # noqa: E402

from llmlab import nb  # noqa: E402
from llmlab.viz import fonts  # noqa: E402
from llmlab.viz import layout  # noqa: E402


@pytest.fixture
def projector():
    """The notebooks' figure defaults (dpi, text size and its floor), undone afterwards."""
    nb.set_matplotlib_defaults()
    yield
    fonts.set_min_size(0)
    matplotlib.rcParams["font.size"] = matplotlib.rcParamsDefault["font.size"]
    plt.close("all")


def _inside(fig, texts) -> bool:
    r = fig.canvas.get_renderer()
    w, h = fig.bbox.width, fig.bbox.height
    return all(0 <= b.x0 and b.x1 <= w and 0 <= b.y0 and b.y1 <= h for b in (Text.get_window_extent(t, r) for t in texts))


def test_place_labels_in_a_crowd(projector):
    """Five points on top of each other still get five labels that overlap neither each other nor
    the figure's edge; a label moved away from its point gets a line to it."""
    fig, ax = plt.subplots(figsize=(6, 4))
    x = [4.5, 4.5, 4.5, 4.25, 4.26, 1.0, 8.0]
    y = [0.10, 0.095, 0.09, 0.11, 0.09, 0.6, 0.005]
    ax.scatter(x, y)
    ax.set_yscale("log")
    texts = layout.place_labels(ax, x, y, ["q4_0", "nvfp4", "iq4_nl", "mxfp4", "iq4_xs", "q1_0", "q8_0"], fontsize=10)
    assert layout.overlaps(texts) == [] and _inside(fig, texts)
    assert any(t.arrow_patch is not None for t in texts)          # the crowd needs lines
    assert all(t.get_fontsize() >= nb.FIGURE_MIN_FONT for t in texts)


def test_label_boxes_only_where_the_label_fits(projector):
    fig, ax = plt.subplots(figsize=(6, 2))
    ax.set_xlim(0, 100)
    ax.set_ylim(0, 1)
    boxes = [(0, 0, 0.5, 1), (10, 0, 40, 1)]                     # a sliver and a wide box
    texts = layout.label_boxes(ax, boxes, ["17", "18"], fontsize=10)
    assert [t.get_text() for t in texts] == ["18"] and [t.get_text() for t in ax.texts] == ["18"]


def test_error_versus_bpw_labels_do_not_overlap(projector):
    from llmlab.viz import quant as vq
    x = np.random.default_rng(0).standard_normal(256 * 16).astype(np.float32)
    names = ["q4_0", "q4_1", "q5_0", "q5_1", "q8_0", "q2_k", "q3_k", "q4_k", "q5_k", "q6_k", "iq4_nl", "iq4_xs", "f16", "bf16"]
    fig = vq.plot_error_vs_bpw(vq.error_vs_bpw(x, names))
    texts = [t for ax in fig.axes for t in ax.texts]
    assert sorted(t.get_text() for t in texts) == sorted(names)
    assert layout.overlaps(texts) == [] and _inside(fig, texts)


def test_bit_maps_fit_a_projector(projector):
    """The bit map's numbers are at least the floor's size, their cells hold them, and the figure is
    no wider than a 1024 px projector."""
    from llmlab.viz import quant as vq
    fig = vq.plot_bit_maps([("q4_0", 0, 18), ("q4_1", 0, 20), ("q8_0", 0, 18)])
    fig.canvas.draw()
    assert fig.bbox.width <= 1024
    numbers = [t for ax in fig.axes for t in ax.texts]
    assert len(numbers) == 16 * 8 * 2 + 16 * 8 and all(t.get_fontsize() >= nb.FIGURE_MIN_FONT for t in numbers)
    for ax in fig.axes:     # each number narrower than its cell
        cell = ax.get_window_extent().width / 8
        assert max(t.get_window_extent().width for t in ax.texts) < cell
