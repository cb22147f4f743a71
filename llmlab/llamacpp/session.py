"""llama.cpp's model, context and batch, owned in one place (llama-cpp-python's low-level C API).

Everything llmlab asks of the live llama.cpp goes through :class:`Session`: load a model
(``llama_model_load_from_file``), make a context with explicit parameters (``llama_init_from_model``;
flash attention is always set, since llama.cpp's own default is "auto"), fill a ``llama_batch``,
``llama_decode``, stack the logits rows (``llama_get_logits_ith``), run the ``llama_memory_seq_*``
operations, watch the graph through an evaluation callback, and free batch, context and model in
that order. llama.cpp's log lines go into a list (:func:`logs`), not to stderr, so that errors can
quote them.

These calls run inside the process that makes them. llmlab's own callers reach them through
:mod:`llmlab.llamacpp.worker`, which runs them in a child process, so that a crash of llama.cpp
(SIGILL on some CPUs) becomes one Python exception.
"""
from __future__ import annotations

import ctypes
from pathlib import Path
from typing import Callable, Iterable, Sequence

import numpy as np

from .. import LLMLabError
from ._lib import llama_cpp

FLASH_ATTN = {"on": 1, "off": 0, "auto": -1, True: 1, False: 0}


class _Logs:
    """llama.cpp's log lines, collected in a list for the life of the process."""

    def __init__(self, lc):
        self.lines: list[str] = []
        self.cb = lc.llama_log_callback(self._on)     # kept: llama.cpp holds the pointer
        lc.llama_log_set(self.cb, ctypes.c_void_p())

    def _on(self, level, text, user):
        try:
            self.lines.append(text.decode(errors="replace"))
        except Exception:   # never let an exception cross into C
            pass

    def since(self, n0: int, tail: int | None = None) -> str:
        text = "".join(self.lines[n0:])
        return text if tail is None else text[-tail:]


_LOGS: _Logs | None = None


def logs() -> _Logs:
    """The log collector, installed (with ``llama_backend_init``) on first use."""
    global _LOGS
    if _LOGS is None:
        lc = llama_cpp()
        _LOGS = _Logs(lc)
        lc.llama_backend_init()
    return _LOGS


def flash_attn_type(flash_attn) -> int:
    fa = FLASH_ATTN.get(flash_attn)
    if fa is None:
        raise ValueError(f"flash_attn must be on, off or auto, not {flash_attn!r}")
    return fa


class Session:
    """One llama.cpp model and one context on it; a context manager that frees both.

    ``n_ubatch`` defaults to ``n_batch``; ``flash_attn``: on/off/auto (True/False); ``n_batch``,
    ``n_threads`` (None), ``swa_full``, ``kv_unified``: llama.cpp's defaults unless given. ``cb_eval``: an
    evaluation callback ``(tensor address, ask, user) -> bool`` (see :mod:`.eval_callback`); it is kept
    alive as long as the context.
    """

    def __init__(self, model_path: str | Path, n_ctx: int = 512, n_batch: int | None = None,
                 n_ubatch: int | None = None, n_seq_max: int = 1, n_threads: int | None = 1,
                 n_threads_batch: int | None = None, flash_attn=False, type_k: str = "f16",
                 type_v: str | None = None, swa_full: bool | None = None, kv_unified: bool | None = None,
                 cb_eval: Callable | None = None, no_perf: bool = True):
        from ..ggml.types import ggml_type
        self.model = self.ctx = None
        self.path = Path(model_path)
        if not self.path.is_file():
            raise LLMLabError(f"model file not found: {self.path}")
        fa = flash_attn_type(flash_attn)
        tk, tv = ggml_type(type_k), ggml_type(type_v or type_k)
        lc = self.lc = llama_cpp()
        self.logs = logs()
        self.log0 = len(self.logs.lines)
        self.model = lc.llama_model_load_from_file(str(self.path).encode(), lc.llama_model_default_params())
        if not self.model:
            raise LLMLabError(f"llama.cpp could not load {self.path}: {self.log(500)}")
        self.log_ctx = len(self.logs.lines)               # where the context's own log lines begin
        cp = lc.llama_context_default_params()
        cp.n_ctx = n_ctx
        if n_batch is not None:
            cp.n_batch = n_batch
        cp.n_ubatch = min(n_ubatch or cp.n_batch, cp.n_batch)
        cp.n_seq_max = n_seq_max
        if n_threads is not None:
            cp.n_threads = n_threads
            cp.n_threads_batch = n_threads_batch or n_threads
        cp.flash_attn_type = fa
        cp.type_k, cp.type_v = tk.id, tv.id
        if swa_full is not None:
            cp.swa_full = swa_full
        if kv_unified is not None:
            cp.kv_unified = kv_unified
        self._cb = None
        if cb_eval is not None:
            self._cb = lc.ggml_backend_sched_eval_callback(cb_eval)   # kept alive with the context
            cp.cb_eval = self._cb
            cp.cb_eval_user_data = None
        cp.no_perf = no_perf
        self.params = dict(n_ctx=cp.n_ctx, n_batch=cp.n_batch, n_ubatch=cp.n_ubatch, n_threads=cp.n_threads,
                           flash_attn=bool(fa), type_k=tk.name, type_v=tv.name, swa_full=bool(cp.swa_full),
                           kv_unified=bool(cp.kv_unified))
        self.ctx = lc.llama_init_from_model(self.model, cp)
        if not self.ctx:
            self.close()
            raise LLMLabError(f"llama.cpp could not create a context: {self.log(500)}")
        self.mem = lc.llama_get_memory(self.ctx)
        self.n_vocab = lc.llama_vocab_n_tokens(lc.llama_model_get_vocab(self.model))

    def log(self, tail: int | None = None) -> str:
        """llama.cpp's log lines since this session began (the last ``tail`` characters)."""
        return self.logs.since(self.log0, tail)

    @property
    def n_ctx(self) -> int:
        """The context size llama.cpp settled on (``n_ctx`` padded to 256)."""
        return self.lc.llama_n_ctx(self.ctx)

    def decode(self, tokens: Sequence[int], pos0: int = 0, seq_id: int = 0, logits="all",
               seq_ids: Sequence[Sequence[int]] | None = None, pos: Sequence[int] | None = None) -> int:
        """``llama_decode`` of one batch; returns its status (0: done, 1: no room in the KV cache, < 0: error).

        Token ``i`` sits at ``pos0 + i`` (or ``pos[i]``) in sequence ``seq_id`` (or the sequences
        ``seq_ids[i]``). ``logits``: ``"all"``, ``"last"``, ``"none"`` or one flag per token.
        """
        lc = self.lc
        toks = [int(t) for t in tokens]
        n = len(toks)
        if isinstance(logits, str):
            flags = {"all": [True] * n, "last": [i == n - 1 for i in range(n)], "none": [False] * n}[logits]
        else:
            flags = [bool(x) for x in logits]
        seqs = [[seq_id]] * n if seq_ids is None else [list(s) for s in seq_ids]
        positions = [pos0 + i for i in range(n)] if pos is None else [int(p) for p in pos]
        batch = lc.llama_batch_init(max(n, 1), 0, max([len(s) for s in seqs] + [1]))
        try:
            for i, tok in enumerate(toks):
                batch.token[i], batch.pos[i], batch.logits[i] = tok, positions[i], flags[i]
                batch.n_seq_id[i] = len(seqs[i])
                for j, s in enumerate(seqs[i]):
                    batch.seq_id[i][j] = s
            batch.n_tokens = n
            return lc.llama_decode(self.ctx, batch)
        finally:
            lc.llama_batch_free(batch)

    def logits(self, rows: Iterable[int]) -> np.ndarray:
        """The logits of the given output rows of the last decode, stacked: ``(len(rows), n_vocab)`` float32."""
        return np.stack([np.ctypeslib.as_array(self.lc.llama_get_logits_ith(self.ctx, int(i)),
                                               shape=(self.n_vocab,)).copy() for i in rows])

    # the llama_memory_seq_* operations and queries
    def seq_rm(self, seq_id: int, p0: int, p1: int) -> bool:
        return bool(self.lc.llama_memory_seq_rm(self.mem, seq_id, p0, p1))

    def seq_cp(self, seq_src: int, seq_dst: int, p0: int, p1: int) -> None:
        self.lc.llama_memory_seq_cp(self.mem, seq_src, seq_dst, p0, p1)

    def seq_keep(self, seq_id: int) -> None:
        self.lc.llama_memory_seq_keep(self.mem, seq_id)

    def seq_add(self, seq_id: int, p0: int, p1: int, delta: int) -> None:
        self.lc.llama_memory_seq_add(self.mem, seq_id, p0, p1, delta)

    def seq_div(self, seq_id: int, p0: int, p1: int, d: int) -> None:
        self.lc.llama_memory_seq_div(self.mem, seq_id, p0, p1, d)

    def pos_range(self, seq_id: int) -> tuple[int, int]:
        """``(llama_memory_seq_pos_min, llama_memory_seq_pos_max)`` of one sequence."""
        return (int(self.lc.llama_memory_seq_pos_min(self.mem, seq_id)),
                int(self.lc.llama_memory_seq_pos_max(self.mem, seq_id)))

    def eval_chunks(self, tokens: Sequence[int], chunks: Sequence[int]) -> np.ndarray:
        """Empty the memory, decode ``tokens`` in ``chunks`` (one ``llama_decode`` each, every logit kept)
        and return the logits of every position."""
        self.seq_rm(-1, -1, -1)
        out, i = [], 0
        for c in chunks:
            if self.decode(tokens[i:i + c], pos0=i, logits="all") != 0:
                raise LLMLabError(f"llama_decode failed: {self.log(500)}")
            out.append(self.logits(range(c)))
            i += c
        return np.concatenate(out)

    def close(self) -> None:
        """Free the context, then the model (the batches are freed after each decode)."""
        if self.ctx:
            self.lc.llama_free(self.ctx)
            self.ctx = None
        if self.model:
            self.lc.llama_model_free(self.model)
            self.model = None

    def __enter__(self) -> "Session":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass


# ---- the vocabulary alone --------------------------------------------------------------------------------------
_VOCABS: dict[str, object] = {}


def vocab(path: str | Path):
    """The ``llama_vocab`` of a vocabulary-only model, loaded once per file and process (a few MB, kept)."""
    lc = llama_cpp()
    key = str(Path(path).resolve())
    if key not in _VOCABS:
        logs()
        mp = lc.llama_model_default_params()
        mp.vocab_only = True
        model = lc.llama_model_load_from_file(key.encode(), mp)
        if not model:
            raise LLMLabError(f"llama.cpp could not load {key}")
        _VOCABS[key] = model
    return lc.llama_model_get_vocab(_VOCABS[key])


def tokenize(model_path: str | Path, text: str | bytes | list, add_special: bool = True,
             parse_special: bool = True) -> list[int] | list[list[int]]:
    """``llama_tokenize`` of a text (str or UTF-8 bytes), or of each text of a list."""
    lc = llama_cpp()
    voc = vocab(model_path)
    out = []
    for t in ([text] if isinstance(text, (str, bytes)) else text):
        raw = t.encode() if isinstance(t, str) else bytes(t)
        cap = len(raw) + 8
        buf = (lc.llama_token * cap)()
        n = lc.llama_tokenize(voc, raw, len(raw), buf, cap, add_special, parse_special)
        if n < 0:                      # the buffer was too small: -n is the size needed
            buf = (lc.llama_token * -n)()
            n = lc.llama_tokenize(voc, raw, len(raw), buf, -n, add_special, parse_special)
        if n < 0:
            raise LLMLabError(f"llama_tokenize failed ({n})")
        out.append(list(buf[:n]))
    return out[0] if isinstance(text, (str, bytes)) else out


def tokenize_timed(model_path: str | Path, text: str | bytes, repeat: int = 3, add_special: bool = False,
                   parse_special: bool = False) -> tuple[list[int], float]:
    """:func:`tokenize` ``repeat`` times, timed where it runs: the ids and the best time in seconds."""
    import time
    vocab(model_path)                  # loaded before the clock starts
    best, ids = float("inf"), []
    for _ in range(max(1, repeat)):
        t = time.perf_counter()
        ids = tokenize(model_path, text, add_special, parse_special)
        best = min(best, time.perf_counter() - t)
    return ids, best


def detokenize(model_path: str | Path, ids: Sequence[int], special: bool) -> bytes:
    """``llama_detokenize`` itself (no leading-space removal): the bytes of the ids."""
    lc = llama_cpp()
    voc = vocab(model_path)
    arr = (lc.llama_token * max(1, len(ids)))(*[int(i) for i in ids])
    size = 64 + 64 * len(ids)
    buf = ctypes.create_string_buffer(size)
    n = lc.llama_detokenize(voc, arr, len(ids), buf, size, False, special)
    if n < 0:
        raise LLMLabError(f"llama_detokenize failed ({n})")
    return buf.raw[:n]


def token_pieces(model_path: str | Path, special: bool) -> list[bytes]:
    """``llama_token_to_piece`` of every token id, in order."""
    lc = llama_cpp()
    voc = vocab(model_path)
    buf = ctypes.create_string_buffer(512)
    out = []
    for i in range(lc.llama_vocab_n_tokens(voc)):
        n = lc.llama_token_to_piece(voc, i, buf, 512, 0, special)
        out.append(buf.raw[:n])
    return out


def quantize_model(src: str | Path, dst: str | Path, ftype: int, n_threads: int = 2) -> None:
    """llama.cpp's quantizer (``llama_model_quantize``, as its llama-quantize tool calls it) from ``src`` to
    ``dst`` as file type ``ftype`` (a ``LLAMA_FTYPE_*`` number), requantizing allowed."""
    lc = llama_cpp()
    n0 = len(logs().lines)
    p = lc.llama_model_quantize_default_params()
    p.ftype = int(ftype)
    p.allow_requantize = True
    p.nthread = n_threads
    if lc.llama_model_quantize(str(src).encode(), str(dst).encode(), ctypes.byref(p)) != 0:
        raise LLMLabError(f"llama.cpp could not quantize {src}: {logs().since(n0, 500)}")
