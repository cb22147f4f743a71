"""Write llmlab/data/refs/<profile>/ from the profile's aarch64 llama.cpp under qemu (make oracle-arm64).

Same prompts (the ids of llmlab/data/refs/<stem>.logits.npz), same layout as llmlab/data/refs/avx2/: per
prompt the ids, the top 32 logits at every position, the whole last row and the greedy continuation (at
most 48 tokens, the end-of-generation token left out). Flash attention off, as llama-cpp-python runs.

    python tools/arm64/make_refs.py arm_dotprod_fp16 [smollm2 gemma3]
"""
from __future__ import annotations

import json
import sys

import numpy as np

from llmlab import data, models
from llmlab.ggml.cpu import profiles
from llmlab.llama.vocab.tokenizer import Tokenizer
from llmlab.llamacpp import arm64

REFS = data.ref_dir()                     # the package's references (llmlab/data/refs/)
STEMS = data.REF_STEMS
N_GREEDY, TOP, THREADS = 48, 32, 1


def main(argv: list[str]) -> int:
    prof = profiles.get(argv[0])
    out_dir = REFS / prof.name
    out_dir.mkdir(parents=True, exist_ok=True)
    for name in argv[1:] or list(STEMS):
        stem, path = STEMS[name], models.resolve(name)
        meta = json.loads((REFS / f"{stem}.logits.json").read_text())
        src = np.load(REFS / f"{stem}.logits.npz")
        tok = Tokenizer.from_model(path)
        npz, prompts, info = {}, [], ""
        for i, p in enumerate(meta["prompts"]):
            ids = src[f"p{i}_ids"].tolist()
            run = arm64.run(path, ids, prof, flash_attn=False, threads=THREADS, n_predict=N_GREEDY)
            info = run.system_info
            greedy = [t for t in run.greedy if t not in tok.vocab.eog]
            top = np.argsort(-run.prompt_logits, axis=1, kind="stable")[:, :TOP]
            npz.update({f"p{i}_ids": np.asarray(ids, np.int32), f"p{i}_top_ids": top.astype(np.int32),
                        f"p{i}_top_logits": np.take_along_axis(run.prompt_logits, top, 1).astype(np.float32),
                        f"p{i}_last_logits": run.prompt_logits[-1].astype(np.float32),
                        f"p{i}_greedy": np.asarray(greedy, np.int32)})
            prompts.append({"prompt": p["prompt"], "n_ids": len(ids), "greedy_text": tok.detokenize(greedy)})
            print(f"{name} p{i}: {len(ids)} ids, {len(greedy)} greedy", flush=True)
        np.savez_compressed(out_dir / f"{stem}.logits.npz", **npz)
        (out_dir / f"{stem}.logits.json").write_text(json.dumps(
            {"model": meta["model"], "llama_cpp_python": meta["llama_cpp_python"], "build": prof.build,
             "system_info": info, "qemu": "qemu-aarch64-static -cpu max", "n_threads": THREADS,
             "flash_attn": False, "note": meta["note"], "prompts": prompts}, ensure_ascii=False, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
