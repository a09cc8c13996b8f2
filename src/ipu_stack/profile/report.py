"""``report.html``: one self-contained page (inline CSS, SVG and JS; works offline).

It shows the summary (cycles split into compute, exchange, sync, host and waiting; the
efficiency; what limits the run), a chart of the supersteps on a cycles (and microseconds)
axis (SVG, drawn here), a tiles x supersteps utilisation heat map binned to a readable size
(a canvas the page's script paints from the inline data, under an SVG of its axes and colour
scale), the kernels ranked by their share of the critical path, the exchange phases against
their lower bounds, and a link to the placement page.  docs/profile.md describes the plots.
"""

from __future__ import annotations

import base64
import html
import math
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ipu_stack.profile.record import Profile, Step
from ipu_stack.profile.summary import summary
from ipu_stack.util.files import write_text_atomic
from ipu_stack.util.html import inert_json, nice_ticks, standalone_page, tick_label

COLOURS = {"compute": "#3b7dd8", "exchange": "#e08a2c", "sync": "#999999"}
CHART_WIDTH, CHART_LEFT, CHART_RIGHT = 1200, 80, 20  # the chart and the heat map line up
CHAR_PX = 6.6  # a character's width at the chart's 11px label font, for fitting labels
HEAT_FULL = "#08306b"  # a fully busy cell; an idle one is white (the script interpolates)


def _table(headers: list[str], rows: list[list[object]], ident: str) -> str:
    head = "".join(f"<th>{html.escape(h)}</th>" for h in headers)
    body = "".join("<tr>" + "".join(f"<td>{html.escape(str(c))}</td>" for c in row) + "</tr>"
                   for row in rows)
    return f'<table id="{ident}"><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>'


def _bar_title(step: Step, number: int, clock_hz: float) -> str:
    us = f" ({step.cycles / clock_hz * 1e6:.3f} us)" if clock_hz > 0 else ""
    return (f"superstep {number}: {html.escape(step.label)} ({html.escape(step.name)}), "
            f"{step.kind}, {step.cycles} cycles{us}; after {step.sync} cycles of sync")


def _bar_label(text: str, x: float, y: float, width: float) -> str:
    """The bar's model part written inside it when it is wide enough for a few letters:
    whole, else without its ``layer N`` (the neighbours say it), else (groups side by
    side) the first group's, else cut short (``CHAR_PX`` a character at the label's font)."""
    fits = int(width // CHAR_PX)
    if fits < 4:
        return ""
    short = re.sub(r"(^| \| )layer \d+ ", r"\1", text)
    first = short.split(" | ")[0]  # of groups side by side, the first one's part
    shown = next((form for form in (text, short, first) if len(form) <= fits),
                 first[:fits - 1] + "\u2026")
    return (f'<text class="bar-label" x="{x + 2:.2f}" y="{y:.1f}" fill="#fff">'
            f"{html.escape(shown)}</text>")


def superstep_chart(profile: Profile, width: int = CHART_WIDTH, height: int = 190) -> str:
    """Each superstep as a bar as wide as its share of the run (its sync after it in grey),
    compute and exchange in two lanes so that neither hides the other, on an x axis of
    cycles from the run's start with the same ticks in microseconds at the profile's clock
    (what a reader compares against a wall clock); a bar wide enough carries its model
    part's name, and hovering any bar names it with its superstep number."""
    left, right, top, bottom = CHART_LEFT, CHART_RIGHT, 28, 56
    plot_w, plot_h = width - left - right, height - top - bottom
    lane_h = plot_h / 2
    lanes = {"compute": top, "exchange": top + lane_h}
    total = max(profile.cycles, 1)
    numbers = profile.superstep_numbers()

    def x_of(cycles: float) -> float:
        return left + plot_w * cycles / total

    parts = [f'<rect class="frame" x="{left}" y="{top}" width="{plot_w}" height="{plot_h}" '
             'fill="none" stroke="#ccc"/>']
    for step in profile.supersteps:
        y, h = lanes[step.kind] + 3, lane_h - 6
        bar_w = max(plot_w * step.cycles / total, 0.5)
        parts.append(f'<rect class="bar" data-number="{numbers[id(step)]}" '
                     f'x="{x_of(step.start):.2f}" y="{y:.1f}" width="{bar_w:.2f}" '
                     f'height="{h:.1f}" fill="{COLOURS[step.kind]}"><title>'
                     f"{_bar_title(step, numbers[id(step)], profile.clock_hz)}</title></rect>")
        parts.append(_bar_label(step.label, x_of(step.start), y + h / 2 + 4, bar_w))
        parts.append(f'<rect class="sync" x="{x_of(step.begin):.2f}" y="{y:.1f}" '
                     f'width="{max(plot_w * step.sync / total, 0.2):.2f}" height="{h:.1f}" '
                     f'fill="{COLOURS["sync"]}"><title>the sync before superstep '
                     f"{numbers[id(step)]}: {step.sync} cycles</title></rect>")
    parts += _cycle_axis(profile, left, plot_w, top + plot_h, height - 6, x_of)
    for kind, y in lanes.items():
        parts.append(f'<text class="lane-label" x="{left - 6}" y="{y + lane_h / 2 + 4:.1f}" '
                     f'text-anchor="end">{kind}</text>')
    parts.append(f'<text class="axis-label y-label" transform="translate(14,{top + plot_h / 2}) '
                 'rotate(-90)" text-anchor="middle">superstep kind</text>')
    for i, (kind, colour) in enumerate(COLOURS.items()):
        x = left + 110 * i
        parts.append(f'<g class="legend-item" data-kind="{kind}"><rect x="{x}" y="6" width="12" '
                     f'height="12" fill="{colour}"/><text x="{x + 17}" y="16">{kind}</text></g>')
    return (f'<svg id="superstep-chart" xmlns="http://www.w3.org/2000/svg" width="{width}" '
            f'height="{height}" data-bars="{len(profile.supersteps)}">{"".join(parts)}</svg>')


def _cycle_axis(profile: Profile, left: float, plot_w: float, axis_y: float, label_y: float,
                x_of: Callable[[float], float], cls: str = "tick") -> list[str]:
    """Ticks in cycles from the run's start, microseconds under them in grey: the one time
    axis the chart and the heat map share."""
    parts = []
    ticks = nice_ticks(0, profile.cycles, 8, integer=True)
    us_step = (ticks[1] - ticks[0] if len(ticks) > 1 else 1) / max(profile.clock_hz, 1) * 1e4
    for value in ticks:
        x = x_of(value)
        us = (f'<text class="tick-us" x="{x:.2f}" y="{axis_y + 30}" text-anchor="middle" '
              f'fill="#777">{tick_label(value / profile.clock_hz * 1e6, us_step)}</text>'
              if profile.clock_hz > 0 else "")
        parts.append(f'<g class="{cls}" data-value="{value:.12g}"><line x1="{x:.2f}" '
                     f'y1="{axis_y}" x2="{x:.2f}" y2="{axis_y + 5}" stroke="#333"/><text '
                     f'x="{x:.2f}" y="{axis_y + 17}" text-anchor="middle">{tick_label(value)}'
                     f"</text>{us}</g>")
    unit = (f"; grey: microseconds at {profile.clock_hz / 1e9:g} GHz"
            if profile.clock_hz > 0 else "")
    parts.append(f'<text class="axis-label x-label" x="{left + plot_w / 2}" y="{label_y}" '
                 f'text-anchor="middle">cycles from the start of the run{unit}</text>')
    return parts


@dataclass
class HeatBins:
    """The heat map's cells: ``values[r, c]`` is the mean busy share of the tiles
    ``tile_edges[r]:tile_edges[r + 1]`` over the supersteps ``step_edges[c]:step_edges[c + 1]``
    (busy cycles over the bin's tiles times its supersteps' cycles, so a long superstep
    weighs more than a short one; a tile's cycles are capped at its superstep's).  Column
    ``c`` spans cycles ``cycle_edges[c]:cycle_edges[c + 1]`` of the run: it is drawn as wide
    as the time its supersteps take, on the chart's time axis."""

    values: np.ndarray
    tile_edges: list[int]
    step_edges: list[int]
    step_labels: list[str]
    tile_labels: list[str]
    cycle_edges: list[int]


def heat_bins(profile: Profile, tile_bin: int = 16, max_columns: int = 300) -> HeatBins:
    """Bin the tiles into bins of ``tile_bin`` (the last may be partial) and, past
    ``max_columns`` supersteps, the supersteps into equal runs: one pixel per tile and
    superstep is unreadable and, for a deep tower, megabytes of page."""
    steps = profile.supersteps
    per = max(1, math.ceil(len(steps) / max_columns))
    tile_edges = [*range(0, profile.tiles, tile_bin), profile.tiles]
    step_edges = [*range(0, len(steps), per), len(steps)]
    busy = np.zeros((len(step_edges) - 1, len(tile_edges) - 1))
    length = np.zeros(len(step_edges) - 1)
    for i, step in enumerate(steps):
        if step.tile_cycles is not None:
            capped = np.clip(step.tile_cycles, 0, step.cycles)
            busy[i // per] += np.add.reduceat(capped, tile_edges[:-1])
        length[i // per] += step.cycles
    denominator = length[:, None] * np.diff(tile_edges)[None, :]
    values = np.divide(busy, denominator, out=np.zeros_like(busy), where=denominator > 0)
    step_labels = [f"superstep {a}: {steps[a].label}" if b - a == 1 else
                   f"supersteps {a}-{b - 1}: {steps[a].label} .. {steps[b - 1].label}"
                   for a, b in zip(step_edges, step_edges[1:], strict=False)]
    tile_labels = [f"tiles {a}-{b - 1}" if b - a > 1 else f"tile {a}"
                   for a, b in zip(tile_edges, tile_edges[1:], strict=False)]
    cycle_edges = [steps[a].begin for a in step_edges[:-1]] + (
        [steps[-1].start + steps[-1].cycles] if steps else [0])
    return HeatBins(values.T, tile_edges, step_edges, step_labels, tile_labels, cycle_edges)


def heat_bytes(values: np.ndarray) -> np.ndarray:
    """Shares as bytes 0-255, rounded up so that a bin with any work is never blank."""
    return np.ceil(np.clip(values, 0, 1) * 255 - 1e-9).astype(np.uint8)


def _heat_axes(profile: Profile, geometry: tuple[int, int, int, int],
               tile_bin: int) -> list[str]:
    """Ticks and labels of the heat map: tiles down the left, the chart's time axis along
    the bottom."""
    left, top, plot_w, plot_h = geometry
    parts = [f'<rect class="frame" x="{left}" y="{top}" width="{plot_w}" height="{plot_h}" '
             'fill="none" stroke="#999"/>']
    for value in nice_ticks(0, profile.tiles, 8, integer=True):
        y = top + plot_h * value / profile.tiles
        parts.append(f'<g class="tick y-tick" data-value="{value:.12g}"><line x1="{left - 5}" '
                     f'y1="{y:.1f}" x2="{left}" y2="{y:.1f}" stroke="#333"/><text x="{left - 8}" '
                     f'y="{y + 4:.1f}" text-anchor="end">{tick_label(value)}</text></g>')
    total = max(profile.cycles, 1)
    parts += _cycle_axis(profile, left, plot_w, top + plot_h, top + plot_h + 46,
                         lambda cycles: left + plot_w * cycles / total, "tick x-tick")
    parts.append(f'<text class="axis-label y-label" transform="translate(14,{top + plot_h / 2}) '
                 f'rotate(-90)" text-anchor="middle">tile ({tile_bin} per row)</text>')
    return parts


def _heat_overlay(profile: Profile, tracks: list[tuple[str, range]] | None,
                  geometry: tuple[int, int, int, int]) -> list[str]:
    """The named tile ranges (a line at each edge inside the map, the name to the right)
    and the colour scale bar below the map."""
    left, top, plot_w, plot_h = geometry
    parts = []
    for label, span in tracks or []:
        if not 0 <= span.start < span.stop <= profile.tiles:
            raise ValueError(f"track {label!r} ({span}) is not within the {profile.tiles} tiles")
        for edge in (span.start, span.stop):
            if 0 < edge < profile.tiles:
                y = top + plot_h * edge / profile.tiles
                parts.append(f'<line class="track-separator" data-tile="{edge}" x1="{left}" '
                             f'y1="{y:.1f}" x2="{left + plot_w + 6}" y2="{y:.1f}" stroke="#c00" '
                             'stroke-width="1.5"/>')
        middle = top + plot_h * (span.start + span.stop) / 2 / profile.tiles
        parts.append(f'<text class="track-label" x="{left + plot_w + 8}" y="{middle + 4:.1f}">'
                     f"{html.escape(label)} ({span.start}-{span.stop - 1})</text>")
    scale_y = top + plot_h + 60
    parts.append('<defs><linearGradient id="heat-gradient"><stop offset="0" stop-color="#ffffff"/>'
                 f'<stop offset="1" stop-color="{HEAT_FULL}"/></linearGradient></defs>'
                 f'<rect class="scale-bar" x="{left}" y="{scale_y}" width="240" height="12" '
                 'fill="url(#heat-gradient)" stroke="#999"/>')
    for share in (0, 25, 50, 75, 100):
        x = left + 240 * share / 100
        parts.append(f'<g class="scale-tick" data-value="{share}"><line x1="{x:g}" '
                     f'y1="{scale_y + 12}" x2="{x:g}" y2="{scale_y + 16}" stroke="#333"/><text '
                     f'x="{x:g}" y="{scale_y + 28}" text-anchor="middle">{share} %</text></g>')
    parts.append(f'<text class="axis-label scale-label" x="{left + 252}" y="{scale_y + 11}">'
                 "busy: mean over the cell's tiles and supersteps (cycle-weighted)</text>")
    return parts


def heat_map(profile: Profile, tracks: list[tuple[str, range]] | None = None,
             tile_bin: int = 16, max_columns: int = 300) -> tuple[str, dict[str, object]]:
    """The heat map's HTML (a canvas the page's script paints, under an SVG of the axes, the
    colour scale and, for ``tracks``, a line and a label at each named tile range) and the
    data the script reads.  Time runs across on the chart's axis, each column as wide as
    its supersteps take; tiles down."""
    bins = heat_bins(profile, tile_bin, max_columns)
    rows, cols = bins.values.shape
    row_px = max(3, min(24, 420 // max(rows, 1)))
    geometry = (CHART_LEFT, 10, CHART_WIDTH - CHART_LEFT - CHART_RIGHT, rows * row_px)
    left, top, plot_w, plot_h = geometry
    width = CHART_WIDTH + (200 if tracks else 0)
    height = top + plot_h + 100
    parts = _heat_axes(profile, geometry, tile_bin) + _heat_overlay(profile, tracks, geometry)
    canvas = (f'<canvas id="heat-map" style="left:{left}px;top:{top}px;width:{plot_w}px;'
              f'height:{plot_h}px"></canvas>')
    svg = (f'<svg id="heat-axes" xmlns="http://www.w3.org/2000/svg" width="{width}" '
           f'height="{height}" data-rows="{rows}" data-columns="{cols}">{"".join(parts)}</svg>')
    block = (f'<div class="heat" style="width:{width}px;height:{height}px">{canvas}{svg}</div>'
             '<p id="heat-hover">Hover over the map: the supersteps, tiles and busy share of a '
             "cell.</p>")
    data = {"tiles": profile.tiles, "supersteps": len(profile.supersteps), "rows": rows,
            "columns": cols, "cells": base64.b64encode(heat_bytes(bins.values).tobytes()).decode(),
            "tileEdges": bins.tile_edges, "stepEdges": bins.step_edges,
            "cycleEdges": bins.cycle_edges, "cycles": max(profile.cycles, 1),
            "pixels": plot_w, "tileLabels": bins.tile_labels, "stepLabels": bins.step_labels,
            "full": HEAT_FULL}
    return block, data


def _host_note(data: dict[str, object], workload_cycles: int) -> str:
    """The host transfers beside the run, not among its shares: they happen before and
    after its cycles (``qpsWithHost`` in the record adds them)."""
    host = data["host"]
    assert isinstance(host, dict)
    if not host["cycles"]:
        return ""
    return (f'<p id="host">Host transfers, outside the run: {host["cycles"]:,} cycles '
            f'({host["microseconds"]:.3f} us) moving {host["bytes"]:,} bytes, '
            f'{host["cycles"] / max(workload_cycles, 1):.2f}x the run\'s own cycles.</p>')


def report_html(profile: Profile, tracks: list[tuple[str, range]] | None = None) -> str:
    """The page; ``tracks`` names tile ranges (pipeline stages, chips) on the heat map."""
    data = summary(profile)
    figures = data["figures"]
    summary_rows = [[k, f"{v:,}", f"{100 * v / max(profile.cycles, 1):.1f} %"]
                    for k, v in data["split"].items()]
    limits = [[e["number"], e["label"], e["name"], f"{e['cycles']:,}",
               f"{100 * e['share']:.1f} %", e["why"]] for e in data["longest"]]
    kernels = [[k["kernel"], ", ".join(k["parts"]) + (f" and {k['part_count'] - 3} more"
                                                      if k["part_count"] > 3 else ""),
                f"{k['cycles']:,}", f"{100 * k['share']:.1f} %"] for k in data["kernels"]]
    exchanges = [[e["number"], e["label"], e["name"], e["horizon"], e["lower_bound"],
                  f"{e['ratio']:.3f}", e["instruction_horizon"], e["chunks"], e["transfers"]]
                 for e in data["exchanges"]]
    efficiency = (f"{figures.get('efficiencyPercent')} % of the FP16 peak "
                  f"({figures.get('effectiveGemmTflops')} TFLOPS); estimated "
                  f"{figures.get('estimatedCycles')} cycles" if figures else "")
    placement = (f'<p><a id="placement-link" href="{html.escape(profile.placement_page)}">'
                 "exact tile placement</a></p>" if profile.placement_page else "")
    if profile.placement_pages:
        placement = "<p>Exact tile placement of each group's program: " + ", ".join(
            f'<a class="placement-link" href="{html.escape(path)}">{html.escape(label)}</a>'
            for label, path in profile.placement_pages) + "</p>"
    heat_block, heat = heat_map(profile, tracks)
    body = (
        f"<h1>{html.escape(profile.workload)}</h1>"
        f"<p id=\"headline\">{profile.cycles:,} cycles = "
        f"{profile.cycles / profile.clock_hz * 1e6:.3f} us; {len(profile.supersteps)} "
        f"supersteps (numbered 0-{len(profile.supersteps) - 1} on this page) on "
        f"{data['active_tiles']} active tiles. {html.escape(efficiency)}</p>"
        f"{placement}<h2>Where the run's cycles go</h2>"
        + _table(["part", "cycles", "of the run"], summary_rows, "split")
        + f'<p id="waiting">Within those, a tile waits at the syncs {data["waiting"]:,} cycles '
        "on average for the slowest tile of each superstep.</p>"
        + _host_note(data, profile.cycles)
        + "<h2>What limits the run: the longest supersteps</h2>"
        + _table(["#", "model part", "program step", "cycles", "share", "why"], limits,
                 "longest")
        + "<h2>Supersteps</h2>" + superstep_chart(profile)
        + "<h2>Tiles x time (share of each superstep the tiles are busy)</h2>"
        + heat_block
        + "<h2>Kernels by share of the critical path</h2>"
        + _table(["kernel", "model parts", "cycles on the busiest tile", "share of the run"],
                 kernels, "kernels")
        + "<h2>Exchange phases</h2>"
        + _table(["#", "model part", "program step", "horizon", "lower bound", "ratio",
                  "instruction horizon", "chunks", "transfers"], exchanges, "exchanges")
    )
    scripts = (f'<script type="application/json" id="heat-data">{inert_json(heat)}</script>'
               f"<script>{_JS}</script>")
    return standalone_page(f"{profile.workload} execution profile", _CSS, body + scripts)


def write_report(path: Path, profile: Profile,
                 tracks: list[tuple[str, range]] | None = None) -> int:
    """Write ``report.html``; its size in characters."""
    page = report_html(profile, tracks)
    write_text_atomic(path, page)
    return len(page)


_CSS = """
body { font: 14px sans-serif; margin: 16px; color: #222; }
table { border-collapse: collapse; margin: 8px 0 16px; }
td, th { border: 1px solid #ccc; padding: 2px 8px; text-align: left; }
svg text { font: 12px sans-serif; }
svg text.bar-label { font: 11px sans-serif; pointer-events: none; }
.heat { position: relative; }
.heat canvas { position: absolute; image-rendering: pixelated; cursor: crosshair; }
.heat svg { position: absolute; left: 0; top: 0; pointer-events: none; }
#heat-hover { min-height: 1.4em; color: #444; }
"""

_JS = """
(function () {
  var data = JSON.parse(document.getElementById("heat-data").textContent);
  var canvas = document.getElementById("heat-map");
  var hover = document.getElementById("heat-hover");
  canvas.width = Math.max(1, data.pixels);
  canvas.height = Math.max(1, data.rows);
  var ctx = canvas.getContext("2d");
  var bytes = atob(data.cells);
  var full = [1, 3, 5].map(function (k) { return parseInt(data.full.slice(k, k + 2), 16); });
  function px(cycles) { return cycles / data.cycles * canvas.width; }
  var painted = 0;
  for (var c = 0; c < data.columns; c++) {
    var x0 = px(data.cycleEdges[c]), w = Math.max(1, px(data.cycleEdges[c + 1]) - x0);
    for (var r = 0; r < data.rows; r++) {
      var v = bytes.charCodeAt(r * data.columns + c), rgb = [];
      for (var k = 0; k < 3; k++) { rgb.push(Math.round(255 + (full[k] - 255) * v / 255)); }
      ctx.fillStyle = "rgb(" + rgb.join(",") + ")";
      ctx.fillRect(x0, r, w, 1);
      if (v > 0) {
        painted += (data.tileEdges[r + 1] - data.tileEdges[r]) *
                   (data.stepEdges[c + 1] - data.stepEdges[c]);
      }
    }
  }
  function columnAt(cycles) {
    var lo = 0, hi = data.columns - 1;
    while (lo < hi) {
      var mid = (lo + hi + 1) >> 1;
      if (data.cycleEdges[mid] <= cycles) { lo = mid; } else { hi = mid - 1; }
    }
    return lo;
  }
  canvas.addEventListener("mousemove", function (e) {
    var box = canvas.getBoundingClientRect();
    var c = columnAt((e.clientX - box.left) / box.width * data.cycles);
    var r = Math.floor((e.clientY - box.top) / box.height * data.rows);
    if (c < 0 || r < 0 || c >= data.columns || r >= data.rows) { return; }
    var v = bytes.charCodeAt(r * data.columns + c);
    var text = data.stepLabels[c] + "; " + data.tileLabels[r] + ": " +
               Math.round(100 * v / 255) + " % busy";
    canvas.title = text;
    hover.textContent = text;
  });
  canvas.setAttribute("data-cells", String(data.supersteps * data.tiles));
  canvas.setAttribute("data-painted", String(painted));
  canvas.setAttribute("data-rendered", "1");
})();
"""
