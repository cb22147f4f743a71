"""Chat templates against llama.cpp's ``llama_chat_apply_template`` (llama-cpp-python, the oracle),
hostile templates in the sandbox, and multi-turn chat that keeps the KV cache."""
from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from llmlab import models
from llmlab.ggml.gguf import GGUFFile, GGUFWriter
from llmlab.llama.chat import (BUILTINS, ChatTemplate, ChatTemplateError, llama_chat_apply_template,
                               llm_chat_detect_template, render_jinja)

ROOT = Path(__file__).resolve().parent.parent
SMOL_SYSTEM = "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n"

CONVERSATIONS = [
    [{"role": "user", "content": "Hello"}],
    [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "What is 2+2?"}],
    [{"role": "system", "content": "  Be kind.\n"}, {"role": "user", "content": " Hi \n"},
     {"role": "assistant", "content": "\tHello! "}, {"role": "user", "content": "苹果公司发布了一款新的手机，🙂"}],
    [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}, {"role": "user", "content": "c"},
     {"role": "assistant", "content": "d"}],
    [{"role": "system", "content": "one"}, {"role": "system", "content": "two"}, {"role": "user", "content": "x"}],
]


def oracle(tmpl: str, chat: list[dict], add_ass: bool) -> str:
    """llama.cpp's llama_chat_apply_template, called through llama-cpp-python."""
    L = pytest.importorskip("llama_cpp", reason="llama-cpp-python's llama_chat_apply_template is the oracle")
    keep = [(m["role"].encode(), m["content"].encode()) for m in chat]
    arr = (L.llama_chat_message * len(chat))()
    for i, (role, content) in enumerate(keep):
        arr[i].role, arr[i].content = role, content
    n = L.llama_chat_apply_template(tmpl.encode(), arr, len(chat), add_ass, None, 0)
    assert n >= 0, f"llama.cpp does not know template {tmpl[:40]!r}"
    buf = ctypes.create_string_buffer(n + 1)
    L.llama_chat_apply_template(tmpl.encode(), arr, len(chat), add_ass, buf, n + 1)
    return buf.raw[:n].decode("utf-8")


# ---- equal to llama.cpp ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("family", sorted(BUILTINS))
@pytest.mark.parametrize("add_ass", [True, False])
def test_builtin_formats_equal_llama_cpp(family, add_ass):
    for chat in CONVERSATIONS:
        assert llama_chat_apply_template(family, chat, add_ass) == oracle(family, chat, add_ass)


def test_smollm2_template_equals_llama_cpp():
    """SmolLM2's Jinja template renders as llama.cpp formats it (llama.cpp detects ChatML from the
    same source), except that the template adds SmolLM's default system turn when there is none."""
    t = ChatTemplate.from_model(models.resolve("smollm2"))
    assert not t.builtin and llm_chat_detect_template(t.source) == "chatml"
    for chat in CONVERSATIONS:
        for add_ass in (True, False):
            want = oracle(t.source, chat, add_ass)
            got = t.apply(chat, add_ass)
            assert got == (want if chat[0]["role"] == "system" else SMOL_SYSTEM + want)


def test_gemma3_template_equals_llama_cpp():
    """The Gemma 3 file has no tokenizer.chat_template: its family's built-in, llama.cpp's "gemma"."""
    t = ChatTemplate.from_model(models.resolve("gemma3"))
    assert t.source == "gemma" and t.add_bos and t.bos_token == "<bos>"
    for chat in CONVERSATIONS:
        for add_ass in (True, False):
            assert t.apply(chat, add_ass) == oracle("gemma", chat, add_ass)


def test_jinja_gemma_style_template_cuts_the_bos_it_renders():
    src = ("{{ bos_token }}{% for m in messages %}<start_of_turn>{{ 'model' if m['role'] == 'assistant' else m['role'] }}\n"
           "{{ m['content'] | trim }}<end_of_turn>\n{% endfor %}{% if add_generation_prompt %}<start_of_turn>model\n{% endif %}")
    chat = CONVERSATIONS[3]
    t = ChatTemplate(src, bos_token="<bos>", add_bos=True)
    assert t.apply(chat) == oracle("gemma", chat, True)
    assert ChatTemplate(src, bos_token="<bos>", add_bos=False).apply(chat).startswith("<bos><start_of_turn>")


def test_detection_follows_llama_cpp_order():
    assert llm_chat_detect_template("{{ '<|im_start|>' }}{{ '<|im_sep|>' }}") == "phi4"
    assert llm_chat_detect_template("<start_of_turn>[INST]") == "mistral/llama2"
    assert llm_chat_detect_template("<|start_header_id|>x<|end_header_id|>") == "llama3"
    assert llm_chat_detect_template("{{ messages }}") is None
    with pytest.raises(ChatTemplateError, match="not rebuilt"):
        llama_chat_apply_template("[INST]", CONVERSATIONS[0])


def test_format_single_is_the_new_turn():
    t = ChatTemplate.from_model(models.resolve("smollm2"))
    past = CONVERSATIONS[1] + [{"role": "assistant", "content": "4"}]
    assert t.format_single(past, {"role": "user", "content": "and 3+3?"}) == \
        "<|im_start|>user\nand 3+3?<|im_end|>\n<|im_start|>assistant\n"


# ---- hostile templates -----------------------------------------------------------------------------------------

SSTI = [   # known server-side template injection payloads, each one a walk to Python internals
    "{{ ''.__class__.__mro__[1].__subclasses__() }}",
    "{{ ''.__class__.__base__.__subclasses__()[40]('/etc/passwd').read() }}",
    "{{ cycler.__init__.__globals__.os.popen('id').read() }}",
    "{{ joiner.__init__.__globals__.os.system('touch {marker}') }}",
    "{{ lipsum.__globals__['os'].popen('id').read() }}",
    "{{ namespace.__init__.__globals__.__builtins__['__import__']('os').system('touch {marker}') }}",
    "{{ config.__class__.__init__.__globals__['os'].popen('id').read() }}",
    "{{ request.application.__globals__.__builtins__.__import__('os').popen('id').read() }}",
    "{{ self._TemplateReference__context.cycler.__init__.__globals__.os }}",
    "{{ messages|attr('__class__')|attr('__mro__') }}",
    "{{ messages.__class__.__mro__[-1].__subclasses__() }}",
    "{% for c in [].__class__.__base__.__subclasses__() %}{{ c }}{% endfor %}",
    "{{ '{0.__class__.__mro__}'.format(messages) }}",
    "{{ (1).__class__.__base__.__subclasses__() }}",
    "{{ raise_exception.__globals__ }}",
    "{{ range.__self__ }}",
    "{{ messages.append('x') }}{{ messages.pop() }}",
    "{{ bos_token.__add__.__self__ }}",
]


@pytest.mark.parametrize("payload", SSTI)
def test_injection_payloads_are_refused_and_run_nothing(payload, tmp_path):
    marker = tmp_path / "pwned"
    with pytest.raises(ChatTemplateError, match="refused"):
        render_jinja(payload.replace("{marker}", str(marker)), CONVERSATIONS[0])
    assert not marker.exists()


@pytest.mark.parametrize("source, limit, message", [
    ("{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}", dict(max_seconds=0.3), "longer than"),
    ("{% for i in range(100000) %}{{ 'x' * 1000 }}{% endfor %}", {}, "output exceeds"),
    ("{{ 'x' * 10 ** 12 }}", {}, "memory|too large"),
    ("{% set ns = namespace(s='xx') %}{% for i in range(64) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}{{ ns.s|length }}",
     {}, "memory|longer than"),
    ("{{ 9 ** 999999999 }}", {}, "too large"),
    ("{% macro f() %}{{ f() }}{% endmacro %}{{ f() }}", {}, "recursed"),
    ("{{ range(10 ** 9)|list }}", {}, "MAX_RANGE"),
    ("{% if %}", {}, "line 1"),
    ("{{ raise_exception('only user and assistant roles') }}", {}, "says: only user"),
])
def test_expensive_or_broken_templates_end_in_a_clear_error(source, limit, message):
    t0 = time.monotonic()
    with pytest.raises(ChatTemplateError, match=message):
        render_jinja(source, CONVERSATIONS[0], **limit)
    assert time.monotonic() - t0 < 10


def test_limits_are_lifted_after_a_render():
    import resource
    before, tracer = resource.getrlimit(resource.RLIMIT_AS), sys.gettrace()
    with pytest.raises(ChatTemplateError):
        render_jinja("{{ 'x' * 10 ** 12 }}", [])
    assert resource.getrlimit(resource.RLIMIT_AS) == before and sys.gettrace() is tracer
    assert render_jinja("{% for m in messages %}{{ m.role }}:{{ m.content }};{% endfor %}", CONVERSATIONS[3]) == \
        "user:a;assistant:b;user:c;assistant:d;"


def tiny_chat_model(tmp_path, template: str | None = None) -> Path:
    """A tiny random model with SmolLM2's tokenizer (and template, unless one is given)."""
    from llmlab import models
    from llmlab.llama.tiny import write_tiny
    path = write_tiny(tmp_path / "tiny.gguf", n_layer=2, seed=3, vocab_from=models.resolve("smollm2"))
    if template is None:
        return path
    w = GGUFWriter.from_file(GGUFFile(path))
    w.add("tokenizer.chat_template", template)
    w.write(tmp_path / "hostile.gguf")
    return tmp_path / "hostile.gguf"


def run_cli(*args, input=None, timeout=300):
    return subprocess.run([sys.executable, "-m", "llmlab", *args], input=input, capture_output=True, text=True,
                          cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=timeout)


def test_hostile_template_in_a_model_file_stops_chat_with_one_error_line(tmp_path):
    marker = tmp_path / "pwned"
    r = run_cli("chat", "-m", str(tiny_chat_model(tmp_path, SSTI[3].replace("{marker}", str(marker)))), input="hi\n")
    assert r.returncode == 2 and "Traceback" not in r.stderr and not marker.exists()
    assert r.stderr.strip().splitlines()[-1].startswith("error: chat template refused")


# ---- multi-turn chat on one cache ------------------------------------------------------------------------------

def scripted(tokens):
    it = iter(tokens)
    return lambda logits: next(it)


def play(chat, user, script):
    chat.sampler = scripted(script)
    return list(chat.send(user))


@pytest.fixture(scope="module")
def tiny_chat(tmp_path_factory):
    from llmlab import models
    from llmlab.llama import Model
    from llmlab.llama.vocab import Tokenizer
    path = tiny_chat_model(tmp_path_factory.mktemp("chat"))
    tok = Tokenizer.from_model(models.resolve("smollm2"))
    return Model(path), tok


def session(tiny_chat, template=None, system="Be brief."):
    from llmlab.generate import ChatSession
    from llmlab.llama import Context
    model, tok = tiny_chat
    return ChatSession(Context(model, n_ctx=512), tok, template or ChatTemplate.from_model(models.resolve("smollm2"), tok), system=system)


def check_cache(chat):
    """The cache holds exactly ``chat.cached``, and their text starts the rendered conversation."""
    tok = chat.tokenizer
    assert chat.ctx.kv.seq_pos_max(0) + 1 == len(chat.cached)
    text = tok.detokenize_bytes(chat.cached, special=True).decode()
    assert chat.template.apply(chat.messages, add_generation_prompt=False).startswith(text)


def test_second_turn_decodes_only_the_new_turn(tiny_chat):
    _, tok = tiny_chat
    chat = session(tiny_chat)
    end = tok.tokenize("<|im_end|>", special=True)
    play(chat, "What is the capital of France?", tok.tokenize("Paris.") + end)
    first = chat.last
    assert first.n_cached == 0 and first.stop_reason == "eog" and chat.pending == end
    check_cache(chat)
    play(chat, "And of Italy?", tok.tokenize("Rome.") + end)
    second = chat.last
    new_turn = chat.template.format_single(chat.messages[:3], chat.messages[3])
    assert second.n_cached == first.n_past                         # everything cached was kept
    assert second.prompt_ids == end + tok.tokenize("\n" + new_turn, special=True)   # its end of turn, then the new turn
    assert len(second.prompt_ids) < second.n_cached
    assert chat.messages[-1] == {"role": "assistant", "content": "Rome."}
    check_cache(chat)


def test_a_reply_the_template_formats_differently_is_decoded_again(tiny_chat):
    _, tok = tiny_chat
    chat = session(tiny_chat, ChatTemplate("gemma"), system=None)   # Gemma's format trims the reply
    end = tok.tokenize("<|im_end|>", special=True)
    play(chat, "Hi", tok.tokenize("  Hello there  ") + end)
    n_before = chat.last.n_past
    play(chat, "Again", tok.tokenize("Yes") + end)
    assert 0 < chat.last.n_cached < n_before                        # cut where the text differs
    check_cache(chat)


def test_an_interrupted_reply_still_joins_the_conversation(tiny_chat):
    _, tok = tiny_chat
    chat = session(tiny_chat)
    chat.sampler = scripted(tok.tokenize(" one two three four five"))
    stream = chat.send("Count")
    for _ in range(3):
        next(stream)
    stream.close()
    assert chat.messages[-1] == {"role": "assistant", "content": " one two three"}
    check_cache(chat)
    play(chat, "Go on", tok.tokenize("six") + tok.tokenize("<|im_end|>", special=True))
    check_cache(chat)
    chat.clear()
    assert chat.ctx.kv.seq_pos_max(0) == -1 and chat.messages == [{"role": "system", "content": "Be brief."}]


def test_chat_cli_two_turns_through_a_pipe_reuse_the_cache():
    import re
    r = run_cli("chat", "-m", "smollm2", "--system", "Answer in one short sentence.", "-n", "4", "--temp", "0",
                input="What is the capital of France?\nAnd of Italy?\n/exit\n")
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr
    turns = [tuple(map(int, m)) for m in re.findall(r"\[turn \d+: (\d+) prompt tokens decoded, (\d+) reused from the cache; "
                                                     r".*? cache holds (\d+)\]", r.stderr)]
    assert len(turns) == 2, r.stderr
    (p1, r1, h1), (p2, r2, h2) = turns
    assert r1 == 0 and r2 == h1 and p2 < h2 - 4                     # turn 2 decoded fewer than the history holds
    lines = r.stdout.splitlines()
    assert lines[0].startswith("The capital of France") and lines[1].startswith("The capital of Italy")


def _wait_for(stream, text: str, limit: float = 120) -> str:
    seen, t0 = "", time.monotonic()
    while text not in seen and time.monotonic() - t0 < limit:
        ch = stream.read(1)
        if not ch:
            break
        seen += ch
    return seen


@pytest.mark.parametrize("where", ["reply", "prompt"])
def test_chat_ctrl_c_stops_a_reply_or_ends_the_chat(tmp_path, where):
    p = subprocess.Popen([sys.executable, "-m", "llmlab", "chat", "-m", str(tiny_chat_model(tmp_path)), "--temp", "0"],
                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT,
                         env={**os.environ, "PYTHONPATH": str(ROOT)})
    try:
        assert "Ctrl-C" in _wait_for(p.stderr, "\n")                  # the banner: the model is loaded
        if where == "reply":
            p.stdin.write("Count to a thousand\n")
            p.stdin.flush()
            assert p.stdout.read(1)                                    # the reply is streaming (-n -1: it goes on)
        time.sleep(0.3)
        p.send_signal(signal.SIGINT)
        if where == "reply":
            assert "[reply stopped]" in _wait_for(p.stderr, "[reply stopped]")
            p.stdin.write("/exit\n")
            p.stdin.flush()
        err = p.communicate(timeout=60)[1]
    finally:
        p.kill()
    assert p.returncode == (0 if where == "reply" else 130) and "Traceback" not in err
    assert where == "reply" or err.strip().splitlines()[-1] == "interrupted"     # the CLI's Ctrl-C contract


def test_recursion_stops_at_the_call_depth_bound_and_the_next_render_is_unharmed():
    """A self-calling macro ends at MAX_CALL_DEPTH nested calls, long before Python's recursion limit (where
    jinja's own error handling, or the C stack under the address-space cap, can fail); the count unwinds."""
    from llmlab.llama.chat import MAX_CALL_DEPTH, render_jinja
    with pytest.raises(ChatTemplateError, match=f"nested {MAX_CALL_DEPTH} deep"):
        render_jinja("{% macro f() %}{{ f() }}{% endmacro %}{{ f() }}", [])
    nested = "{% macro f(n) %}{% if n %}{{ f(n - 1) }}{% else %}ok{% endif %}{% endmacro %}{{ f(20) }}"
    assert render_jinja(nested, []) == "ok"


# ---- the second round: templates that crash, outrun or switch off the limits ------------------------------------

TEMPLATES = ROOT / "tests" / "data" / "templates"


@pytest.mark.parametrize("name, message", [
    ("deep_tuple_hash", "nests containers more than"),           # hashing it would overflow CPython's C stack
    ("deep_list_by_filter", "nests containers more than"),       # deeper by a filter, with no literal in the loop
    ("deep_namespace", "nests containers more than"),
    ("bigint_squaring", "too large a number"),                   # one C multiplication no tracer can stop
    ("constant_folding_past_the_deadline", "longer than 2 s"),   # jinja's constant folding swallows errors
])
def test_hostile_templates_from_the_second_round_end_in_a_clear_error_in_bounded_time(name, message):
    source = (TEMPLATES / f"{name}.jinja").read_text()
    t0 = time.monotonic()
    with pytest.raises(ChatTemplateError, match=message):
        render_jinja(source, CONVERSATIONS[0])
    assert time.monotonic() - t0 < 6


def test_nesting_and_number_bounds_leave_ordinary_templates_alone():
    from llmlab.llama.chat import MAX_NESTING
    ok = "{% set d = {'a': [1, (2, 3)], 'b': messages} %}{{ d.a[1][0] }}{{ (7 ** 2000 * 7 ** 2000) % 10 }}{{ 'ab' * 3 }}"
    assert render_jinja(ok, CONVERSATIONS[0]) == "2" + str((7 ** 4000) % 10) + "ababab"
    near = "{% set ns = namespace(t=1) %}{% for i in range(%d) %}{% set ns.t = (ns.t,) %}{% endfor %}{{ {ns.t: 1}|length }}"
    assert render_jinja(near.replace("%d", str(MAX_NESTING - 1)), []) == "1"
    with pytest.raises(ChatTemplateError, match="nests containers"):
        render_jinja(near.replace("%d", str(MAX_NESTING + 1)), [])
    with pytest.raises(ChatTemplateError, match="too large"):
        render_jinja("{{ ([1] * 100000) * 100000 }}", [])


def test_the_time_limit_covers_the_pre_scan_and_compiling_a_huge_template():
    source = "{{ 'a' }}" + " {{ x }}" * 120000                      # ~1 MB: lexing and compiling it takes seconds
    t0 = time.monotonic()
    with pytest.raises(ChatTemplateError, match="longer than 0.2 s"):
        render_jinja(source, [], max_seconds=0.2)
    assert time.monotonic() - t0 < 2


def test_a_crash_of_the_renderer_is_an_error_and_the_next_render_is_unharmed():
    """The worker dies of SIGSEGV in the middle of a render: one error, and the next render gets a new worker."""
    import threading
    from llmlab.llama import template_sandbox
    assert render_jinja("{{ 1 }}", []) == "1"                   # a worker runs
    crashed = template_sandbox.worker_pid()

    def crash():
        time.sleep(0.3)
        os.kill(crashed, signal.SIGSEGV)
    threading.Thread(target=crash).start()
    with pytest.raises(ChatTemplateError, match="crashed its sandboxed renderer.*SIGSEGV"):
        render_jinja("{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}", [], max_seconds=30)
    assert render_jinja("{{ 1 }}", []) == "1" and template_sandbox.worker_pid() not in (None, crashed)


def test_ctrl_c_during_a_render_exits_130_and_leaves_no_renderer_behind(tmp_path):
    source = (TEMPLATES / "constant_folding_past_the_deadline.jinja").read_text()
    p = subprocess.Popen([sys.executable, "-m", "llmlab", "chat", "-m", str(tiny_chat_model(tmp_path, source))],
                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT,
                         env={**os.environ, "PYTHONPATH": str(ROOT)})
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not _children_of(p.pid):   # the renderer has started
            time.sleep(0.05)
        assert _children_of(p.pid)
        p.send_signal(signal.SIGINT)
        err = p.communicate(timeout=30)[1]
    finally:
        p.kill()
    assert p.returncode == 130 and err.strip().splitlines()[-1] == "interrupted" and "Traceback" not in err


def _children_of(pid: int) -> list[int]:
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as f:
            return [int(c) for c in f.read().split()]
    except OSError:
        return []


def test_a_line_of_invalid_utf8_is_skipped_and_the_chat_goes_on(tmp_path):
    r = subprocess.run([sys.executable, "-m", "llmlab", "chat", "-m", str(tiny_chat_model(tmp_path)), "-n", "2",
                        "--temp", "0"], input=b"caf\xe9 \xff\n" + b"hi\n/exit\n", capture_output=True, cwd=ROOT,
                       env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=300)
    err = r.stderr.decode()
    assert r.returncode == 0 and "not valid UTF-8" in err and "[turn 1:" in err and "Traceback" not in err, err


def test_control_characters_of_a_template_error_are_escaped(tmp_path):
    r = run_cli("chat", "-m", str(tiny_chat_model(tmp_path, "{{ raise_exception('\x1b[2J\x07\x08\rALL CHECKS PASSED') }}")),
                input="hi\n")
    assert r.returncode == 2 and "\x1b" not in r.stderr and "\x07" not in r.stderr and "\r" not in r.stderr
    # jinja reads CR as a newline
    assert r.stderr.strip().splitlines()[-1] == "error: chat template says: \\x1b[2J\\x07\\x08 ALL CHECKS PASSED"


def test_the_renderer_ends_by_itself_when_its_parent_is_killed(tmp_path):
    """A hostile render outlives no one: killed with SIGKILL (no cleanup), the parent leaves a child that
    stops at its own alarm, a couple of seconds past the time limit."""
    source = (TEMPLATES / "constant_folding_past_the_deadline.jinja").read_text()
    (tmp_path / "t.jinja").write_text(source)
    script = (f"from pathlib import Path\nfrom llmlab.llama.chat import render_jinja\n"
              f"render_jinja(Path({str(tmp_path / 't.jinja')!r}).read_text(), [], max_seconds=1)\n")
    p = subprocess.Popen([sys.executable, "-c", script], env={**os.environ, "PYTHONPATH": str(ROOT)})
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not _children_of(p.pid):
            time.sleep(0.05)
        children = _children_of(p.pid)
        assert children
        p.kill()
        p.wait(timeout=30)
        t0 = time.monotonic()
        while time.monotonic() - t0 < 10 and any(_alive(c) for c in children):
            time.sleep(0.1)
        assert not any(_alive(c) for c in children)
    finally:
        p.kill()


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(") ")[1][0] != "Z"
    except OSError:
        return False
