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

A chat template comes from a file anyone can edit, so it is untrusted code: it is rendered by
:mod:`llmlab.llama.template_sandbox` (jinja2's immutable sandbox with caps on numbers, sizes, nesting and
calls, in a spawned worker process killed at the time limit, on every OS), and any refusal, limit or
crash is one :class:`ChatTemplateError`.
"""
from __future__ import annotations

from dataclasses import dataclass

from .. import LLMLabError
from . import template_sandbox
from .template_sandbox import (MAX_CALL_DEPTH, MAX_EXTRA_MEMORY, MAX_INT_BITS, MAX_ITEMS, MAX_NESTING,  # noqa: F401
                               MAX_OUTPUT, MAX_SECONDS)


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


# ---- the sandboxed Jinja route (template_sandbox) ------------------------------------------------------

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
    try:
        return template_sandbox.render(source, context, max_seconds, max_output, max_extra_memory)
    except template_sandbox.TemplateRefused as e:
        raise ChatTemplateError(str(e)) from None


def _text(value, name: str) -> str:
    if not isinstance(value, str):
        raise ChatTemplateError(f"{name} must be a string, not {type(value).__name__}")
    return value


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
        """The template of a GGUF model (a path or an open ``GGUFFile``; ``llmlab.models.resolve`` gives a
        registered model's path); without ``tokenizer.chat_template`` the built-in its architecture's spec
        names (``ArchSpec.chat_template``: Gemma's for Gemma 3), else ChatML, llama.cpp's default."""
        from ..ggml.gguf import GGUFFile
        from .arch import ARCHS
        gguf = model if isinstance(model, GGUFFile) else GGUFFile(model)
        kv = gguf.kv
        source = kv.get("tokenizer.chat_template")
        if source is not None and not isinstance(source, str):
            raise ChatTemplateError(f"tokenizer.chat_template must be a string, not {type(source).__name__}")
        if source is None:
            spec = ARCHS.get(str(kv.get("general.architecture", "")))
            source = spec.chat_template if spec is not None else "chatml"
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
