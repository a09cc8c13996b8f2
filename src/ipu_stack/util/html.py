"""Self-contained HTML pages (the placement page, the profile report): one shell for both.

The shell records any script error on the root element (``data-js-error``) so that a
headless browser test can see it, and :func:`inert_json` keeps data inside a ``<script>``
from ending it early.
"""

from __future__ import annotations

import html
import json
from typing import Any

_SHELL = """<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<title>@TITLE@</title>
<style>@CSS@</style>
<script>
window.addEventListener("error", function (e) {
  document.documentElement.setAttribute("data-js-error", String(e.message));
});
</script>
</head>
<body>
@BODY@
</body>
</html>
"""


def inert_json(data: Any) -> str:
    """JSON that cannot close the ``<script>`` element holding it (no ``<``, ``>``, ``&``)."""
    text = json.dumps(data, separators=(",", ":"))
    return text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")


def standalone_page(title: str, css: str, body: str) -> str:
    """The page: ``body`` is trusted HTML (its own escaping done), ``title`` is text."""
    return (_SHELL.replace("@TITLE@", html.escape(title)).replace("@CSS@", css)
            .replace("@BODY@", body))
