"""``diff-llama-cpp``: run a prompt through llama.cpp and through llmlab, compare the graphs node by node."""
from __future__ import annotations

from .. import LLAMA_CPP_PYTHON, LLMLabError, config, models
from ._cpu import add_cpu_argument, resolve_cpu
from ._common import add_flash_attn, dumps, flash_attn, positive_int


def register(sub) -> None:
    p = sub.add_parser("diff-llama-cpp", help="compare llmlab's compute graph with llama.cpp's, node by node")
    p.add_argument("-m", "--model", required=True, help="registry name (smollm2, gemma3) or path to a .gguf")
    p.add_argument("-p", "--prompt", required=True, help="text; tokenized by llama.cpp with BOS and special tokens")
    add_flash_attn(p)
    p.add_argument("--layers", default=None, metavar="A:B", help="only nodes of layers A..B-1 (plus the layer-less ones)")
    p.add_argument("-t", "--threads", type=positive_int, default=1,
                   help="llama.cpp threads (default 1: the node-by-node run synchronizes its threads at every node)")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    add_cpu_argument(p)
    p.set_defaults(func=run)


def parse_layers(text: str | None) -> range | None:
    if text is None:
        return None
    a, sep, b = text.partition(":")
    try:
        lo = config.parse_int(a) if a else 0
        hi = config.parse_int(b) if b else 1 << 30
    except ValueError:
        raise ValueError(f"--layers must look like A:B (e.g. 0:4), not {text!r}") from None
    if not sep or lo < 0 or hi <= lo:
        raise ValueError(f"--layers must look like A:B with 0 <= A < B, not {text!r}")
    return range(lo, hi)


def run(args) -> int:
    from .. import llamacpp
    layers = parse_layers(args.layers)
    if not llamacpp.available():
        raise LLMLabError(f"diff-llama-cpp needs llama-cpp-python (pip install llama-cpp-python=={LLAMA_CPP_PYTHON})")
    path = models.resolve(args.model)
    cpu = resolve_cpu(args)
    flash = flash_attn(args)
    # llmlab tokenizes first: a prompt the vocabulary cannot hold (a missing byte token) is an error here,
    # where llama.cpp would abort the process (std::out_of_range)
    from ..llama.vocab import Tokenizer
    tok = Tokenizer.from_model(path)
    ours_ids = tok.tokenize(args.prompt, add_bos=True, special=True)
    if not ours_ids:
        raise ValueError("the prompt tokenizes to nothing")
    tokens = llamacpp.tokenize(path, args.prompt)
    if not tokens:
        raise ValueError("the prompt tokenizes to nothing")
    bad = [t for t in tokens if not 0 <= t < len(tok.vocab)]
    if bad:
        raise LLMLabError(f"llama.cpp tokenized the prompt to id {bad[0]}, outside the vocabulary of {len(tok.vocab)}")
    ours = llamacpp.llmlab_nodes(path, tokens, flash_attn=flash, cpu=cpu)
    cap = llamacpp.capture(path, tokens, flash_attn=flash, n_threads=args.threads)
    report = llamacpp.diff(ours, cap, layers=layers)
    from ..ggml.cpu import profiles
    here = "yes" if profiles.bit_identical_here(cpu) else "no"
    if args.json:
        same = sum(1 for n in report.nodes if n.max_abs_err == 0)
        print(dumps({**report.to_json(), "first_inexact": report.first_inexact, "nodes_bit_identical": same,
                     "cpu": cpu.name, "bit_identical_on_this_cpu": here == "yes"}, indent=1))
        return 0
    print(report.table())
    print(f"cpu profile: {cpu.name} ({cpu.title}); bit-identical on this CPU: {here}")
    print(report.summary())
    return 0
