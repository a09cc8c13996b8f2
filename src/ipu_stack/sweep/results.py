"""A sweep's results: ``results.jsonl`` (one record a line, appended as points finish, so a
killed sweep keeps what it did), ``results.csv``, the summary table, the Pareto front and
``sweep.html`` (with its Pareto plot and its latency-throughput plot)."""

from __future__ import annotations

import csv
import html
import io
import json
import math
import os
from pathlib import Path
from typing import Any

from ipu_stack.util.errors import UsageError
from ipu_stack.util.files import NotRegularFile, open_regular, write_text_atomic
from ipu_stack.util.html import inert_json, nice_domain, standalone_page, tick_label

Record = dict[str, Any]
COLUMNS = ("status", "numericalTest", "cycles", "estimatedCycles", "peakTileBytes",
           "imagesPerSecond", "efficiencyPercent", "compileSeconds", "simulateSeconds",
           "error")


def read_results(path: Path) -> list[Record]:
    """The records of ``results.jsonl``; a line cut short by a kill is ignored, anything
    else unreadable is one line naming the file and line."""
    if not path.exists():
        return []
    records = []
    try:
        with open_regular(path) as handle:  # never a FIFO or device: refused unread
            lines = handle.read().splitlines()
    except NotRegularFile:
        raise UsageError(f"{path}: not a regular file") from None
    except OSError as exc:
        raise UsageError(f"{path}: cannot be read ({exc.strerror})") from None
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line.decode("utf-8"))
        except (json.JSONDecodeError, UnicodeDecodeError, RecursionError):
            if number == len(lines):  # the last line of a killed sweep
                continue
            raise UsageError(f"{path}:{number}: not a sweep record") from None
        if not isinstance(record, dict) or "key" not in record:
            raise UsageError(f"{path}:{number}: not a sweep record")
        records.append(record)
    return records


def drop_cut_line(path: Path) -> None:
    """Remove a last line a killed sweep left without its end: it was never a record, and a
    record appended after it would join it (and be lost with it)."""
    try:
        with open(path, "rb+") as handle:
            content = handle.read()
            if content and not content.endswith(b"\n"):
                handle.truncate(content.rfind(b"\n") + 1)
    except FileNotFoundError:
        return


def append_result(path: Path, record: Record) -> None:
    """One record as one line, flushed to disk before the next point is counted done."""
    drop_cut_line(path)
    with open(path, "a", encoding="utf-8") as handle:
        handle.write(json.dumps(record, sort_keys=True) + "\n")
        handle.flush()
        os.fsync(handle.fileno())


def table(records: list[Record]) -> tuple[list[str], list[list[Any]]]:
    """The summary table: the swept values, then the figures that compare points."""
    axes: list[str] = []
    for record in records:
        for name in record.get("point", {}):
            if name not in axes:
                axes.append(name)
    headers = ["key", *axes, *COLUMNS]
    rows = [[r["key"], *(r.get("point", {}).get(a) for a in axes),
             *(r.get(c) for c in COLUMNS)] for r in records]
    return headers, rows


def write_csv(path: Path, records: list[Record]) -> None:
    headers, rows = table(records)
    buffer = io.StringIO()
    writer = csv.writer(buffer)
    writer.writerow(headers)
    writer.writerows(rows)
    write_text_atomic(path, buffer.getvalue())


def format_table(records: list[Record]) -> str:
    headers, rows = table(records)
    cells = [headers] + [["" if v is None else str(v) for v in row] for row in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip()
                     for row in cells)


def pareto(records: list[Record], objective: str = "cycles") -> list[Record]:
    """Points that passed and that no other passing point beats on both ``objective`` (lower
    is better; ``imagesPerSecond``: higher) and peak tile bytes."""
    ok = [r for r in records if r.get("status") == "ok"]
    sign = -1 if objective == "imagesPerSecond" else 1

    def dominated(r: Record) -> bool:
        return any(sign * o[objective] <= sign * r[objective]
                   and o["peakTileBytes"] <= r["peakTileBytes"]
                   and (sign * o[objective] < sign * r[objective]
                        or o["peakTileBytes"] < r["peakTileBytes"]) for o in ok)

    return sorted((r for r in ok if not dominated(r)), key=lambda r: r["peakTileBytes"])


def best(records: list[Record]) -> dict[str, Record]:
    """The best passing point for each objective."""
    ok = [r for r in records if r.get("status") == "ok"]
    if not ok:
        return {}
    return {"fewest cycles": min(ok, key=lambda r: r["cycles"]),
            "most images per second": max(ok, key=lambda r: r["imagesPerSecond"]),
            "least peak tile memory": min(ok, key=lambda r: r["peakTileBytes"])}


STRATEGY_COLOURS = ("#36c", "#d62", "#393", "#939", "#c90", "#099", "#c36")
NO_STRATEGY = "(no strategy)"  # the legend entry of records without one, drawn grey


def _number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def latency_us(record: Record) -> float | None:
    """A record's latency in microseconds: ``latencyMicroseconds`` where the bench measured
    one, else the device time of the run (what a single request waits for)."""
    for name in ("latencyMicroseconds", "deviceMicroseconds"):
        value = record.get(name)
        if _number(value):
            return float(value)
    return None


def _colour(strategy: str | None, strategies: list[str]) -> str:
    if strategy is None or strategy == NO_STRATEGY:
        return "#888"
    return STRATEGY_COLOURS[strategies.index(strategy) % len(STRATEGY_COLOURS)]


def _strategy(record: Record) -> str | None:
    value = record.get("strategy", record.get("point", {}).get("strategy"))
    return None if value is None else str(value)


def latency_plot(records: list[Record], width: int = 640, height: int = 400) -> str:
    """Latency against throughput, one square per record (hover: its key), coloured by
    ``strategy`` where records carry one: the trade a deployment chooses along.  Records
    without ``imagesPerSecond`` or without any latency (failed points) are left out."""
    points = [(r, float(r["imagesPerSecond"]), latency_us(r)) for r in records
              if _number(r.get("imagesPerSecond")) and latency_us(r) is not None]
    strategies = sorted({s for r, _, _ in points if (s := _strategy(r)) is not None})
    if strategies and any(_strategy(r) is None for r, _, _ in points):
        strategies.append(NO_STRATEGY)
    legend_w = 150 if strategies else 0
    left, right, top, bottom = 80, 20 + legend_w, 20, 56
    plot_w, plot_h = width - left - right, height - top - bottom
    parts = [f'<rect class="frame" x="{left}" y="{top}" width="{plot_w}" height="{plot_h}" '
             'fill="none" stroke="#ccc"/>']
    if points:
        xt = nice_domain(min(p[1] for p in points), max(p[1] for p in points))
        yt = nice_domain(min(p[2] for p in points), max(p[2] for p in points))

        def sx(v: float) -> float:
            return left + plot_w * (v - xt[0]) / (xt[-1] - xt[0])

        def sy(v: float) -> float:
            return top + plot_h - plot_h * (v - yt[0]) / (yt[-1] - yt[0])

        base, xs, ys = top + plot_h, xt[1] - xt[0], yt[1] - yt[0]
        for v in xt:
            parts.append(f'<g class="tick x-tick" data-value="{v:.12g}"><line x1="{sx(v):.2f}" '
                         f'y1="{base}" x2="{sx(v):.2f}" y2="{base + 5}" stroke="#333"/><text '
                         f'x="{sx(v):.2f}" y="{base + 18}" text-anchor="middle">{tick_label(v, xs)}'
                         "</text></g>")
        for v in yt:
            parts.append(f'<g class="tick y-tick" data-value="{v:.12g}"><line x1="{left - 5}" '
                         f'y1="{sy(v):.2f}" x2="{left}" y2="{sy(v):.2f}" stroke="#333"/><text '
                         f'x="{left - 8}" y="{sy(v) + 4:.2f}" text-anchor="end">{tick_label(v, ys)}'
                         "</text></g>")
        for record, x, y in points:
            strategy = _strategy(record)
            colour = _colour(strategy, strategies)
            note = f", strategy {strategy}" if strategy is not None else ""
            parts.append(f'<g class="point" data-key="{html.escape(str(record["key"]))}" '
                         f'transform="translate({sx(x):.2f},{sy(y):.2f})"><rect x="-4" y="-4" '
                         f'width="8" height="8" fill="{colour}" '
                         f'fill-opacity="0.75"/><title>'
                         f"{html.escape(str(record['key']))}: {x:g} images/s, {y:g} us"
                         f"{html.escape(note)}</title></g>")
    for i, strategy in enumerate(strategies):
        y = top + 10 + 18 * i
        parts.append(f'<g class="legend-item" data-strategy="{html.escape(strategy)}"><rect '
                     f'x="{left + plot_w + 14}" y="{y - 9}" width="10" height="10" '
                     f'fill="{_colour(strategy, strategies)}"/><text '
                     f'x="{left + plot_w + 30}" y="{y}">{html.escape(strategy)}</text></g>')
    parts.append(f'<text class="axis-label x-label" x="{left + plot_w / 2}" y="{height - 8}" '
                 'text-anchor="middle">throughput (images per second)</text>')
    parts.append(f'<text class="axis-label y-label" transform="translate(16,{top + plot_h / 2}) '
                 'rotate(-90)" text-anchor="middle">latency (microseconds)</text>')
    return (f'<svg id="latency" xmlns="http://www.w3.org/2000/svg" width="{width}" '
            f'height="{height}" data-latency-points="{len(points)}">{"".join(parts)}</svg>')


def write_page(path: Path, records: list[Record], title: str) -> None:
    """``sweep.html``: the table, the Pareto front of cycles against peak tile bytes (SVG),
    latency against throughput (SVG) and the best point for each objective."""
    headers, rows = table(records)
    head = "".join(f"<th>{html.escape(h)}</th>" for h in headers)
    body_rows = "".join(
        f'<tr class="{html.escape(str(r[len(headers) - len(COLUMNS)]))}">'
        + "".join(f"<td>{html.escape('' if v is None else str(v))}</td>" for v in r) + "</tr>"
        for r in rows)
    front = pareto(records)
    data = {"points": [r for r in records if r.get("status") == "ok"],
            "front": [r["key"] for r in front]}
    best_rows = "".join(f"<li>{html.escape(k)}: {html.escape(r['key'])} "
                        f"{html.escape(json.dumps(r.get('point', {})))}</li>"
                        for k, r in best(records).items())
    body = (f"<h1>{html.escape(title)}</h1>"
            f"<p>{len(records)} points, {sum(r.get('status') == 'ok' for r in records)} passed"
            f"</p><h2>Best points</h2><ul id=\"best\">{best_rows}</ul>"
            "<h2>Cycles against peak tile bytes (Pareto front joined)</h2>"
            f'<svg id="pareto" width="640" height="360" data-front="{len(front)}"></svg>'
            "<h2>Latency against throughput</h2>" + latency_plot(records) +
            f'<h2>All points</h2><table id="points"><thead><tr>{head}</tr></thead>'
            f"<tbody>{body_rows}</tbody></table>"
            f'<script type="application/json" id="sweep-data">{inert_json(data)}</script>'
            f"<script>{_JS}</script>")
    write_text_atomic(path, standalone_page(title, _CSS, body))


_CSS = """
body { font: 14px sans-serif; margin: 16px; }
table { border-collapse: collapse; } td, th { border: 1px solid #ccc; padding: 2px 6px; }
tr.error td, tr.fail td { color: #a00; }
svg text { font: 12px sans-serif; }
"""

_JS = """
(function () {
  var data = JSON.parse(document.getElementById("sweep-data").textContent);
  var svg = document.getElementById("pareto"), ns = "http://www.w3.org/2000/svg";
  var pts = data.points, W = 640, H = 360, m = 40;
  if (!pts.length) { svg.setAttribute("data-rendered", "1"); return; }
  var xs = pts.map(function (p) { return p.peakTileBytes; });
  var ys = pts.map(function (p) { return p.cycles; });
  var x0 = Math.min.apply(null, xs), x1 = Math.max.apply(null, xs) || 1;
  var y0 = Math.min.apply(null, ys), y1 = Math.max.apply(null, ys) || 1;
  function sx(v) { return m + (W - 2 * m) * (x1 > x0 ? (v - x0) / (x1 - x0) : 0.5); }
  function sy(v) { return H - m - (H - 2 * m) * (y1 > y0 ? (v - y0) / (y1 - y0) : 0.5); }
  var front = [];
  pts.forEach(function (p) {
    var c = document.createElementNS(ns, "circle");
    var on = data.front.indexOf(p.key) >= 0;
    c.setAttribute("cx", sx(p.peakTileBytes)); c.setAttribute("cy", sy(p.cycles));
    c.setAttribute("r", on ? 6 : 4); c.setAttribute("fill", on ? "#d33" : "#36c");
    var t = document.createElementNS(ns, "title");
    t.textContent = p.key + ": " + p.cycles + " cycles, " + p.peakTileBytes + " bytes";
    c.appendChild(t); svg.appendChild(c);
    if (on) { front.push([sx(p.peakTileBytes), sy(p.cycles)]); }
  });
  front.sort(function (a, b) { return a[0] - b[0]; });
  if (front.length > 1) {
    var line = document.createElementNS(ns, "polyline");
    line.setAttribute("points", front.map(function (f) { return f.join(","); }).join(" "));
    line.setAttribute("fill", "none"); line.setAttribute("stroke", "#d33");
    svg.appendChild(line);
  }
  var label = document.createElementNS(ns, "text");
  label.setAttribute("x", m); label.setAttribute("y", H - 8);
  label.textContent = "peak tile bytes " + x0 + " .. " + x1 + "; cycles " + y0 + " .. " + y1;
  svg.appendChild(label);
  svg.setAttribute("data-points", String(pts.length));
  svg.setAttribute("data-rendered", "1");
})();
"""
