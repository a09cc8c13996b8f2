"""Self-contained HTML pages (the placement page, the profile report, the sweep page): one shell
for all, and the tick arithmetic their hand-drawn SVG axes share.

The shell records any script error on the root element (``data-js-error``) so that a
headless browser test can see it, and :func:`inert_json` keeps data inside a ``<script>``
from ending it early.
"""

from __future__ import annotations

import html
import json
import math
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


def nice_step(span: float, count: int = 6, integer: bool = False) -> float:
    """A tick spacing of 1, 2 or 5 times a power of ten giving about ``count`` intervals over
    ``span``: round numbers are what a reader can add up at a glance.  ``integer`` keeps it at
    1 or more (superstep indices, tile numbers)."""
    if span <= 0:
        return 1.0
    raw = span / max(count, 1)
    power = 10.0 ** math.floor(math.log10(raw))
    step = next(m * power for m in (1, 2, 5, 10) if m * power >= raw)
    return max(step, 1.0) if integer else step


def nice_ticks(low: float, high: float, count: int = 6, integer: bool = False) -> list[float]:
    """The multiples of :func:`nice_step` that lie in ``[low, high]``, increasing (for an
    axis whose ends are fixed by the data, such as a run's cycles)."""
    step = nice_step(high - low, count, integer)
    first = math.ceil(low / step - 1e-9)
    last = math.floor(high / step + 1e-9)
    return [round(i * step, 12) for i in range(first, last + 1)]


def nice_domain(low: float, high: float, count: int = 5) -> list[float]:
    """Ticks whose first and last enclose ``[low, high]`` (the axis runs from the first to the
    last), so every data point falls inside a labelled range; a single value gets a range
    around it rather than a zero-width axis."""
    if high <= low:
        pad = max(abs(low) * 0.1, 1.0)
        low, high = low - pad, high + pad
    step = nice_step(high - low, count)
    first = math.floor(low / step + 1e-9)
    last = math.ceil(high / step - 1e-9)
    return [round(i * step, 12) for i in range(first, last + 1)]


def tick_label(value: float, step: float = 1.0) -> str:
    """A tick's text: thin-space thousands (``30 000``) and as many decimals as the tick
    spacing ``step`` needs, so neighbouring ticks never read the same."""
    decimals = max(0, -math.floor(math.log10(step) + 1e-9)) if step > 0 else 0
    text = f"{value:,.{decimals}f}".replace(",", "\u2009")
    return "0" if text.strip("-0.\u2009") == "" else text
