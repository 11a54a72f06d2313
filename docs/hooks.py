"""MkDocs hook: reference tables rendered from the code, so the docs cannot drift from it."""

from __future__ import annotations

import re
from typing import Any


def _variables() -> str:
    from aligner.variables import VARIABLES

    out: list[str] = []
    for group in dict.fromkeys(v.group for v in VARIABLES):
        out += [f"## {group}", "", "| Variable | Default | What |", "|---|---|---|"]
        out += [f"| `{v.name}` | {f'`{v.default}`' if v.default else ''} | {v.what} |" for v in VARIABLES
                if v.group == group]
        out.append("")
    return "\n".join(out)


def _layout() -> str:
    from aligner.layout import NODES

    rows = ["| Path (under the root) | who | perms | What |", "|---|---|---|---|"]
    rows += [f"| `{n.pattern or '/'}` | {n.who} | {f'`{n.perms}`' if n.perms else ''} | {n.what} |" for n in NODES]
    return "\n".join(rows)


def on_page_markdown(markdown: str, **_: Any) -> str:
    if "<!-- aligner:variables -->" in markdown:
        markdown = markdown.replace("<!-- aligner:variables -->", _variables())
    if "<!-- aligner:layout -->" in markdown:
        markdown = markdown.replace("<!-- aligner:layout -->", _layout())
    return markdown



_USAGE_REF = re.compile(r'<autoref [^>]*identifier="([^"]+)"[^>]*>OPTIONS</autoref>')


def on_page_content(html: str, page: Any, **_: Any) -> str:
    """A usage line ``[OPTIONS] [ARG]`` reads as a Markdown reference link; put the text back."""
    if page.file.src_uri == "reference/cli.md":
        html = _USAGE_REF.sub(lambda m: f"[OPTIONS] [{m.group(1)}]", html)
    return html
