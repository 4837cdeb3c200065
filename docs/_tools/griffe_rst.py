"""Griffe extension for the API reference: the docstrings' reStructuredText habits as Markdown.

The package's docstrings are Google style with Sphinx cross-reference roles
(``:class:`~pkg.Name```) and, in a few module docstrings, reStructuredText simple tables
(rows between lines of ``=====``). mkdocstrings renders Markdown, in which the roles show
as stray text and the tables run together into one paragraph. Before griffe parses a
docstring this extension rewrites each role as a code span (the short name where the role
asked for it with ``~``) and fences each simple table as preformatted text, so that its
columns stay aligned. The docstrings themselves are left as they are.

Configured in ``mkdocs.yml`` (``plugins.mkdocstrings.handlers.python.options.extensions``).
"""

from __future__ import annotations

import re

import griffe

ROLE = re.compile(r":(?:py:)?(?:class|func|meth|mod|attr|data|exc|obj|const|ref|term):`(~?)([^`]+)`")
BORDER = re.compile(r"^\s*=+(\s+=+)+\s*$")


def _role(match: re.Match[str]) -> str:
    target = match.group(2)
    if "<" in target and target.endswith(">"):      # :meth:`text <target>`
        target = target[: target.index("<")].strip()
    elif match.group(1):                              # ~pkg.mod.Name -> Name
        target = target.rsplit(".", 1)[-1]
    return f"`{target}`"


def _fence_tables(text: str) -> str:
    """Fence every reStructuredText simple table (three border lines) as a text block."""
    lines = text.split("\n")
    out: list[str] = []
    i = 0
    while i < len(lines):
        if BORDER.match(lines[i]):
            borders = [j for j in range(i, len(lines)) if BORDER.match(lines[j])][:3]
            if len(borders) == 3:
                indent = lines[i][: len(lines[i]) - len(lines[i].lstrip())]
                end = borders[2]
                out += ["", f"{indent}```text", *lines[i:end + 1], f"{indent}```", ""]
                i = end + 1
                continue
        out.append(lines[i])
        i += 1
    return "\n".join(out)


class RstToMarkdown(griffe.Extension):
    """Rewrite Sphinx roles as code spans and fence simple tables, before parsing."""

    def on_object(self, *, obj: griffe.Object, **kwargs) -> None:
        if obj.docstring is not None:
            obj.docstring.value = _fence_tables(ROLE.sub(_role, obj.docstring.value))
