"""``tokenize`` and ``detokenize``: text to token ids and back, like llama.cpp's llama-tokenize."""
from __future__ import annotations

import re
import sys

from .. import LLMLabError, config, models
from ._common import dumps

MAX_FILE_BYTES = 16 << 20   # tokenize --file: a bigger text is refused before it is read


def register(sub) -> None:
    p = sub.add_parser("tokenize", help="text to token ids with a model's tokenizer")
    p.add_argument("-m", "--model", default=models.DEFAULT_MODEL, help="registered model name or .gguf path")
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--text", help="the text to tokenize")
    src.add_argument("--file", help=f"read the text from this UTF-8 file (a regular file of at most {MAX_FILE_BYTES >> 20} MiB)")
    p.add_argument("--bos", action="store_true", help="add BOS where the model's add_bos_token asks for it")
    p.add_argument("--special", action="store_true", help="parse special tokens written in the text")
    p.add_argument("--json", action="store_true", help='print {"ids": [...]}')
    p.set_defaults(func=run_tokenize)
    p = sub.add_parser("detokenize", help="token ids back to text")
    p.add_argument("-m", "--model", default=models.DEFAULT_MODEL, help="registered model name or .gguf path")
    p.add_argument("ids", nargs="+", help="token ids (spaces, commas or a JSON list)")
    p.add_argument("--special", action="store_true", help="render control tokens such as <|im_start|>")
    p.set_defaults(func=run_detokenize)


def read_text(path: str, max_bytes: int = MAX_FILE_BYTES) -> str:
    from ..safeio import read_regular
    data = read_regular(path, max_bytes)      # never blocks on a FIFO, never reads an endless file
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise LLMLabError(f"{path} is not valid UTF-8: byte 0x{data[e.start]:02x} at offset {e.start} ({e.reason})") from None


def parse_ids(args: list[str]) -> list[int]:
    ids = []
    for word in re.split(r"[\s,\[\]]+", " ".join(args)):
        if not word:
            continue
        try:
            ids.append(config.parse_int(word))      # ASCII digits: int() would also take '١٢' and '1_0'
        except ValueError:
            raise LLMLabError(f"not a token id: {word!r}") from None
    return ids


def run_tokenize(args) -> int:
    from ..llama.vocab import Tokenizer
    text = args.text if args.text is not None else read_text(args.file)
    tok = Tokenizer.from_model(models.resolve(args.model))
    ids = tok.tokenize(text, add_bos=args.bos, special=args.special)
    if args.json:
        print(dumps({"ids": ids}))
        return 0
    for i in ids:
        piece = tok.token_to_piece(i, special=True)
        try:
            shown = repr(piece.decode("utf-8"))
        except UnicodeDecodeError:   # part of a character: show the bytes
            shown = repr(piece)
        print(f"{i:>7} -> {shown}")
    print(f"{len(ids)} tokens", file=sys.stderr)
    return 0


def run_detokenize(args) -> int:
    from ..llama.vocab import Tokenizer
    ids = parse_ids(args.ids)
    tok = Tokenizer.from_model(models.resolve(args.model))
    sys.stdout.write(tok.detokenize(ids, special=args.special) + "\n")
    return 0
