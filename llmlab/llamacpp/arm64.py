"""llama.cpp built for aarch64, run under qemu-user: the oracle of the ARM CPU profiles on any machine.

``make oracle-arm64`` cross-compiles llama-cpp-python's vendored llama.cpp once per ARM feature level
(``tools/arm64/build_oracle.sh``, with ``GGML_CPU_ARM_ARCH`` = the profile's ``build``) and links
``llmlab-oracle`` (``tools/arm64/llmlab_oracle.cpp``) into a static binary. qemu-aarch64 emulates the
instructions exactly, so the binary computes what the same build computes on an ARM laptop: its logits
are the reference for ``--cpu <arm profile>``.

:func:`run` runs it (prompt in one batch, optionally the logits at every position, a greedy
continuation one token per decode, node values); :func:`llmlab_run` does the same with llmlab, so the
two compare value for value. The build decides the features, not qemu: ``-cpu max`` offers more than
any of these builds uses, and the ``system_info`` line of each run says what the build compiled in.
"""
from __future__ import annotations

import json
import shutil
import subprocess
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from .. import config
from ..ggml.cpu import profiles

QEMU = "qemu-aarch64-static"


def oracle_dir() -> Path:
    """Where ``make oracle-arm64`` keeps the builds (``LLMLAB_ARM64_ORACLE`` overrides)."""
    return config.arm64_oracle()


def oracle_binary(cpu) -> Path | None:
    """The static aarch64 llmlab-oracle built for the profile's feature level, or None if not built."""
    prof = profiles.resolve(cpu)
    if not prof.build:
        raise ValueError(f"the {prof.name} profile has no aarch64 build (not an ARM profile)")
    p = oracle_dir() / prof.build / "llmlab-oracle"
    return p if p.is_file() else None


def available(cpu) -> str | None:
    """None when the profile's oracle can run here, else why not (one line)."""
    if shutil.which(QEMU) is None:
        return f"{QEMU} is not installed (apt-get install qemu-user-static; make arm64-deps)"
    if oracle_binary(cpu) is None:
        return f"no aarch64 llama.cpp for {profiles.resolve(cpu).name} in {oracle_dir()} (make oracle-arm64)"
    return None


@dataclass
class OracleRun:
    """One run of llama.cpp (or of llmlab doing the same steps)."""
    system_info: str
    prompt_ids: list[int]
    greedy: list[int]                      # argmax after the prompt, then after each greedy token
    prompt_logits: np.ndarray              # (n_prompt or 1, n_vocab): every position with all_logits
    gen_logits: np.ndarray                 # (len(greedy) - 1, n_vocab): after each decoded greedy token
    nodes: list = field(default_factory=list)   # (name, ne, float32 values) in execution order

    @property
    def last_logits(self) -> np.ndarray:
        return self.prompt_logits[-1]


def read_nodes(path: str | Path) -> list[tuple[str, tuple[int, ...], np.ndarray]]:
    """OUT.nodes: per node, name length (u32), name, ne[4] (i64), then float32 values."""
    b = Path(path).read_bytes()
    out, i = [], 0
    while i < len(b):
        n = int.from_bytes(b[i:i + 4], "little")
        name = b[i + 4:i + 4 + n].decode("utf-8", "replace")
        i += 4 + n
        ne = tuple(int(v) for v in np.frombuffer(b, np.int64, 4, i))
        i += 32
        count = int(np.prod(ne))
        out.append((name, ne, np.frombuffer(b, np.float32, count, i).copy()))
        i += 4 * count
    return out


def run(model_path: str | Path, ids, cpu, flash_attn: bool = False, threads: int = 1, n_predict: int = 0,
        all_logits: bool = True, dump_nodes: bool = False, n_ctx: int = 512, timeout: float = 3600) -> OracleRun:
    """Run the profile's aarch64 llama.cpp under qemu on the token ids ``ids``."""
    why = available(cpu)
    if why:
        raise RuntimeError(why)
    ids = [int(t) for t in ids]
    with tempfile.TemporaryDirectory(prefix="llmlab-arm64-") as d:
        out = Path(d) / "o"
        cmd = [QEMU, "-cpu", "max", str(oracle_binary(cpu)), str(model_path), str(out),
               "--ids", ",".join(map(str, ids)), "-fa", "on" if flash_attn else "off", "-t", str(threads),
               "-c", str(n_ctx), "-n", str(n_predict)]
        cmd += ["--all-logits"] * all_logits + ["--dump-nodes"] * dump_nodes
        res = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
        if res.returncode != 0:
            raise RuntimeError(f"llmlab-oracle failed ({res.returncode}): {res.stderr.strip()[-500:]}")
        meta = json.loads(out.with_suffix(".json").read_text())
        rows = np.fromfile(out.with_suffix(".logits"), np.float32).reshape(-1, meta["n_vocab"])
        n_prompt = len(ids) if all_logits else 1
        nodes = read_nodes(out.with_suffix(".nodes")) if dump_nodes else []
    return OracleRun(meta["system_info"].strip(), meta["prompt_ids"], meta["greedy"], rows[:n_prompt],
                     rows[n_prompt:], nodes)


def llmlab_run(model, ids, cpu, flash_attn: bool = False, n_predict: int = 0, all_logits: bool = True,
               n_ctx: int = 512, kernels: str | None = None) -> OracleRun:
    """llmlab doing what :func:`run` makes llama.cpp do: the prompt in one batch, then greedy tokens one
    decode step each (``model``: a ``Model`` or a path)."""
    from ..generate import greedy
    from ..llama import Batch, Context, Model
    from ..llama.vocab.vocab import Vocab
    if not isinstance(model, Model):
        model = Model(model, cpu=cpu)
    eog = Vocab.from_gguf(model.gguf).eog
    kw = {} if kernels is None else {"kernels": kernels}
    ctx = Context(model, n_ctx=n_ctx, flash_attn=flash_attn, cpu=cpu, **kw)
    ids = [int(t) for t in ids]
    prompt = ctx.decode(Batch.from_tokens(ids, logits="all" if all_logits else "last"))
    taken, gen = [], []                                 # then llmlab's one greedy loop, from the first token
    if n_predict > 0:
        taken.append(int(np.argmax(prompt[-1])))        # the first of equal maxima, as the oracle's loop
        if n_predict > 1 and taken[-1] not in eog:
            for step in greedy(ctx, taken[-1:], n_past=len(ids)):
                gen.append(step.logits)
                taken.append(step.token)
                if len(taken) == n_predict or step.token in eog:
                    break
    return OracleRun(f"llmlab {profiles.resolve(cpu).name}", ids, taken, np.asarray(prompt),
                     np.asarray(gen).reshape(-1, prompt.shape[-1]))
