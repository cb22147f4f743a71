"""One install hint per missing piece and operating system: what ``doctor`` prints, and what a figure
or a graph cell says when a font or Graphviz is missing. No imports of third-party packages or of llmlab
beyond its root (the oracle's version), so that every module can use it on a machine where little else is installed."""
from __future__ import annotations

import sys
from pathlib import Path

from . import LLAMA_CPP_PYTHON

# (distribution, minimum version as in pyproject.toml, conda-forge name, needed by): "core" always, "lab" for the notebooks
PACKAGES = (
    ("numpy", "1.26", "numpy", "core"),
    ("numba", "0.60", "numba", "core"),
    ("matplotlib", "3.8", "matplotlib", "core"),
    ("ipywidgets", "8.1", "ipywidgets", "lab"),
    ("graphviz", "0.20", "python-graphviz", "lab"),
    ("jupyterlab", "4.2", "jupyterlab", "lab"),
)

# one install hint per piece and system; "conda" when this Python is a conda environment
_HINTS = {
    "python": {"linux": "sudo apt-get install python3 python3-venv (Debian 12 / Ubuntu 23.04 or newer ship 3.11+)",
               "macos": "brew install python@3.12, or the python.org installer (macOS's own python3 is too old)",
               "windows": "winget install Python.Python.3.12, or the python.org installer",
               "conda": "conda create -n llmlab -c conda-forge python=3.12"},
    "dot": {"linux": "sudo apt-get install graphviz",
            "macos": "brew install graphviz",
            "windows": "winget install Graphviz.Graphviz (or choco install graphviz), then open a new terminal",
            "conda": "conda install -c conda-forge graphviz"},
    "fonts-cjk": {"linux": "sudo apt-get install fonts-noto-cjk",
                  "macos": "brew install --cask font-noto-sans-cjk-sc",
                  "windows": "install a CJK font for all users (Windows' Microsoft YaHei, or Noto Sans CJK SC: "
                             "right-click the .otf > Install for all users)"},
    "fonts-emoji": {"linux": "sudo apt-get install fonts-noto-color-emoji",
                    "macos": "macOS ships Apple Color Emoji: update macOS",
                    "windows": "Windows ships Segoe UI Emoji: update Windows"},
    "fonts-emoji-figures": {"linux": "sudo apt-get install fonts-symbola",
                            "macos": "install the Symbola font (outline emoji, which matplotlib can draw; "
                                     "Apple Color Emoji it cannot)",
                            "windows": "Segoe UI Emoji ships with Windows: update Windows"},
    "llama_cpp": {"any": f"python -m pip install llama-cpp-python=={LLAMA_CPP_PYTHON} (builds llama.cpp from source: "
                         "needs a C++ compiler and CMake; `make test` does it on Linux)"},
    "llama_cpp_amx": {"any": "rebuild it without AMX: python tools/oracle_build.py in a checkout (what `make test` "
                             "runs), or CMAKE_ARGS='-DGGML_NATIVE=OFF -DGGML_AVX512=ON -DGGML_AMX_TILE=OFF "
                             "-DGGML_AMX_INT8=OFF' python -m pip install --no-cache-dir --force-reinstall "
                             f"llama-cpp-python=={LLAMA_CPP_PYTHON}"},
    "threading_layer": {"linux": "sudo apt-get install libgomp1 (numba's omp layer; or python -m pip install tbb, then "
                                 "start Python with LD_LIBRARY_PATH=$VIRTUAL_ENV/lib: numba looks for libtbb by name)",
                        "macos": "brew install libomp (numba's omp layer loads it)",
                        "windows": "python -m pip install tbb",
                        "conda": "conda install -c conda-forge tbb (or llvm-openmp)"},
    "numba_cache": {"any": "set NUMBA_CACHE_DIR to a folder you can write (numba then caches its compiled "
                           "kernels there)"},
}


def system() -> str:
    """"linux", "macos", "windows" (or sys.platform for anything else)."""
    return {"darwin": "macos", "win32": "windows", "cygwin": "windows"}.get(sys.platform,
                                                                           "linux" if sys.platform.startswith("linux")
                                                                           else sys.platform)


def in_conda() -> bool:
    return (Path(sys.prefix) / "conda-meta").is_dir()


def hint(piece: str, os_name: str | None = None, conda: bool | None = None) -> str:
    """The one install hint for ``piece`` ("dot", "python", "fonts-cjk", "fonts-emoji", "fonts-emoji-figures", "llama_cpp",
    "numba_cache" or a package's distribution name) on this system (or ``os_name``)."""
    os_name = os_name or system()
    conda = in_conda() if conda is None else conda
    for dist, minimum, conda_name, _ in PACKAGES:
        if piece == dist:
            return (f"conda install -c conda-forge '{conda_name}>={minimum}'" if conda else
                    f'python -m pip install "{dist}>={minimum}"  (or: python -m pip install -e ".[lab]")')
    table = _HINTS[piece]
    if conda and "conda" in table:
        return table["conda"]
    return table.get(os_name) or table.get("any") or table.get("linux", "")
