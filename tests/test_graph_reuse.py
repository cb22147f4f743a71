"""Graph reuse: when a micro-batch has the same shapes as the last one of its kind (every decode step while
n_kv stays within its 256-cell padding), the context runs the same graph again with new inputs,
as llama.cpp does; the logits are the same bits as with a fresh graph each time. The one-token graph is
built and planned when the context is made (llama.cpp's graph_reserve), so the first step reuses it too."""
from __future__ import annotations

import numpy as np
import pytest

from llmlab.llama import Batch, Context, Model
from llmlab.llama.tiny import write_tiny
from llmlab.ggml.sched import AccelBackend, CPUBackend, Scheduler


def decode_steps(model, tokens, n_prompt, **kw):
    ctx = Context(model, n_ctx=64, **kw)
    rows = [ctx.decode(Batch.from_tokens(tokens[:n_prompt], logits="last"))[-1]]
    for i, t in enumerate(tokens[n_prompt:]):
        rows.append(ctx.decode(Batch.from_tokens([t], pos0=n_prompt + i, logits="last"))[-1])
    return ctx, np.array(rows)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    d = tmp_path_factory.mktemp("reuse")
    return {arch: Model(write_tiny(d / f"{arch}.gguf", arch, n_layer=3, seed=2)) for arch in ("llama", "gemma3")}


@pytest.mark.parametrize("arch", ["llama", "gemma3"])
def test_reused_graph_gives_identical_logits(tiny, arch):
    toks = [3, 17, 5, 99, 42, 7, 1, 25, 11, 8]
    fresh_ctx, fresh = decode_steps(tiny[arch], toks, 4, graph_reuse=False)
    ctx, reused = decode_steps(tiny[arch], toks, 4)
    np.testing.assert_array_equal(reused, fresh)
    assert fresh_ctx.n_reused == 0 and fresh_ctx.n_built == 7
    assert ctx.n_built == 1 and ctx.n_reused == 6          # the prompt; every decode step runs the one-token graph
                                                           # reserved when the context was made


@pytest.mark.parametrize("arch", ["llama", "gemma3"])
def test_scheduled_contexts_reuse_graph_and_schedule(tiny, arch):
    """The scheduler leaves the graph it splits untouched (the copies live in the schedule), so a scheduled
    context reuses its graph, and the schedule with it, exactly like a plain one."""
    toks = [3, 17, 5, 99, 42, 7]
    _, ref = decode_steps(tiny[arch], toks, 3, graph_reuse=False)
    sched = Scheduler([AccelBackend(), CPUBackend()], n_gpu_layers=2)
    ctx, got = decode_steps(tiny[arch], toks, 3, sched=sched)
    np.testing.assert_array_equal(got, ref)
    assert ctx.n_reused == 2 and ctx.n_built == 2
    assert sched.last.graph is ctx.last_graph.gf and sched.last.n_runs == 3      # one schedule, three runs
    assert sched.last.bytes_copied == sched.last.bytes_to_copy > 0


def test_real_model_decode_reuses_and_stays_exact(smollm2_path):
    from conftest import ref_logits
    _, npz = ref_logits("smollm2")
    toks = npz["p0_ids"].tolist() + npz["p0_greedy"][:5].tolist()
    ctx, rows = decode_steps(Model(smollm2_path), toks, len(npz["p0_ids"]))
    assert ctx.n_reused == 5 and ctx.n_built == 1           # the first step too: the reserved one-token graph
    # the greedy continuation from the reused graph is llama.cpp's
    assert [int(np.argmax(r)) for r in rows[:-1]] == npz["p0_greedy"][:5].tolist()
