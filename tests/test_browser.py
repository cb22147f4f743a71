"""The course the way a learner sees it: JupyterLab in headless chromium (make test-browser).

JupyterLab serves a copy of the notebooks (so autosave never touches the committed files) on a
free loopback port with a token. For each notebook the test opens it in a fresh workspace,
checks that it opens unmodified (no unsaved dot), runs all cells from the Run menu, waits until
the kernel is idle, and checks that no cell shows an error, that widgets render live and that
moving a slider or dropdown changes the view, and that graphs render as SVG. Screenshots go to
build/browser/. Debian's chromium is driven by playwright; no browser is downloaded.
"""
from __future__ import annotations

import os
import time
from pathlib import Path

from llmlab.nb.browser import open_notebook, run_all, wait_idle as _wait_idle

import pytest

pytestmark = [pytest.mark.browser, pytest.mark.slow]

ROOT = Path(__file__).resolve().parent.parent
SHOTS = ROOT / "build" / "browser"
# notebook -> what must be true after Run All: a live control to move, an SVG graph
# (the issue asks for 00, 01, 05, 06 and 08; 02 is here for its CJK and emoji text)
NOTEBOOKS = {
    "00_overview": {"control": None, "svg": True},
    "01_gguf_bytes": {"control": "select", "svg": False},
    "02_tokenizer": {"control": None, "svg": False},      # Chinese text and emoji need the Noto fonts
    "03_attention_and_heads": {"control": "slider", "svg": True},   # the block diagram; the layer/head sliders
    "04_kv_cache": {"control": "slider", "svg": False, "key": "ArrowLeft"},   # find_slot's ring starts at its last step
    "05_quant_blocks": {"control": "slider", "svg": False},
    "06_cgraph_and_scheduler": {"control": "slider", "svg": True},
    "08_full_generation": {"control": "slider", "svg": False},   # the sampler chain's sliders
}
RUN_TIMEOUT = int(os.environ.get("LLMLAB_BROWSER_TIMEOUT", "1200"))


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    from llmlab.nb.browser import Lab, LabUnavailable
    try:
        with Lab(tmp_path_factory.mktemp("lab"), ROOT, os.environ.get("LLMLAB_BROWSER_NOTEBOOKS")) as lab:
            SHOTS.mkdir(parents=True, exist_ok=True)
            yield lab
    except LabUnavailable as e:
        pytest.skip(str(e))


def _view_signature(cell) -> str:
    """What a control changes: images, HTML panes and output widgets of the cell, not the controls."""
    return cell.evaluate("""c => [...c.querySelectorAll('.jp-OutputArea-output img, .widget-html-content, .widget-output')]
                                 .map(e => e.tagName === 'IMG' ? e.src : e.innerHTML).join('|')""")


@pytest.mark.parametrize("name", list(NOTEBOOKS))
def test_notebook_in_browser(lab, name):
    path = lab["served"] / "notebooks" / f"{name}.ipynb"
    assert path.exists(), f"notebooks/{name}.ipynb is missing"
    want = NOTEBOOKS[name]
    console_errors: list[str] = []
    page = open_notebook(lab, name, errors=console_errors)
    time.sleep(2)
    dirty = page.locator(".jp-mod-current.jp-mod-dirty, .lm-TabBar-tab.jp-mod-dirty").count()
    page.screenshot(path=str(SHOTS / f"{name}-opened.png"))
    assert dirty == 0, f"{name} opens as modified (unsaved dot) before any edit"

    run_all(page, RUN_TIMEOUT)                      # Run > Run All Cells
    page.screenshot(path=str(SHOTS / f"{name}-run.png"))

    errors = page.locator(".jp-OutputArea-output[data-mime-type='application/vnd.jupyter.stderr']")
    if errors.count():
        raise AssertionError(f"{name}: {errors.count()} cell(s) show an error or stderr: {errors.first.inner_text()[:1500]}")
    broken = page.locator(".jp-OutputArea-output:has-text('Error displaying widget')")
    assert broken.count() == 0, f"{name}: a widget failed to display"

    # a live view's image is shown at its own size (drawn at twice the resolution), never stretched to the cell
    stretched = page.evaluate("""() => [...document.querySelectorAll('.jp-OutputArea-output .jupyter-widgets img')]
        .filter(i => i.naturalWidth > 0 && i.getBoundingClientRect().width > Math.ceil(i.naturalWidth / 2) + 1)
        .map(i => `${i.naturalWidth} px drawn ${Math.round(i.getBoundingClientRect().width)} px wide`)""")
    assert not stretched, f"{name}: live images stretched beyond their size: {stretched}"

    views = page.locator(".jp-Cell", has=page.locator(".jp-OutputArea-output .jupyter-widgets"))
    if views.count():
        views.first.scroll_into_view_if_needed()
        views.first.screenshot(path=str(SHOTS / f"{name}-view.png"))

    if want["svg"]:
        # inline <svg>, or JupyterLab's SVG renderer (an output of MIME type image/svg+xml, drawn as <img>)
        svg = page.locator(".jp-OutputArea-output svg, .jp-OutputArea-output[data-mime-type='image/svg+xml']")
        assert svg.count() > 0, f"{name}: no graph rendered as SVG"
        svg.first.scroll_into_view_if_needed()
        page.locator(".jp-Cell", has=svg.first).last.screenshot(path=str(SHOTS / f"{name}-graph.png"))

    if want["control"]:
        assert page.locator(".jp-OutputArea-output .jupyter-widgets").count() > 0, f"{name}: no live widget rendered"
        sel = ".jp-OutputArea-output .widget-dropdown select" if want["control"] == "select" \
            else ".jp-OutputArea-output .noUi-handle"
        control = page.locator(sel).first
        control.scroll_into_view_if_needed()
        cell = page.locator(".jp-Cell", has=page.locator(sel)).first    # the cell of the control moved (the first)
        before = _view_signature(cell)
        if want["control"] == "select":
            control.click()
            page.keyboard.press("ArrowDown")
            page.keyboard.press("Enter")
        else:
            control.focus()
            page.keyboard.press(want.get("key", "ArrowRight"))
        t_end = time.time() + 180
        while time.time() < t_end and _view_signature(cell) == before:
            time.sleep(1.0)
        _wait_idle(page, 180)
        cell.screenshot(path=str(SHOTS / f"{name}-widget.png"))
        assert _view_signature(cell) != before, f"{name}: moving the {want['control']} did not change its view"
    assert not console_errors, f"{name}: page errors: {console_errors[:3]}"
    page.close()
