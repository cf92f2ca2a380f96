"""mkdocs hook: the reStructuredText roles of our docstrings, as plain code in the API reference.

The docstrings cross-reference with Sphinx roles (``:class:`~orchestrator.core.types.Group```,
``:meth:`plan_round```). The API pages render them as Markdown, which leaves the role's name in
front of the code span (``:class:<code>~orchestrator...</code>``). This hook drops the role and
the ``~`` (Sphinx's "show the last part only") and keeps the code span: the text a reader of the
source sees, without Sphinx's markup. It changes nothing else.
"""

from __future__ import annotations

import re

ROLE = re.compile(r":(?:class|meth|func|mod|attr|data|exc|obj|const|py:\w+):(<code>)~?([^<]*)</code>")


def strip_roles(html: str) -> str:
    """``:class:<code>~a.b.C</code>`` -> ``<code>C</code>``; ``:func:<code>a.f</code>`` -> ``<code>a.f</code>``."""

    def repl(m: re.Match) -> str:
        text = m.group(2)
        shown = text.rsplit(".", 1)[-1] if m.group(0).find("~") >= 0 else text
        return f"<code>{shown}</code>"

    return ROLE.sub(repl, html)


def on_page_content(html, page, config, files):  # noqa: ARG001 - mkdocs hook signature
    return strip_roles(html) if page.file.src_uri.startswith("reference/api/") else html
