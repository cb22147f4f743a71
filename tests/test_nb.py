"""The notebooks' helpers: set-up, live views, exercise checkers, the teaching tokenizers, the runner."""
from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest

from llmlab import nb
from llmlab.nb import exercises as ex
from llmlab.viz import tokenizers_demo as td


def test_live_view_renders_once_and_updates(capsys):
    import matplotlib
    matplotlib.use("agg")
    import ipywidgets as W
    import matplotlib.pyplot as plt

    calls = []

    def render(n):
        calls.append(n)
        fig, ax = plt.subplots(figsize=(2, 1))
        ax.plot(range(n))
        return [fig, f"<b>{n}</b>"]

    view = nb.live(render, {"n": W.IntSlider(value=3, description="a long description")}, show=False)
    bundle = view._repr_mimebundle_()
    # one output: the live widget, and a static copy (image + HTML) for front ends without widgets
    assert "application/vnd.jupyter.widget-view+json" in bundle
    assert "data:image/png;base64," in bundle["text/html"] and "<b>3</b>" in bundle["text/html"]
    assert [type(p).__name__ for p in view.panes_box.children] == ["Image", "HTML"]
    png = view.panes_box.children[0].value
    # drawn at twice the resolution, shown at the figure's own size (not stretched to the cell's width)
    from llmlab.viz.live import HIDPI, png_size
    css = -(-png_size(png)[0] // HIDPI)
    assert png_size(png)[0] >= 2 * 80 * 1.5 and view.panes_box.children[0].layout.width == f"{css}px"
    assert f"width='{css}'" in bundle["text/html"]
    view.controls["n"].value = 5
    assert calls == [3, 5]
    assert view.panes_box.children[1].value == "<b>5</b>" and view.panes_box.children[0].value != png
    view._changed()                     # a second event for the same values does not redraw
    assert calls == [3, 5]
    assert view.controls["n"].style.description_width == "initial"
    assert plt.get_fignums() == []      # figures are closed, none leaks to the inline backend


def test_live_view_reports_errors_and_keeps_last_view():
    import ipywidgets as W

    def render(k):
        if k == 2:
            raise ValueError("no such thing")
        return f"<i>{k}</i>"

    view = nb.live(render, {"k": W.IntSlider(value=1)}, show=False)
    view.controls["k"].value = 2
    assert "no such thing" in view.status.value and view.panes_box.children[0].value == "<i>1</i>"


def test_setup_helpers(capsys):
    assert nb.choose_threads(3) == (3, "as asked")
    p = nb.cpu_profile()
    assert p["cores"] >= 1
    assert nb.has_oracle("x", module="surely_not_a_module_llmlab") is False
    assert "skipped: x needs surely_not_a_module_llmlab" in capsys.readouterr().out
    d = nb.build_dir("test")
    assert d.is_dir() and "build" in str(d) or "llmlab-notebooks" in str(d)


def test_fallback_fonts_are_a_family_chain():
    import matplotlib
    from llmlab.viz import fonts
    found = nb.set_matplotlib_defaults()
    fonts.set_min_size(0)               # the floor is the next test's subject; other tests draw without it
    assert matplotlib.rcParams["font.family"][1:] == found
    assert matplotlib.rcParams["figure.dpi"] == nb.FIGURE_DPI


def test_setup_puts_a_floor_under_font_sizes():
    """After the set-up no text is drawn under FIGURE_MIN_FONT points, however small a plot asks for
    it, and the floor is what layout measures; the rest keeps its size."""
    import matplotlib
    import matplotlib.pyplot as plt
    from llmlab.viz import fonts
    try:
        nb.set_matplotlib_defaults()
        assert matplotlib.rcParams["font.size"] == nb.FIGURE_FONT and fonts.min_size() == nb.FIGURE_MIN_FONT
        fig, ax = plt.subplots()
        tiny = ax.text(0, 0, "17", fontsize=5)
        big = ax.text(0, 0, "17", fontsize=20)
        ax.tick_params(labelsize=6)
        fig.canvas.draw()
        assert tiny.get_fontsize() == nb.FIGURE_MIN_FONT and big.get_fontsize() == 20
        assert all(t.get_fontsize() == nb.FIGURE_MIN_FONT for t in ax.get_xticklabels())
        h = tiny.get_window_extent().height
        assert h >= nb.FIGURE_MIN_FONT * nb.FIGURE_DPI / 72 * 0.9      # pixels, as measured by layout
        plt.close(fig)
        fonts.set_min_size(0)
        assert matplotlib.font_manager.FontProperties(size=5).get_size_in_points() == 5
    finally:
        fonts.set_min_size(0)
        matplotlib.rcParams["font.size"] = matplotlib.rcParamsDefault["font.size"]


def test_wordpiece_and_unigram():
    assert td.wordpiece("The unaffable players!") == ["▁the", "▁unaff", "able", "▁play", "er", "s", "▁!"]
    assert td.wordpiece("unplayable") == ["[UNK]"]          # no piece continues with "p": the word is unknown
    pieces, total, _ = td.viterbi(td.ugm_normalize("hugs"))
    assert pieces == ["▁hug", "s"] and total == pytest.approx(-6.5)
    assert td.greedy_longest(td.ugm_normalize("hugs"), td.UGM_VOCAB) == ["▁hugs"]   # greedy is worse here
    assert td.unigram("the bun hugs") == ["▁the", "▁b", "un", "▁hug", "s"]


def test_checkers(smollm2_path, capsys):
    from llmlab.ggml import quant as Q
    v = ex.check_bits_per_weight("q4_0", 0)
    assert v.ok is False and v.message.startswith("no answer yet") and not v
    assert v.message == ("no answer yet: the cell still holds its placeholder (0); put your answer in its place, "
                         "then run the cell again")          # what the cell shows (my_answer = 0), not the parameter
    assert "(...)" in ex.check_q8_0_decode(b"\0" * 34, ...).message and "argument" not in v.message
    assert ex.check_bits_per_weight("q4_k", 4.5)
    x = np.linspace(-1, 2, 32).astype(np.float32)
    good = Q.quantize(x, "q4_1")
    assert ex.check_q4_1_block(x, good.tobytes())
    swapped = good.copy()
    swapped[4:] = (good[4:] >> 4) | (good[4:] << 4)
    v = ex.check_q4_1_block(x, swapped.tobytes())
    assert not v and v.message.startswith("not yet: nibble order: ")
    assert ex.check_kv_pair(smollm2_path, 24, "general.architecture", 8, "llama", 69)
    assert not ex.check_kv_pair(smollm2_path, 24, "general.architecture", 8, "llama", 70)
    assert ex.check_tensor_nbytes(smollm2_path, "blk.0.ffn_down.weight", 576 * 1536 // 32 * 20)
    assert ex.check_wordpiece("unplayable", ["[UNK]"]) and not ex.check_unigram("bun", ["▁bun"])
    assert ex.check_kv_cache_bytes(smollm2_path, 4096, 4096 * 30 * 2 * 3 * 64 * 2)
    assert ex.check_arithmetic_intensity(5.0, 3.2)
    # 00: llama.cpp's simple loop: one prefill pass, then one pass per token fed back (never the last)
    assert ex.check_forward_passes(10, 20, {"passes": 20, "tokens": 29})
    v = ex.check_forward_passes(10, 20, {"passes": 29, "tokens": 29})
    assert not v and "one batch" in v.message
    v = ex.check_forward_passes(10, 20, {"passes": 21, "tokens": 30})
    assert not v and "never fed back" in v.message
    # 03: kq holds one micro-batch of queries against the cache's cells, F32
    assert ex.check_kq_bytes(9, 512, 4096, 9 * 512 * 4096 * 4)
    v = ex.check_kq_bytes(9, 512, 4096, 9 * 4096 * 4096 * 4)
    assert not v and "micro-batch" in v.message
    v = ex.check_kq_bytes(9, 512, 4096, 9 * 512 * 4096 * 2)
    assert not v and "F32" in v.message
    assert "query head" in ex.check_kq_bytes(9, 512, 4096, 512 * 4096 * 4).message
    assert capsys.readouterr().out == ""          # a checker prints nothing: the notebook shows its verdict


def test_verdict_is_one_line_shown_the_same_way(capsys):
    right, wrong = ex.check_kv_head(9, 3, 7, 2), ex.check_kv_head(9, 3, 7, 1)
    assert right == ex.Verdict(True, "correct: query head 7 reads KV head 2") and right
    assert not wrong and str(wrong) == wrong.message == ("not yet: KV head 1: that is h mod n_head_kv: ggml shares KV "
                                                         "heads between *consecutive* query heads")
    right._ipython_display_()            # how a notebook shows a cell that ends with the checker call
    wrong._ipython_display_()
    assert capsys.readouterr().out == f"{right.message}\n{wrong.message}\n"
    assert ex.is_not_yet(wrong.message) and ex.is_not_yet(ex.check_kv_head(9, 3, 7, None).message)
    assert not ex.is_not_yet(right.message)


def test_function_and_launch_checkers():
    """08's checkers run the learner's function; 07's compare launch arithmetic and dp4a."""
    assert ex.check_top_p(lambda logits, p: None).message == "not yet: your function returned None (not written yet?)"
    assert ex.check_repeat_penalty(lambda *a: 1 / 0).message == "not yet: your function raised ZeroDivisionError: division by zero"

    def top_p(logits, p):
        order = np.argsort(-logits, kind="stable")
        probs = np.exp(logits[order] - logits.max())
        probs /= probs.sum()
        return order[:min(int(np.searchsorted(np.cumsum(probs), p)) + 1, len(order))]
    assert ex.check_top_p(top_p) == ex.Verdict(True, "correct")
    # a wrong answer gets the rule and a direction, never the expected number
    msg = ex.check_launch({"iters": 3}, "q6_K", 640, 2048).message
    assert msg.startswith("not yet: iters = 3 (too large): trips of the K loop") and "2" not in msg
    msg = ex.check_launch({"blocks_per_iter": 8}, "q6_K", 640, 2048).message
    assert "(too large)" in msg and "4" not in msg
    assert ex.check_launch({"iters": 2, "blocks_per_row": 8}, "q6_K", 640, 2048)
    assert ex.check_launch({"iters": None}, "q6_K", 640, 2048).message.startswith("no answer yet")
    assert ex.check_dp4a(lambda a, b, c: c).message == \
        "not yet: fn(0x01020304, 0x01010101, 0) = 0 is off: check this case: small positive bytes"
    assert ex.check_dp4a(lambda a, b, c: None).message.startswith("not yet: your function returned None")
    assert ex.check_lanes("q4_K", list(range(16, 32)), {5: 10, 21: 10})
    msg = ex.check_lanes("q4_K", [1], {5: 3}).message
    assert msg.startswith("not yet: the lanes on block 1") and "16" not in msg and "10" not in msg
    assert ex.check_lanes("q4_K", [], {5: None}).message.startswith("no answer yet")


def test_tensor_groups(smollm2_path):
    from llmlab.ggml.gguf import GGUFFile
    from llmlab.viz.gguf import tensor_groups
    with GGUFFile(smollm2_path) as f:
        g = tensor_groups(f)
        assert list(g)[:3] == ["global", "blk.0", "blk.1"] and len(g) == 31
        assert sum(len(v) for v in g.values()) == len(f.tensors)
        assert len(g["blk.0"]) == 9


def _tiny_notebook(tmp_path, source):
    import nbformat
    notebook = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("x = 1"), nbformat.v4.new_code_cell(source)])
    notebook.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    path = tmp_path / "t.ipynb"
    nbformat.write(notebook, str(path))
    return path


def test_runner_fails_on_a_warning_and_names_the_cell(tmp_path):
    pytest.importorskip("nbclient")
    from llmlab.nb.runner import NotebookCellError, run_notebook
    path = _tiny_notebook(tmp_path, "import warnings; warnings.warn('careful')")
    with pytest.raises(NotebookCellError, match="cell 1 wrote to stderr: .*careful"):
        run_notebook(path, timeout=120)
    ok = _tiny_notebook(tmp_path, "print('fine')")
    run_notebook(ok, timeout=120, write=True)
    saved = json.loads(ok.read_text())
    assert "".join(saved["cells"][1]["outputs"][0]["text"]) == "fine\n"
    assert "execution" not in saved["cells"][1]["metadata"] and "widgets" not in saved["metadata"]
    assert ok.read_text().endswith("}\n") and saved["nbformat_minor"] >= 5
    from jupyter_client.kernelspec import KernelSpecManager
    assert saved["metadata"]["kernelspec"]["display_name"] == KernelSpecManager().get_kernel_spec("python3").display_name


def test_runner_fails_on_a_solution_its_checker_rejects(tmp_path):
    pytest.importorskip("nbclient")
    import nbformat
    from llmlab.nb.runner import NotebookCellError, run_notebook
    path = _tiny_notebook(tmp_path, "from llmlab.nb import exercises as ex\nex.check_kv_head(9, 3, 7, 1)")
    notebook = nbformat.read(path, as_version=4)
    notebook.cells[1].metadata = {"jupyter": {"source_hidden": True}, "tags": [ex.SOLUTION_TAG]}
    nbformat.write(notebook, str(path))
    with pytest.raises(NotebookCellError, match="cell 1 is a solution, but its checker does not say correct: not yet: KV head 1"):
        run_notebook(path, timeout=120)
    notebook.cells[1].source = "x = 2"                 # a solution that shows no verdict proves nothing
    nbformat.write(notebook, str(path))
    with pytest.raises(NotebookCellError, match="cell 1 is a solution, but its checker does not say correct: no verdict"):
        run_notebook(path, timeout=120)
    notebook.cells[1].source = "from llmlab.nb import exercises as ex\nex.check_kv_head(9, 3, 7, 2)"
    nbformat.write(notebook, str(path))
    out = run_notebook(path, timeout=120).cells[1].outputs
    assert [(o.output_type, o.text) for o in out] == [("stream", "correct: query head 7 reads KV head 2\n")]


def test_one_run_writes_both_editions(tmp_path):
    """--write stores the learner's edition (no solution, counts renumbered), --teacher the whole run."""
    pytest.importorskip("nbclient")
    import nbformat
    from llmlab.nb.runner import main
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "00_x.py").write_text(
        '# %% [markdown]\n# # Title\n\n# %%\nfrom llmlab.nb import exercises as ex\nmy_answer = None\n'
        'ex.check_kv_head(9, 3, 7, my_answer)\n\n# %% jupyter={"source_hidden": true} tags=["solution"]\n'
        'ex.check_kv_head(9, 3, 7, 2)\n\n# %%\n1 + 1\n')
    path = tmp_path / "00_x.ipynb"
    assert main(["--write", "--teacher", str(tmp_path / "teacher"), str(path)]) == 0
    learner, teacher = nbformat.read(path, as_version=4), nbformat.read(tmp_path / "teacher" / "00_x.ipynb", as_version=4)
    assert [c.source for c in learner.cells] == [c.source for c in teacher.cells if "solution" not in c.metadata.get("tags", [])]
    assert len(teacher.cells) == 4 and len(learner.cells) == 3
    assert learner.cells[1].outputs[0].text.startswith("no answer yet: the cell still holds its placeholder (None)")
    assert teacher.cells[2].outputs[0].text == "correct: query head 7 reads KV head 2\n"
    assert [c.execution_count for c in learner.cells[1:]] == [1, 2] and learner.cells[2].outputs[0].execution_count == 2
    assert [c.execution_count for c in teacher.cells[1:]] == [1, 2, 3]


def test_html_export_keeps_the_static_copy(tmp_path):
    pytest.importorskip("nbconvert")
    import nbformat
    from llmlab.nb.runner import export_html
    cell = nbformat.v4.new_code_cell("view")
    cell.outputs = [nbformat.v4.new_output("display_data", data={
        "application/vnd.jupyter.widget-view+json": {"model_id": "abc", "version_major": 2, "version_minor": 0},
        "text/html": "<b>static copy</b>", "text/plain": "(live view)"})]
    notebook = nbformat.v4.new_notebook(cells=[nbformat.v4.new_markdown_cell("# Title"), cell])
    path = tmp_path / "x.ipynb"
    nbformat.write(notebook, str(path))
    out = export_html([path], tmp_path / "html")
    page = (tmp_path / "html" / "x.html").read_text()
    assert "<b>static copy</b>" in page and "widget-view+json" not in page and "require.min.js" not in page
    assert "Title" in (tmp_path / "html" / "index.html").read_text() and len(out) == 2
    guide = tmp_path / "guide.md"
    guide.write_text("# The guide\n\n| a | b |\n|---|---|\n| 1 | 2 |\n")
    out = export_html([path], tmp_path / "teacher", guide=guide)
    assert [p.name for p in out] == ["x.html", "guide.html", "index.html"]
    assert "<table>" in (tmp_path / "teacher" / "guide.html").read_text()
    assert "guide.html" in (tmp_path / "teacher" / "index.html").read_text()


def test_handout(tmp_path, capsys):
    """The learner's notebooks with the address in their set-up cell; bad input is one error line, exit 2."""
    import nbformat
    from llmlab.nb import colab
    root = Path(__file__).parent.parent / "notebooks"
    assert colab.main(["--pip", "https://example.org/llmlab-0.1.0-py3-none-any.whl", "-o", str(tmp_path / "out"),
                       str(root / "00_overview.ipynb"), str(root / "08_full_generation.ipynb")]) == 0
    nb = nbformat.read(tmp_path / "out" / "00_overview.ipynb", as_version=4)
    first = next(c for c in nb.cells if c.cell_type == "code")
    assert 'LLMLAB_PIP = "https://example.org/llmlab-0.1.0-py3-none-any.whl"' in first.source.replace("'", '"')
    assert first.source == colab.with_pip(colab.SETUP_CELL, "https://example.org/llmlab-0.1.0-py3-none-any.whl")
    capsys.readouterr()
    teacher = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(colab.SETUP_CELL),
                                              nbformat.v4.new_code_cell("x", metadata={"tags": ["solution"]})])
    nbformat.write(teacher, str(tmp_path / "t.ipynb"))
    for argv, said in [(["--pip", " ", str(root / "00_overview.ipynb")], "address"),
                       (["--pip", "x", str(tmp_path / "t.ipynb")], "solution cells"),
                       (["--pip", "x", str(tmp_path / "missing.ipynb")], "missing.ipynb")]:
        assert colab.main(argv + ["-o", str(tmp_path / "bad")]) == 2
        err = capsys.readouterr().err
        assert err.startswith("error: ") and said in err and err.count("\n") == 1
    assert not (tmp_path / "bad").exists()


def test_graph_carries_its_full_picture():
    """The picture is in the output itself (a link to a file outside the folder JupyterLab serves
    would be a 404), stored once: fitted to the page, and at its own size through a style scoped to
    this output when the line below it is opened."""
    from llmlab.ggml.graphviz import has_dot
    if not has_dot():
        pytest.skip("Graphviz's dot is not installed")
    html = nb.graph("digraph { a -> b; b -> c; }", "full-picture-test", folder="test").data
    assert "href" not in html and html.count("<svg") == 1
    assert "full picture" in html and "</details>" in html
    w = re.search(r"click for the full picture \((\d+) x \d+ px\)", html).group(1)
    assert f'<svg width="{w}px" style="max-width:100%;height:auto"' in html
    style = re.search(r"<style>(.*?)</style>", html).group(1)
    assert "#llmlab-g-full-picture-test details[open] ~ div svg{max-width:none" in style
    assert html.index("<details>") < html.index("<svg")         # CSS reaches only later siblings
    assert (nb.build_dir("test") / "full-picture-test.svg").is_file()


def test_rare_characters_drawn_from_an_outline(gemma3_path):
    """02's table draws each character from a font's outline (the hieroglyph from the one-glyph font
    llmlab ships), so no browser shows a box, and says how the tokenizer took it."""
    from llmlab.llama.vocab import Tokenizer
    from llmlab.viz import fonts
    from llmlab.viz import tokens as vt
    assert fonts.font_with("\U00013000").startswith(str(fonts.SHIPPED_DIR))
    svg = fonts.glyph_svg("\U00013000")
    assert svg.startswith("<svg") and "<path d='M" in svg and "Egyptian" in svg
    assert fonts.glyph_svg("\U000e0100") is None            # a variation selector: no font here has it
    html = vt.characters_html(Tokenizer.from_model(gemma3_path), "\U00013000 \U0001d538").markup
    assert html.count("<tr>") == 3 and html.count("<svg") == 2          # a header and two characters
    assert "byte fallback: 4 byte tokens" in html and "one vocabulary entry" in html
    assert "egyptian hieroglyph a001" in html


def test_whitespace_is_visible_in_token_boxes(gemma3_path):
    from llmlab.llama.vocab import Tokenizer
    from llmlab.viz import tokens as vt
    assert vt.visible(" a\n\tb") == "␣a↵→b"
    html = vt.fragments_html(Tokenizer.from_model(gemma3_path), "Hello\n\nworld", special=False).markup
    assert "↵↵ = " in html


def test_first_offloaded_checker():
    """06's exercise: llama.cpp offloads the last n_gpu_layers slots; the hints name the slip, not the answer."""
    from llmlab.nb import exercises as ex
    assert ex.check_first_offloaded(30, 5, 26)
    assert "output layer" in str(ex.check_first_offloaded(30, 5, 25))
    assert "from the end" in str(ex.check_first_offloaded(30, 5, 5))
    assert "26" not in str(ex.check_first_offloaded(30, 5, 7))


def test_notebook_threads_wait_passively():
    """Importing llmlab.nb makes OpenMP's threads sleep at once (a kernel shares its cores with the browser);
    a wait policy or spin count the user set is left alone."""
    import os
    import subprocess
    import sys
    code = "import os, llmlab.nb; print(os.environ.get('OMP_WAIT_POLICY'), os.environ.get('GOMP_SPINCOUNT'))"
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["PASSIVE", "None"]
    out = subprocess.run([sys.executable, "-c", code], env={**env, "GOMP_SPINCOUNT": "5000"},
                         capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["None", "5000"]
