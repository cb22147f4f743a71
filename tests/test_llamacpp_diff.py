"""The node-by-node diff itself (no llama.cpp needed): alignment by name, op and occurrence; errors; JSON."""
from __future__ import annotations

import json
import math

import numpy as np
import pytest

from llmlab.llamacpp import diff
from llmlab.llamacpp.diff import errors
from llmlab.llamacpp.eval_callback import Capture, Node, label_nodes, labels


def node(i, name, op, ne, values, op_desc=None, is_view=False, src=()):
    return Node(i, name, op, op_desc or op, tuple(ne) + (1,) * (4 - len(ne)), "f32", src, is_view, values)


def fake_capture():
    rng = np.random.default_rng(1)
    v = lambda *shape: rng.standard_normal(shape).astype(np.float32)   # noqa: E731
    nodes = [
        node(0, "embd", "GET_ROWS", (4, 3), v(3, 4)),
        node(1, "norm-0", "RMS_NORM", (4, 3), v(3, 4)),
        node(2, "Qcur-0", "MUL_MAT", (4, 3), v(3, 4)),
        node(3, "Qcur-0", "RESHAPE", (2, 2, 3), None, is_view=True, src=("Qcur-0",)),
        node(4, "Qcur-0", "ROPE", (2, 2, 3), v(3, 2, 2), src=("Qcur-0", "inp_pos")),
        node(5, "node_5", "FLASH_ATTN_EXT", (2, 2, 3), v(3, 2, 2), src=("Qcur-0",)),
        node(6, "norm-0", "RMS_NORM", (4, 3), v(3, 4)),
        node(7, "ffn_glu-0", "GLU", (4, 3), v(3, 4), op_desc="SWIGLU"),
        node(8, "kq_soft_max-0", "SOFT_MAX", (8, 3), np.where(np.tril(np.ones((3, 8))) > 0, 0.5, -np.inf).astype(np.float32)),
        node(9, "result_output", "MUL_MAT", (10, 3), v(3, 10)),
    ]
    label_nodes(nodes)
    return Capture(nodes, np.zeros((3, 10), np.float32), [1, 2, 3], False, {})


def mine_of(cap):
    return [(n.label, n.op_desc, n.ne, None if n.values is None else n.values.copy()) for n in cap.compute_nodes()]


def test_labels_for_unnamed_nodes_follow_the_layer():
    assert labels([("a-3", "ADD"), ("node_9", "SCALE"), ("", "MUL_MAT"), ("norm", "RMS_NORM"), ("leaf_2", "CPY")]) == \
        ["a-3", "scale-3", "mul_mat-3", "norm", "cpy-3"]
    assert labels([("node_0", "GET_ROWS")]) == ["get_rows"]


def test_identical_graphs_match_everywhere():
    cap = fake_capture()
    rep = diff(mine_of(cap), cap)
    assert rep.total == 9 and rep.matched == 9 and rep.first_divergence is None
    assert [d.name for d in rep.nodes][:6] == ["embd", "norm-0", "Qcur-0", "Qcur-0", "flash_attn_ext-0", "norm-0"]
    assert all(d.max_abs_err == 0 for d in rep.nodes)


def test_alignment_by_name_op_and_occurrence():
    cap = fake_capture()
    mine = mine_of(cap)
    # llmlab lacks the first Qcur-0 (MUL_MAT): the ROPE must still align with llama.cpp's ROPE
    del mine[2]
    # the second norm-0 diverges: the first must not be blamed
    lab, op, ne, val = mine[4]
    assert (lab, op) == ("norm-0", "RMS_NORM")
    mine[4] = (lab, op, ne, val + 0.5)
    rep = diff(mine, cap)
    qs = [d for d in rep.nodes if d.name == "Qcur-0"]
    assert [d.llama_cpp_op for d in qs] == ["MUL_MAT", "ROPE"]
    assert not qs[0].matched and qs[0].op == "ROPE"        # a Qcur-0 exists, but it computes something else
    assert qs[1].matched and qs[1].max_abs_err == 0
    assert rep.first_divergence == "norm-0" and rep.first_inexact == "norm-0"
    norms = [d for d in rep.nodes if d.name == "norm-0"]
    assert norms[0].max_abs_err == 0 and norms[1].max_abs_err == pytest.approx(0.5)
    assert rep.matched == rep.total - 1


def test_glu_matches_by_op_or_sub_op_and_shapes_ignore_trailing_ones():
    cap = fake_capture()
    mine = mine_of(cap)
    i = next(k for k, m in enumerate(mine) if m[0] == "ffn_glu-0")
    mine[i] = ("ffn_glu-0", "glu", (4, 3, 1), mine[i][3])
    assert diff(mine, cap).matched == 9
    mine[i] = ("ffn_glu-0", "SWIGLU", (3, 4), mine[i][3])            # wrong shape
    d = next(d for d in diff(mine, cap).nodes if d.name == "ffn_glu-0")
    assert d.op_match and not d.shape_match and d.max_rel_err is None


def test_masked_infinities_must_coincide():
    cap = fake_capture()
    sm = cap["kq_soft_max-0"].values
    assert errors(sm, sm) == (0.0, 0.0)
    moved = sm.copy()
    moved[0, 5] = 0.5
    assert errors(moved, sm) == (math.inf, math.inf)
    mine = [(lab, op, ne, moved if lab == "kq_soft_max-0" else v) for lab, op, ne, v in mine_of(cap)]
    rep = diff(mine, cap)
    assert rep.first_divergence == "kq_soft_max-0"
    assert json.loads(json.dumps(rep.to_json()))["nodes"][7]["max_rel_err"] == "inf"   # 8th compute node


def test_json_contract_and_layer_filter():
    cap = fake_capture()
    mine = {lab: (op, ne, v) for lab, op, ne, v in mine_of(cap)}     # the mapping form (first occurrences)
    out = diff(mine, cap).to_json()
    assert set(out) == {"nodes", "matched", "total", "first_divergence"}
    assert set(out["nodes"][0]) == {"name", "op", "shape", "llama_cpp_op", "llama_cpp_shape", "max_abs_err", "max_rel_err"}
    assert out["total"] == 9 and out["matched"] == 7          # the second norm-0 and Qcur-0 have no mapping entry
    only = diff(mine, cap, layers=range(1, 2))
    assert [d.name for d in only.nodes] == ["embd", "result_output"]


def test_layerless_nodes_inside_a_layer_belong_to_it():
    nodes = [node(0, "embd", "GET_ROWS", (4, 3), None), node(1, "ffn_out-0", "MUL_MAT", (4, 3), None),
             node(2, "norm", "RMS_NORM", (4, 3), None), node(3, "ffn_post_norm-0", "MUL", (4, 3), None),
             node(4, "norm-1", "RMS_NORM", (4, 3), None), node(5, "norm", "RMS_NORM", (4, 3), None),
             node(6, "result_output", "MUL_MAT", (4, 3), None)]
    label_nodes(nodes)
    assert [n.il for n in nodes] == [None, 0, 0, 0, 1, None, None]
    cap = Capture(nodes, np.zeros((3, 4), np.float32), [1, 2, 3], False, {})
    assert [d.name for d in diff([], cap, layers=range(1, 2)).nodes] == ["embd", "norm-1", "norm", "result_output"]
