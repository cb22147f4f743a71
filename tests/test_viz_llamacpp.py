"""Pictures of a captured graph and of a diff (no llama.cpp needed: a hand-made capture)."""
from __future__ import annotations

import matplotlib

matplotlib.use("Agg")

from test_llamacpp_diff import fake_capture, mine_of  # noqa: E402

from llmlab.llamacpp import diff  # noqa: E402
from llmlab.viz import llamacpp as VL  # noqa: E402


def test_diff_table_colours_by_status():
    cap = fake_capture()
    mine = mine_of(cap)
    mine = [(lab, op, ne, v + 1 if lab == "ffn_glu-0" else v) for lab, op, ne, v in mine if lab != "flash_attn_ext-0"]
    rep = diff(mine, cap)
    assert [VL.status(d, rep.tol) for d in rep.nodes] == ["ok", "ok", "ok", "ok", "missing", "ok", "off", "ok", "ok"]
    html = str(VL.diff_table(rep, layer=0))
    assert html.count("<tr style") == 7 and VL.MATCH_COLORS["missing"] in html and "result_output" not in html


def test_capture_dot_follows_views_to_their_source():
    cap = fake_capture()
    rep = diff(mine_of(cap), cap)
    dot = VL.capture_dot(cap, 0, rep)
    assert dot.startswith("digraph") and dot.count("shape=box") == 7       # compute nodes of layer 0, views hidden
    assert "n2 -> n4;" in dot and "n4 -> n5;" in dot                        # ROPE reads the MUL_MAT through the reshape
    assert 'label="inp_pos"' in dot and VL.MATCH_COLORS["ok"] in dot


def test_error_profile_along_depth():
    cap = fake_capture()
    rep = diff(mine_of(cap), cap)
    assert VL.layer_errors(rep, base="norm") == [(0, 0.0)]
    fig = VL.plot_error_profile({"same": rep}, base="norm")
    assert fig.axes[0].get_yscale() == "log"
