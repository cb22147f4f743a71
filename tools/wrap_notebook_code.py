"""Wrap the code cells of the notebooks' sources at 88 columns, mechanically and without changing the code.

    python tools/wrap_notebook_code.py notebooks/src/*.py

Only code cells with a line over 88 columns change: runs of comment lines are rewrapped, a trailing comment
too long for its line moves above it, and each statement still too long is formatted by ``ruff format
--range`` (that statement alone); a string literal still too long becomes two adjacent literals, cut
at a space outside an f-string's braces (Python joins them into the same string). What is left is listed
by ``tools/lint_notebooks.py`` for a hand. Check afterwards that the code is the same (the module's AST is)
and that a cell's last statement kept its ``;`` (ruff drops it; in a notebook it hides the cell's value).
Meant to run after merging other edits to the sources, so that a merge never meets a reformatted cell.
"""

from __future__ import annotations

import ast
import io
import re
import subprocess
import sys
import textwrap
import tokenize
from pathlib import Path
PY = sys.executable
LIM = 88

def comment_start(line):
    """column of a trailing comment, or None"""
    try:
        toks = list(tokenize.generate_tokens(io.StringIO(line + "\n").readline))
    except (tokenize.TokenError, IndentationError, SyntaxError):
        return None
    for t in toks:
        if t.type == tokenize.COMMENT:
            return t.start[1]
    return None

def wrap_comment(indent, text):
    return textwrap.wrap(text, width=LIM - len(indent) - 2, break_long_words=False, break_on_hyphens=False) or [""]

def merge_blocks(lines):
    """rewrap runs of standalone comment lines (same indent) that hold a line over LIM"""
    out, i = [], 0
    while i < len(lines):
        s = lines[i].lstrip()
        ind = lines[i][:len(lines[i]) - len(s)]
        if s.startswith("#") and not s.startswith("# %%"):
            j = i
            while j < len(lines):
                t = lines[j].lstrip()
                if not t.startswith("#") or lines[j][:len(lines[j]) - len(t)] != ind or t.startswith("# %%"):
                    break
                j += 1
            block = lines[i:j]
            if any(len(l) > LIM for l in block):
                text = " ".join(l.lstrip()[1:].strip() for l in block)
                out += [ind + "# " + w for w in wrap_comment(ind, text)]
            else:
                out += block
            i = j
        else:
            out.append(lines[i])
            i += 1
    return out

def fix_comments(lines):
    lines = merge_blocks(lines)
    out = []
    for line in lines:
        if len(line) <= LIM:
            out.append(line); continue
        s = line.lstrip()
        indent = line[:len(line) - len(s)]
        if s.startswith("#"):
            body = s[1:].lstrip()
            if body.startswith("%%"):
                out.append(line); continue
            out += [indent + "# " + w for w in wrap_comment(indent, body)]
            continue
        c = comment_start(line)
        if c is not None and c > len(indent):
            code = line[:c].rstrip()
            body = line[c + 1:].lstrip()
            out += [indent + "# " + w for w in wrap_comment(indent, body)]
            out.append(code)
            continue
        out.append(line)
    return out

def ruff_range(code, a, b):
    r = subprocess.run([PY, "-m", "ruff", "format", "--isolated", "--line-length", str(LIM), f"--range={a}:{b}",
                        "--stdin-filename", "cell.py", "-"], input=code, capture_output=True, text=True)
    return r.stdout if r.returncode == 0 else None

def fix_cell(lines):
    lines = fix_comments(lines)
    code = "\n".join(lines) + "\n"
    tried = set()
    while True:
        ls = code.split("\n")
        long = [i + 1 for i, l in enumerate(ls) if len(l) > LIM and (i + 1) not in tried]
        if not long:
            break
        n = long[0]
        tried.add(n)
        new = ruff_range(code, n, n)
        if new is None or new == code:
            continue
        tried = {t for t in tried if t < n}
        code = new
    return code.rstrip("\n").split("\n")

STRING_LINE = re.compile(r'^(\s*)([fF]?)(["\'])(.*)\3(\)?,?\)?,?)$')


def split_string_line(line):
    """A line that is one string literal (an argument, an element) as two adjacent literals, cut after a
    space outside any ``{...}`` of an f-string; Python joins them back into the same string. None when
    no cut is possible."""
    m = STRING_LINE.match(line)
    if not m or len(line) <= LIM:
        return None
    indent, prefix, quote, body, tail = m.groups()
    if quote in body.replace("\\" + quote, ""):      # a literal that holds its own quote: leave it
        return None
    start = len(indent) + len(prefix) + 1
    depth, cut, i = 0, None, 0
    while i < len(body):
        c = body[i]
        if prefix and c in "{}" and body[i:i + 2] in ("{{", "}}"):
            i += 2
            continue
        if c == "\\":
            i += 2
            continue
        depth += (c == "{") - (c == "}") if prefix else 0
        if c == " " and depth == 0 and start + i + 2 <= LIM and i + 1 < len(body):
            cut = i + 1
        i += 1
    if cut is None:
        return None
    first, rest = body[:cut], body[cut:]
    second_prefix = prefix if ("{" in rest or "}" in rest) else ""
    return [f"{indent}{prefix if ('{' in first or '}' in first) else ''}{quote}{first}{quote}",
            f"{indent}{second_prefix}{quote}{rest}{quote}{tail}"]


def split_strings(lines):
    out = []
    for line in lines:
        parts = [line]
        while len(parts[-1]) > LIM:
            two = split_string_line(parts[-1])
            if two is None:
                break
            parts[-1:] = two
        out += parts
    return out


def process(path):
    text = Path(path).read_text()
    lines = text.split("\n")
    cells, cur = [], []
    for l in lines:
        if l.startswith("# %%") and cur:
            cells.append(cur); cur = []
        cur.append(l)
    cells.append(cur)
    out = []
    for c in cells:
        head, body = c[0], c[1:]
        if not head.startswith("# %%") or "[markdown]" in head or not any(len(l) > LIM for l in body):
            out += c; continue
        # keep trailing blank lines of the cell
        k = len(body)
        while k and body[k - 1] == "":
            k -= 1
        fixed = split_strings(fix_cell(body[:k]))
        if body[k - 1].rstrip().endswith(";") and not fixed[-1].rstrip().endswith(";"):
            fixed[-1] += ";"          # ruff drops it; in a notebook it keeps the cell's value from showing
        out += [head] + fixed + body[k:]
    new = "\n".join(out)
    if ast.dump(ast.parse(text)) != ast.dump(ast.parse(new)):
        raise SystemExit(f"error: {path}: the wrapped code would differ; left unchanged")
    Path(path).write_text(new)

if __name__ == "__main__":
    for p in sys.argv[1:]:
        process(p)
