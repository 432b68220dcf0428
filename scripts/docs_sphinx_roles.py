"""Sphinx roles in docstrings rendered as code in the docs site (a mkdocs hook, mkdocs.yml ``hooks:``).

The API reference and the design pages render docstrings with mkdocstrings (markdown); a Sphinx role left
in a docstring (``:func:`x```, ``:class:`~a.b.C```) would show as ``:func:`` before the name. This hook
writes each as the name in code (``~`` keeps the last component, as Sphinx shows it), so docstrings of
modules that still use roles render cleanly without being rewritten.
"""

from __future__ import annotations

import re

ROLE = re.compile(r":(?:py:)?(?:func|class|data|meth|mod|attr|obj|exc|const|ref):<code>(~?)([^<]*)</code>")


def rewrite(html: str) -> str:
    def one(m: re.Match) -> str:
        name = m.group(2).rsplit(".", 1)[-1] if m.group(1) else m.group(2)
        return f"<code>{name}</code>"

    return ROLE.sub(one, html)


def on_page_content(html, page, config, files, **kwargs):
    return rewrite(html)
