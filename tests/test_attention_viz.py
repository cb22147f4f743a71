"""Pictures of attention (llmlab.viz.attention) and of where llama.cpp/llmlab error enters (viz.llamacpp)."""
from __future__ import annotations

import matplotlib

matplotlib.use("Agg")

import numpy as np  # noqa: E402
import pytest  # noqa: E402
from test_llamacpp_diff import fake_capture, mine_of  # noqa: E402

from llmlab import attention as A  # noqa: E402
from llmlab.llamacpp import diff  # noqa: E402
from llmlab.llama import Model  # noqa: E402
from llmlab.llama.tiny import write_tiny  # noqa: E402
from llmlab.llama.vocab import Tokenizer  # noqa: E402
from llmlab.viz import attention as VA  # noqa: E402
from llmlab.viz import llamacpp as VL  # noqa: E402


def test_token_texts_give_each_character_to_the_token_that_completes_it(smollm2_path):
    tok = Tokenizer.from_model(smollm2_path)
    s = "苹果公司发布了一款新的手机，它的股价"
    ids = tok.tokenize(s)
    texts = VA.token_texts(tok, ids)
    assert len(texts) == len(ids) and "".join(texts) == s
    assert "" in texts                                     # byte-level BPE: some tokens complete nothing
    q = VA.find_token(texts, "它")
    assert texts[q] == "它" and tok.detokenize(ids[:q + 1]).endswith("它")
    with pytest.raises(ValueError, match="no token"):
        VA.find_token(texts, "x")
    labels = VA.plot_labels(texts, {"它": "tā"})
    assert labels[q] == f"{q}:tā" and all(":" in lab for lab in labels)
    assert VA.plot_labels(["", " ", "a\nb"]) == ["0:·", "1:␣", "2:a\\nb"]


def test_plots_draw_the_traced_probabilities(tmp_path):
    m = Model(write_tiny(tmp_path / "t.gguf", "llama", n_layer=2, seed=1))
    toks = [3, 9, 27, 81, 5, 6]
    tr = A.trace(m, toks)
    labels = [f"t{i}" for i in range(len(toks))]
    p = tr.probs(1)
    fig = VA.plot_head(p, labels, head=2, query=4)
    img = fig.axes[0].images[0].get_array()
    np.testing.assert_allclose(np.ma.filled(img, np.nan), p[2])
    assert len(VA.plot_heads(p, query=4).axes) >= m.hparams.n_head
    fig = VA.plot_query(p, labels, 4)
    rows = np.ma.filled(fig.axes[0].images[0].get_array(), np.nan)      # one row per head, the keys it can see
    np.testing.assert_allclose(rows[1], p[1, 4, :5])
    fig = VA.plot_steps(tr[1], labels, head=3)
    assert len(fig.axes) >= 7 and "[6 x 16]" in fig.axes[0].get_title()
    html = str(VA.top_attended(p, labels, 4, k=2))
    best = int(np.argmax(p[0, 4, :5]))
    assert f"{best}:t{best} {p[0, 4, best]:.2f}" in html
    mask = A.causal_mask(40)
    fig = VA.plot_tiles(mask, 16, 16)
    assert fig.axes[0].get_title().startswith("6 tiles computed, 3 skipped")
    _, stats = A.flash_attention(np.ones((1, 40, 2)), np.ones((1, 40, 2)), np.ones((1, 40, 2)), mask, 1.0, 16, 16,
                                 return_stats=True)
    assert (stats.tiles_computed, stats.tiles_skipped) == (6, 3)
    VA.plot_running_max(stats)
    VA.plot_nn_memory([256, 1024], n_head=9)
    rows = A.kv_table(A.SEED_MODELS.values())
    assert str(VA.kv_table_html(rows)).count("<tr>") == 1 + len(rows)


def test_widget_redraws_for_layer_and_head(tmp_path):
    pytest.importorskip("ipywidgets", reason="ipywidgets is not installed (the lab extra)")
    m = Model(write_tiny(tmp_path / "t.gguf", "llama", n_layer=2, seed=1))
    tr = A.trace(m, [3, 9, 27])
    w = VA.heads_widget(tr, ["a", "b", "c"], layer=1, head=0)
    layer, head = w.children[0].children
    assert list(layer.options) == [0, 1] and head.max == m.hparams.n_head - 1
    head.value = 2                                        # redraws without error


def test_first_error_and_node_error_plot():
    cap = fake_capture()
    mine = mine_of(cap)
    assert VL.first_error(diff(mine, cap)) is None
    bumped = [(lab, op, ne, v * (1 + 1e-6) if lab == "ffn_glu-0" and v is not None else v) for lab, op, ne, v in mine]
    rep = diff(bumped, cap)
    assert VL.first_error(rep).name == "ffn_glu-0" and VL.first_error(rep, above=1e-3) is None
    fig = VL.plot_node_errors({"bumped": rep})
    assert fig.axes[0].get_yscale() == "log"
