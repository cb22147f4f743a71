"""Small files that ship inside the package, so a notebook copied anywhere (Colab, a hub, a USB
stick) finds them with llmlab installed, never through a path into a checkout:

* ``refs/``: llama.cpp's reference outputs (token ids, logits, greedy continuations) for the two
  models, one folder per CPU profile (``refs/`` AVX-512, ``refs/avx2/``, ``refs/arm_dotprod_fp16/``,
  ``refs/arm_i8mm/``), see ``refs/README.md``;
* ``english_python_docs.txt``, ``zh_inference_notes.txt``: example texts (see ``README.md``).

    from llmlab import data
    data.path("zh_inference_notes.txt").read_text(encoding="utf-8")
    meta, logits = data.ref_logits("smollm2")
"""
from __future__ import annotations

import json
from importlib.resources import files
from pathlib import Path

# the models the references were recorded from (llmlab.models' names) -> file stem in refs/
REF_STEMS = {"smollm2": "smollm2-135m-instruct-q4_1", "gemma3": "gemma-3-270m-q4_k_m"}
# the references of llama.cpp built for each CPU profile (llmlab.ggml.cpu.profiles' names)
REF_DIRS = {"avx512": "refs", "avx2": "refs/avx2",
            "arm_dotprod_fp16": "refs/arm_dotprod_fp16", "arm_i8mm": "refs/arm_i8mm"}   # (ARM: the aarch64 build under qemu-user)


def path(*parts: str) -> Path:
    """The file ``parts`` of the package's data (an ordinary file: llmlab is never installed zipped)."""
    p = Path(str(files(__name__).joinpath(*parts)))
    if not p.exists():
        raise FileNotFoundError(f"{'/'.join(parts)}: not in llmlab's data ({p.parent})")
    return p


def ref_dir(cpu: str = "avx512") -> Path:
    """The folder of llama.cpp's references recorded on a CPU of profile ``cpu``."""
    return path(*REF_DIRS[cpu].split("/"))


def ref_tokens(model: str) -> list[dict]:
    """llama.cpp's tokenizations for ``model`` (``smollm2``, ``gemma3``): ``{text, ids, ids_special, ids_bos}`` each."""
    return json.loads((ref_dir() / f"{REF_STEMS[model]}.tokens.json").read_text(encoding="utf-8"))["cases"]


def ref_logits(model: str, cpu: str = "avx512"):
    """llama.cpp's prompts and greedy texts (a dict) and its logits (``numpy.load`` of the ``.npz``)
    for ``model``, from the references of ``cpu``."""
    import numpy as np
    d = ref_dir(cpu)
    stem = REF_STEMS[model]
    return json.loads((d / f"{stem}.logits.json").read_text(encoding="utf-8")), np.load(d / f"{stem}.logits.npz")
