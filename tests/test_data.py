"""llmlab.data: the files the notebooks read ship inside the package and are found through it."""
import numpy as np
import pytest

from llmlab import data
from llmlab.nb import CHECKOUT, ROOT


def test_package_data():
    notes = data.path("zh_inference_notes.txt").read_text(encoding="utf-8")
    assert sum("\u4e00" <= ch <= "\u9fff" for ch in notes) > 1000                  # Chinese prose
    assert data.ref_dir("avx2") == data.ref_dir() / "avx2"
    cases = data.ref_tokens("gemma3")
    assert cases and {"text", "ids", "ids_special", "ids_bos"} <= set(cases[0])
    for cpu in data.REF_DIRS:
        meta, logits = data.ref_logits("smollm2", cpu)
        assert logits["p0_ids"].tolist() == data.ref_logits("smollm2")[1]["p0_ids"].tolist()   # the same prompt ids
        assert meta["prompts"][0]["prompt"] and logits["p0_last_logits"].dtype == np.float32
    with pytest.raises(FileNotFoundError, match="not in llmlab's data"):
        data.path("refs", "no-such-file.json")


def test_the_package_data_is_declared_for_the_wheel():
    """pyproject.toml's package-data covers every file under llmlab/data (a wheel would miss the rest)."""
    import fnmatch
    import tomllib
    globs = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]["llmlab.data"]
    base = data.path()
    files = [p.relative_to(base).as_posix() for p in base.rglob("*") if p.is_file() and "__pycache__" not in p.parts]
    missing = [f for f in files if not f.endswith(".py") and not any(fnmatch.fnmatch(f, g) and f.count("/") == g.count("/")
                                                                    for g in globs)]
    assert files and not missing, f"not declared as package data in pyproject.toml: {missing}"


def test_checkout():
    assert CHECKOUT == ROOT and (CHECKOUT / "notebooks").is_dir()      # the tests run in a checkout
