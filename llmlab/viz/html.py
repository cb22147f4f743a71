"""Minimal HTML helpers: notebooks show rich tables without pandas."""
from __future__ import annotations

import html as _html


class HTML:
    """Rendered by Jupyter through ``_repr_html_``; ``str()`` gives the markup."""

    def __init__(self, markup: str):
        self.markup = markup

    def _repr_html_(self) -> str:
        return self.markup

    def __str__(self) -> str:
        return self.markup


def table(header: list[str], rows: list[list], align_right: set[int] | None = None) -> HTML:
    esc = lambda x: _html.escape(str(x))
    head = "".join(f"<th style='text-align:left'>{esc(h)}</th>" for h in header)
    body = "".join("<tr>" + "".join(f"<td style='text-align:left;font-family:monospace'>{esc(c)}</td>" for c in r)
                   + "</tr>" for r in rows)
    return HTML(f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>")
