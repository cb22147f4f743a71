"""Chat templates: a conversation (role, content messages) to the one prompt string a model was
trained on, as llama.cpp makes it.

llama.cpp has two routes, and so does this module:

- **Jinja** (llama.cpp's default, ``--jinja``): the model's ``tokenizer.chat_template`` is a
  Jinja program, rendered with ``messages``, ``bos_token``, ``eos_token`` and
  ``add_generation_prompt`` (:meth:`ChatTemplate.apply`). A leading BOS is cut from the text
  when the tokenizer adds one anyway (``common_chat_template_direct_apply``).
- **Built-in** (``llama_chat_apply_template``): llama.cpp recognises the family of a template by
  telltale strings (``llm_chat_detect_template``) and formats it with C++ code. ChatML, Gemma and
  Llama 3 are rebuilt here (:func:`llama_chat_apply_template`); a model file without a template
  (Gemma 3's here) is formatted with its family's built-in.

A chat template comes from a file anyone can edit, so it is untrusted code. It runs in jinja2's
``ImmutableSandboxedEnvironment`` (no attributes that start with ``_``, no internals such as
``__globals__`` or ``__subclasses__``, no mutating methods), and any attempt is refused with a
:class:`ChatTemplateError` instead of jinja2's silent undefined; a name with ``__`` in it is
refused before the template runs at all, which stops the known injection payloads up front. Rendering is bounded: on
POSIX it runs in a forked child process that is killed at the time limit (so no C-level loop, big
multiplication or compile-time constant folding can outrun it, and Ctrl-C stops it at once), under
an address-space cap, and a crash of the child is an error, not a crash of the caller; the sandbox
caps the output, ``**`` exponents, the size of ``*`` results (big integers, repeated strings), calls
nested in calls, and how deeply the tuples, lists and dicts a template builds nest (hashing a tuple
nested 100,000 deep overflows CPython's C stack). Without ``fork`` the render runs in this process
under a line tracer. Huge loops, string bombs and deep recursion end in the same clear error.
"""
from __future__ import annotations

import json
import math
import os
import select
import signal
import sys
import threading
import time
from dataclasses import dataclass

from .. import LLMLabError

MAX_SECONDS = 2.0          # per render
MAX_OUTPUT = 1 << 20       # characters
MAX_EXTRA_MEMORY = 256 << 20   # bytes a render may add to the address space (Linux)
MAX_NESTING = 100          # containers in containers a template may build (real templates: a few levels)
MAX_INT_BITS = 65536       # the largest integer (in bits) ``**`` and ``*`` may make
MAX_ITEMS = 1 << 24        # the longest string or list ``*`` may make
MAX_CALL_DEPTH = 100       # nested calls (a macro calling itself): far past real templates, far short of
                           # Python's recursion limit, where jinja's error handling itself can fail or the
                           # C stack can outgrow the address-space cap (a crash, seen in CI)


class ChatTemplateError(LLMLabError):
    """A chat template that is malformed, hostile, or too expensive to render."""


# ---- llama.cpp's built-in formats (src/llama-chat.cpp) --------------------------------------------------

def _trim(s: str) -> str:
    """llama-chat.cpp's trim: ASCII whitespace (C ``isspace``) only."""
    return s.strip(" \t\n\v\f\r")


def _chatml(chat, add_ass):
    out = "".join(f"<|im_start|>{m['role']}\n{m['content']}<|im_end|>\n" for m in chat)
    return out + ("<|im_start|>assistant\n" if add_ass else "")


def _gemma(chat, add_ass):
    out, system = [], ""
    for m in chat:
        if m["role"] == "system":      # Gemma has no system turn: it goes in front of the next user turn
            system += _trim(m["content"])
            continue
        role = "model" if m["role"] == "assistant" else m["role"]
        out.append(f"<start_of_turn>{role}\n")
        if system and role != "model":
            out.append(system + "\n\n")
            system = ""
        out.append(_trim(m["content"]) + "<end_of_turn>\n")
    return "".join(out) + ("<start_of_turn>model\n" if add_ass else "")


def _llama3(chat, add_ass):
    out = "".join(f"<|start_header_id|>{m['role']}<|end_header_id|>\n\n{_trim(m['content'])}<|eot_id|>" for m in chat)
    return out + ("<|start_header_id|>assistant<|end_header_id|>\n\n" if add_ass else "")


BUILTINS = {"chatml": _chatml, "gemma": _gemma, "llama3": _llama3}

# llm_chat_detect_template's tests, in its order, down to the last family rebuilt here (llama3):
# a template that an earlier test claims belongs to that family, even if a later test would match.
_DETECT = [
    ("phi4", lambda t: "<|im_start|>" in t and "<|im_sep|>" in t),
    ("smolvlm", lambda t: "<|im_start|>" in t and "<end_of_utterance>" in t),
    ("chatml", lambda t: "<|im_start|>" in t),
    ("mistral/llama2", lambda t: t.startswith("mistral") or "[INST]" in t),
    ("phi3", lambda t: "<|assistant|>" in t and "<|end|>" in t),
    ("chatglm4", lambda t: "[gMASK]<sop>" in t),
    ("falcon3/glmedge", lambda t: "<|assistant|>" in t and "<|user|>" in t),
    ("glmedge", lambda t: "<|{{ item['role'] }}|>" in t and "<|begin_of_image|>" in t),
    ("zephyr", lambda t: "<|user|>" in t and "<|endoftext|>" in t),
    ("monarch", lambda t: "bos_token + message['role']" in t),
    ("gemma", lambda t: "<start_of_turn>" in t),
    ("orion", lambda t: "'\\n\\nAssistant: ' + eos_token" in t),
    ("openchat", lambda t: "GPT4 Correct " in t),
    ("vicuna", lambda t: "USER: " in t and "ASSISTANT: " in t),
    ("deepseek", lambda t: "### Instruction:" in t and "<|EOT|>" in t),
    ("command-r", lambda t: "<|START_OF_TURN_TOKEN|>" in t and "<|USER_TOKEN|>" in t),
    ("llama3", lambda t: "<|start_header_id|>" in t and "<|end_header_id|>" in t),
]


def llm_chat_detect_template(tmpl: str) -> str | None:
    """The built-in family llama.cpp would pick for a template (a name, or Jinja source), or
    None when no test up to Llama 3's matches (llama.cpp tests more families after that)."""
    if tmpl in BUILTINS:
        return tmpl
    return next((name for name, test in _DETECT if test(tmpl)), None)


def llama_chat_apply_template(tmpl: str | None, chat: list[dict], add_ass: bool = True) -> str:
    """``llama_chat_apply_template``: format ``chat`` with the built-in format ``tmpl`` names or
    whose Jinja source it is (None means ChatML, as in llama.cpp)."""
    family = llm_chat_detect_template("chatml" if tmpl is None else tmpl)
    if family not in BUILTINS:
        raise ChatTemplateError(f"llama.cpp's built-in format {family or 'for this template'!r} is not rebuilt here "
                                f"(rebuilt: {', '.join(BUILTINS)}); render the template with Jinja instead")
    messages = _messages(chat)
    size = sum(len(m["role"]) + len(m["content"]) for m in messages)
    if size > MAX_OUTPUT:          # the same bound as a Jinja template's output
        raise ChatTemplateError(f"the conversation ({size:,} characters) is larger than the {MAX_OUTPUT:,} "
                                f"a chat template may produce")
    return BUILTINS[family](messages, add_ass)


def _messages(chat) -> list[dict]:
    out = []
    for i, m in enumerate(chat):
        if not (isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str)):
            raise ChatTemplateError(f"message {i} must be a dict with string 'role' and 'content', not {m!r}")
        out.append({"role": m["role"], "content": m["content"]})
    return out


# ---- the sandboxed Jinja route ------------------------------------------------------------------------------

def _sandbox():
    from jinja2 import nodes
    from jinja2.exceptions import SecurityError
    from jinja2.sandbox import ImmutableSandboxedEnvironment
    from jinja2.visitor import NodeTransformer

    def nested(node):
        return nodes.Call(nodes.EnvironmentAttribute("nested"), [node], [], None, None, lineno=node.lineno)

    class Nest(NodeTransformer):
        """Every tuple, list and dict literal, and every value a ``set`` or ``with`` stores, goes
        through ``environment.nested``, which bounds how deeply containers nest."""

        def visit_Tuple(self, node):
            node = self.generic_visit(node)
            return nested(node) if node.ctx == "load" else node

        def visit_List(self, node):
            return nested(self.generic_visit(node))

        visit_Dict = visit_List

        def visit_Assign(self, node):
            node = self.generic_visit(node)
            node.node = nested(node.node)
            return node

        def visit_With(self, node):
            node = self.generic_visit(node)
            node.values = [nested(v) for v in node.values]
            return node

    class Sandbox(ImmutableSandboxedEnvironment):
        """jinja2's immutable sandbox that refuses loudly and caps ``**``, ``*`` and nesting."""
        intercepted_binops = frozenset({"**", "*"})

        def _parse(self, source, name, filename):
            return Nest().visit(super()._parse(source, name, filename))

        def unsafe_undefined(self, obj, attribute):
            raise ChatTemplateError(f"chat template refused: it reaches for {attribute!r} of a "
                                    f"{type(obj).__name__} object, which templates may not touch (Python internals)")

        def call_binop(self, context, operator, left, right):
            if operator == "**" and isinstance(left, int) and isinstance(right, int) and \
                    right > 0 and right * math.log2(abs(left) + 2) > MAX_INT_BITS:
                raise ChatTemplateError(f"chat template refused: {_short(left)} ** {_short(right)} is too large a number")
            if operator == "*":
                _check_product(left, right)
            return super().call_binop(context, operator, left, right)

        def call(__self, __context, __obj, *args, **kwargs):   # noqa: N805 (jinja2's signature)
            depth = getattr(_CALLS, "depth", 0)
            if depth >= MAX_CALL_DEPTH:
                raise ChatTemplateError(f"chat template recursed too deeply (calls nested {MAX_CALL_DEPTH} deep)")
            _CALLS.depth = depth + 1
            try:
                return super().call(__context, __obj, *args, **kwargs)
            except SecurityError as e:
                raise ChatTemplateError(f"chat template refused: {e}") from None
            finally:
                _CALLS.depth = depth

    # the environment Hugging Face's apply_chat_template uses, which chat templates are written for;
    # no constant folding at compile time (jinja2 turns any error inside it, a time limit's too, into "not constant")
    env = Sandbox(trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"], optimized=False)
    env.nested = _nested
    env.filters["tojson"] = lambda x, indent=None, separators=None, sort_keys=False: json.dumps(
        x, ensure_ascii=False, indent=indent, separators=separators, sort_keys=sort_keys)
    env.globals.update(raise_exception=_raise_exception, strftime_now=lambda fmt: time.strftime(fmt))
    return env


def _short(n: int) -> str:
    return str(n) if n.bit_length() < 64 else f"(a {n.bit_length()}-bit integer)"


def _check_product(left, right) -> None:
    """Refuse a ``*`` whose result is a huge integer or a huge repeated sequence, before computing it
    (one C multiplication of two huge integers cannot be interrupted)."""
    if isinstance(left, int) and isinstance(right, int):
        if left.bit_length() + right.bit_length() > MAX_INT_BITS:
            raise ChatTemplateError(f"chat template refused: {_short(left)} * {_short(right)} is too large a number")
        return
    for seq, n in ((left, right), (right, left)):
        if isinstance(n, int) and isinstance(seq, (str, list, tuple)) and len(seq) * max(n, 0) > MAX_ITEMS:
            raise ChatTemplateError(f"chat template refused: a {type(seq).__name__} of {len(seq)} repeated {n} times "
                                    f"is too large (more than {MAX_ITEMS} items)")


_DEPTHS: dict[int, tuple[object, int]] = {}   # id -> (container, nesting depth) seen in the current render


def _children(obj):
    from jinja2.utils import Namespace
    if isinstance(obj, dict):
        return [*obj.keys(), *obj.values()]
    if isinstance(obj, (list, tuple, set, frozenset)):
        return obj
    if isinstance(obj, Namespace):
        return list(object.__getattribute__(obj, "_Namespace__attrs").values())
    return None


def _too_deep() -> ChatTemplateError:
    return ChatTemplateError(f"chat template refused: it nests containers more than {MAX_NESTING} deep")


def _nested(value):
    """``value``, once it is known to nest no deeper than MAX_NESTING containers (walked without
    recursion; containers already measured are not walked again)."""
    if _children(value) is None:
        return value
    # iterative post-order walk: a stack of (container, iterator over its children, depth so far)
    stack = [(value, iter(_children(value)), 0)]
    on_path = {id(value)}
    while stack:
        obj, it, best = stack[-1]
        for child in it:
            known = _DEPTHS.get(id(child))
            if known is not None and known[0] is child:
                best = max(best, known[1])
                continue
            kids = _children(child)
            if kids is None or id(child) in on_path:
                continue
            if len(stack) >= MAX_NESTING:
                raise _too_deep()
            stack[-1] = (obj, it, best)
            stack.append((child, iter(kids), 0))
            on_path.add(id(child))
            break
        else:
            stack.pop()
            on_path.discard(id(obj))
            if best + 1 > MAX_NESTING:
                raise _too_deep()
            _DEPTHS[id(obj)] = (obj, best + 1)
            if stack:
                parent, pit, pbest = stack[-1]
                stack[-1] = (parent, pit, max(pbest, best + 1))
    return value


_CALLS = threading.local()      # how deep the calls of the render on this thread are nested


def _raise_exception(message):
    raise ChatTemplateError(f"chat template says: {message}")


_ENV = None


def _env():
    global _ENV
    if _ENV is None:
        _ENV = _sandbox()
    return _ENV


class _Limits:
    """Time (a line tracer), and on Linux address space (RLIMIT_AS), for one render in this process."""

    def __init__(self, seconds: float, extra_memory: int):
        self.seconds, self.extra_memory = seconds, extra_memory

    def _trace(self, frame, event, arg):
        if time.monotonic() > self.deadline:
            raise ChatTemplateError(f"chat template ran longer than {self.seconds:g} s")
        return self._trace

    def __enter__(self):
        self.deadline = time.monotonic() + self.seconds
        self.old_trace, self.old_as = sys.gettrace(), None
        if self.extra_memory:
            self.old_as = _cap_address_space(self.extra_memory)
        sys.settrace(self._trace)
        return self

    def __exit__(self, *exc):
        sys.settrace(self.old_trace)
        if self.old_as is not None:
            import resource
            resource.setrlimit(resource.RLIMIT_AS, self.old_as)
        return False


def _cap_address_space(extra: int):
    """Cap this process's address space at what it uses now plus ``extra`` (Linux); the old limit, or None."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        import resource
    except ModuleNotFoundError:
        return None
    old = resource.getrlimit(resource.RLIMIT_AS)
    cap = _address_space() + extra
    if old[1] == resource.RLIM_INFINITY or cap < old[1]:
        resource.setrlimit(resource.RLIMIT_AS, (cap, old[1]))
    return old


def _address_space() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")


def render_jinja(source: str, messages: list[dict], add_generation_prompt: bool = True, bos_token: str = "",
                 eos_token: str = "", max_seconds: float = MAX_SECONDS, max_output: int = MAX_OUTPUT,
                 max_extra_memory: int = MAX_EXTRA_MEMORY) -> str:
    """Render a Jinja chat template in the sandbox, within the limits; any failure is a
    :class:`ChatTemplateError` that says what went wrong."""
    if not isinstance(source, str):
        raise ChatTemplateError(f"a chat template is text, not {type(source).__name__}")
    if len(source) > max_output:
        raise ChatTemplateError(f"chat template of {len(source)} characters is larger than the {max_output} allowed")
    context = dict(messages=_messages(messages), add_generation_prompt=bool(add_generation_prompt),
                   bos_token=_text(bos_token, "bos_token"), eos_token=_text(eos_token, "eos_token"))
    if hasattr(os, "fork"):
        return _render_in_child(source, context, max_seconds, max_output, max_extra_memory)
    with _Limits(max_seconds, max_extra_memory):
        return _render(source, context, max_output)


def _text(value, name: str) -> str:
    if not isinstance(value, str):
        raise ChatTemplateError(f"{name} must be a string, not {type(value).__name__}")
    return value


def _render(source: str, context: dict, max_output: int) -> str:
    """The render itself (the pre-scan, compiling and running the template); every failure is a ChatTemplateError."""
    from jinja2 import TemplateError
    parts, size = [], 0
    _DEPTHS.clear()
    try:
        for line, kind, value in _env().lex(source):   # payloads reach internals through dunder names
            if kind == "name" and "__" in value:
                raise ChatTemplateError(f"chat template refused: line {line} names {value!r}; "
                                        "names with '__' lead to Python internals")
        template = _env().from_string(source)
        for chunk in template.generate(**context):
            size += len(chunk)
            if size > max_output:
                raise ChatTemplateError(f"chat template output exceeds {max_output} characters")
            parts.append(chunk)
    except ChatTemplateError:
        raise
    except MemoryError:
        raise ChatTemplateError("chat template needed too much memory") from None
    except RecursionError:
        raise ChatTemplateError("chat template recursed too deeply") from None
    except TemplateError as e:
        where = f" (line {e.lineno})" if getattr(e, "lineno", None) else ""
        raise ChatTemplateError(f"chat template error{where}: {e.message or type(e).__name__}") from None
    except Exception as e:   # an operation inside the template failed (TypeError, OverflowError, ...)
        raise ChatTemplateError(f"chat template failed: {type(e).__name__}: {e}") from None
    finally:
        _DEPTHS.clear()
    return "".join(parts)


def _render_in_child(source: str, context: dict, max_seconds: float, max_output: int, max_extra_memory: int) -> str:
    """Render in a forked child, killed at the deadline (a watchdog no template code can switch off);
    Ctrl-C here (KeyboardInterrupt) kills it too. The child answers with one JSON object on a pipe."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:                                   # the child: render, answer, exit without cleanup
        code = 1
        try:
            os.close(r)
            signal.signal(signal.SIGINT, signal.SIG_IGN)     # the parent decides what Ctrl-C does
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
            signal.signal(signal.SIGALRM, signal.SIG_DFL)    # ends the child by itself should the parent die:
            signal.alarm(int(max_seconds) + 2)               # SIGALRM's default action stops even C code
            sys.settrace(None)
            import faulthandler
            faulthandler.disable()                          # a crash here is the parent's to report, in one line
            if max_extra_memory:
                _cap_address_space(max_extra_memory)
            try:
                answer = {"text": _render(source, context, max_output)}
            except ChatTemplateError as e:
                answer = {"error": str(e)}
            except MemoryError:
                answer = {"error": "chat template needed too much memory"}
            data = json.dumps(answer).encode()
            view = memoryview(data)
            while view:
                view = view[os.write(w, view):]
            code = 0
        except BaseException:   # noqa: BLE001 (nothing may escape a forked child into the caller's code)
            pass
        finally:
            os._exit(code)
    os.close(w)
    chunks, status = [], None
    try:
        deadline = time.monotonic() + max_seconds
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise ChatTemplateError(f"chat template ran longer than {max_seconds:g} s")
            ready, _, _ = select.select([r], [], [], left)
            if ready:
                chunk = os.read(r, 1 << 20)
                if not chunk:
                    break
                chunks.append(chunk)
        status = os.waitpid(pid, 0)[1]
    finally:
        os.close(r)
        if status is None:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            os.waitpid(pid, 0)
    try:
        answer = json.loads(b"".join(chunks)) if os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0 else None
    except ValueError:
        answer = None
    if answer is None:
        how = (f"signal {signal.Signals(os.WTERMSIG(status)).name}" if os.WIFSIGNALED(status)
               else f"exit status {os.waitstatus_to_exitcode(status)}")
        raise ChatTemplateError(f"chat template crashed its sandboxed renderer ({how})")
    if "error" in answer:
        raise ChatTemplateError(answer["error"])
    return answer["text"]


# ---- a model's template -----------------------------------------------------------------------------------

@dataclass
class ChatTemplate:
    """A model's chat format: Jinja ``source``, or the name of a llama.cpp built-in; ``add_bos``
    is the tokenizer's rule, and a BOS the Jinja output starts with is cut when it holds."""
    source: str
    bos_token: str = ""
    eos_token: str = ""
    add_bos: bool = False

    @property
    def builtin(self) -> bool:
        return self.source in BUILTINS

    @classmethod
    def from_model(cls, model, tokenizer=None) -> "ChatTemplate":
        """The template of a GGUF model (a path, registry name or open ``GGUFFile``); without
        ``tokenizer.chat_template`` the built-in of its family (Gemma's for Gemma models, else
        ChatML, llama.cpp's default)."""
        from ..ggml.gguf import GGUFFile
        from .. import models
        gguf = model if isinstance(model, GGUFFile) else GGUFFile(models.resolve(model))
        kv = gguf.kv
        source = kv.get("tokenizer.chat_template")
        if source is not None and not isinstance(source, str):
            raise ChatTemplateError(f"tokenizer.chat_template must be a string, not {type(source).__name__}")
        if source is None:
            source = "gemma" if str(kv.get("general.architecture", "")).startswith("gemma") else "chatml"
        if tokenizer is None:
            from .vocab import Tokenizer
            tokenizer = Tokenizer.from_model(gguf.path)
        v = tokenizer.vocab

        def text(i):
            return tokenizer.token_to_piece(i, special=True).decode("utf-8", "replace") if i is not None else ""
        return cls(source, text(v.bos), text(v.eos), bool(v.add_bos))

    def apply(self, messages: list[dict], add_generation_prompt: bool = True) -> str:
        """The prompt text for ``messages`` (tokenize it with ``add_bos=True, special=True``)."""
        if self.builtin:
            return llama_chat_apply_template(self.source, messages, add_generation_prompt)
        out = render_jinja(self.source, messages, add_generation_prompt, self.bos_token, self.eos_token)
        if self.add_bos and self.bos_token and out.startswith(self.bos_token):
            out = out[len(self.bos_token):]
        return out

    def format_single(self, past: list[dict], new: dict, add_generation_prompt: bool = True) -> str:
        """``common_chat_format_single``: the text one more message adds to a conversation, i.e.
        the rendering with it minus the rendering without it (without llama-cli's newline fix-up,
        which depends on what its cache holds)."""
        before = self.apply(past, add_generation_prompt=False) if past else ""
        after = self.apply(list(past) + [new], add_generation_prompt)
        if not after.startswith(before):
            raise ChatTemplateError("this chat template rewrites earlier turns when a message is added; "
                                    "it cannot be rendered turn by turn")
        return after[len(before):]
