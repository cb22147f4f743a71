"""``chat``: an interactive conversation in the terminal with the model's chat template (like
``llama-cli``). The KV cache carries over between turns, so each turn decodes only what it adds.

``/exit`` or Ctrl-D ends the chat, ``/clear`` starts over; Ctrl-C stops the reply being
written, and at the prompt it ends the chat (status 130). Each turn's token counts and speed go
to stderr.
"""
from __future__ import annotations

import sys

from .. import LLMLabError
from ..safeio import printable
from ._common import parse_int
from .generate import add_engine_args, load_context, sampler_and_model


def register(sub) -> None:
    p = sub.add_parser("chat", help="chat with a model in the terminal (its chat template, the cache kept between turns)")
    p.add_argument("--system", default=None, help="system message")
    p.add_argument("-n", "--n-predict", type=parse_int, default=-1, help="tokens per reply at most; -1: until the model ends its turn")
    add_engine_args(p)
    p.set_defaults(func=run)


def _read(prompt: str) -> str | None:
    """A line from stdin; None at end of input. Bytes that are not UTF-8 come back as lone surrogates
    (stdin is read with ``surrogateescape``), so one bad line does not end the chat."""
    try:
        return input(prompt)
    except EOFError:
        return None


def _valid(line: str) -> bool:
    try:
        line.encode("utf-8")
        return True
    except UnicodeEncodeError as e:
        print(f"error: that line is not valid UTF-8 (byte {ord(line[e.start]) & 0xFF:#04x} at character {e.start}); "
              f"it was skipped", file=sys.stderr)
        return False


def _lost_servers(ctx) -> list[str]:
    """Endpoints of ``ctx``'s rpc-server devices whose connection closed (after a drop, a timeout or a lying reply)."""
    sched = getattr(ctx, "sched", None)
    return sorted({b.endpoint for b in getattr(sched, "backends", ())
                   if getattr(getattr(b, "conn", None), "sock", True) is None})


def run(args) -> int:
    from ..generate import ChatSession
    from ..llama.chat import ChatTemplate
    sampler, path, tok = sampler_and_model(args)
    template = ChatTemplate.from_model(path, tok)
    template.apply([{"role": "user", "content": "test"}])   # a broken or hostile template stops here
    ctx, cpu, warmup = load_context(args, path, 2048 if args.n_ctx is None else args.n_ctx)
    chat = ChatSession(ctx, tok, template, sampler, system=args.system)
    kind = f"llama.cpp's built-in {template.source!r}" if template.builtin else "the model's Jinja template"
    print(f"chat with {path.name} ({kind}, n_ctx {ctx.n_ctx}, cpu {cpu}); /exit or Ctrl-D to quit, "
          f"/clear to start over, Ctrl-C stops a reply", file=sys.stderr)
    if warmup is not None:
        print(warmup.summary(), file=sys.stderr)
    tty = sys.stdin.isatty()
    if hasattr(sys.stdin, "reconfigure"):
        sys.stdin.reconfigure(errors="surrogateescape")
    turn = 0
    while True:
        try:
            line = _read("> " if tty else "")
        except KeyboardInterrupt:       # at the prompt Ctrl-C ends the chat: "interrupted", status 130
            print(file=sys.stderr)
            raise
        if line is not None and not _valid(line):
            continue
        if line is None or line.strip() == "/exit":
            if line is None and tty:
                print(file=sys.stderr)
            return 0
        if line.strip() == "/clear":
            chat.clear()
            print("[conversation cleared]", file=sys.stderr)
            continue
        if not line.strip():
            continue
        turn += 1
        try:
            for _, text in chat.send(line, args.n_predict):
                sys.stdout.write(text)
                sys.stdout.flush()
        except KeyboardInterrupt:
            print("\n[reply stopped]", file=sys.stderr)
        except LLMLabError as e:
            lost = _lost_servers(ctx)
            if lost:              # the server's copy of the weights went with the connection: nothing to go on with
                sys.stdout.write("\n")
                raise LLMLabError(f"{e}; the connection to rpc-server {', '.join(lost)} is lost, so the chat ends "
                                  f"(start it again)") from None
            print(f"\nerror: {printable(e)} (/clear starts over)", file=sys.stderr)
            continue
        sys.stdout.write("\n")
        sys.stdout.flush()
        g = chat.last
        t = g.timings
        print(f"[turn {turn}: {len(g.prompt_ids)} prompt tokens decoded, {g.n_cached} reused from the cache; "
              f"{len(g.ids)} generated at {t.decode_tokens_per_s:.2f} tok/s; first token after {t.t_first:.2f} s; "
              f"cache holds {g.n_past}]", file=sys.stderr)
