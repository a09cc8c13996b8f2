"""``report.html``: one self-contained page (inline CSS, SVG and JS; works offline).

It shows the summary (cycles split into compute, exchange, sync, host and waiting; the
efficiency; what limits the run), a chart of the supersteps (SVG, drawn here), a tiles x
supersteps utilisation heat map of all tiles (a canvas the page's script paints from the
inline data), the kernels ranked by their share of the critical path, the exchange phases
against their lower bounds, and a link to the placement page.
"""

from __future__ import annotations

import base64
import html
from pathlib import Path

import numpy as np

from ipu_stack.profile.record import Profile
from ipu_stack.profile.summary import summary
from ipu_stack.util.files import write_text_atomic
from ipu_stack.util.html import inert_json, standalone_page

COLOURS = {"compute": "#3b7dd8", "exchange": "#e08a2c", "sync": "#999999"}


def _table(headers: list[str], rows: list[list[object]], ident: str) -> str:
    head = "".join(f"<th>{html.escape(h)}</th>" for h in headers)
    body = "".join("<tr>" + "".join(f"<td>{html.escape(str(c))}</td>" for c in row) + "</tr>"
                   for row in rows)
    return f'<table id="{ident}"><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>'


def superstep_chart(profile: Profile, width: int = 1200, height: int = 160) -> str:
    """Each superstep as a bar as wide as its share of the run (sync in grey)."""
    total = max(profile.cycles, 1)
    bars = []
    for step in profile.supersteps:
        x = width * step.start / total
        w = max(width * step.cycles / total, 0.5)
        bars.append(f'<rect class="bar" x="{x:.2f}" y="20" width="{w:.2f}" height="{height - 40}" '
                    f'fill="{COLOURS[step.kind]}"><title>{html.escape(step.name)}: '
                    f"{step.cycles} cycles</title></rect>")
        sx = width * (step.start + step.cycles) / total
        bars.append(f'<rect x="{sx:.2f}" y="20" width="{max(width * step.sync / total, 0.2):.2f}" '
                    f'height="{height - 40}" fill="{COLOURS["sync"]}"/>')
    legend = "".join(f'<text x="{10 + 110 * i}" y="{height - 5}" fill="{c}">{k}</text>'
                     for i, (k, c) in enumerate(COLOURS.items()))
    return (f'<svg id="superstep-chart" xmlns="http://www.w3.org/2000/svg" width="{width}" '
            f'height="{height}" data-bars="{len(profile.supersteps)}">{"".join(bars)}{legend}</svg>')


def heat_data(profile: Profile) -> dict[str, object]:
    """Per superstep, every tile's share of the superstep busy, as one byte (0-255)."""
    rows = []
    for step in profile.supersteps:
        cycles = step.tile_cycles if step.tile_cycles is not None else np.zeros(profile.tiles)
        share = np.clip(cycles / max(step.cycles, 1), 0, 1)
        rows.append(base64.b64encode(np.round(share * 255).astype(np.uint8).tobytes()).decode())
    return {"tiles": profile.tiles, "rows": rows,
            "names": [s.name for s in profile.supersteps]}


def report_html(profile: Profile) -> str:
    data = summary(profile)
    split = data["split"]
    figures = data["figures"]
    summary_rows = [[k, v, f"{100 * v / max(profile.cycles, 1):.1f} %"] for k, v in split.items()]
    limits = [[e["name"], e["cycles"], f"{100 * e['share']:.1f} %", e["why"]]
              for e in data["longest"]]
    kernels = [[k["kernel"], k["cycles"], f"{100 * k['share']:.1f} %"] for k in data["kernels"]]
    exchanges = [[e["name"], e["horizon"], e["lower_bound"], f"{e['ratio']:.3f}",
                  e["instruction_horizon"], e["chunks"], e["transfers"]]
                 for e in data["exchanges"]]
    efficiency = (f"{figures.get('efficiencyPercent')} % of the FP16 peak "
                  f"({figures.get('effectiveGemmTflops')} TFLOPS); estimated "
                  f"{figures.get('estimatedCycles')} cycles" if figures else "")
    placement = (f'<p><a id="placement-link" href="{html.escape(profile.placement_page)}">'
                 "exact tile placement</a></p>" if profile.placement_page else "")
    heat = heat_data(profile)
    body = (
        f"<h1>{html.escape(profile.workload)}</h1>"
        f"<p id=\"headline\">{profile.cycles} cycles = "
        f"{profile.cycles / profile.clock_hz * 1e6:.3f} us; {len(profile.supersteps)} "
        f"supersteps on {data['active_tiles']} active tiles. {html.escape(efficiency)}</p>"
        f"{placement}<h2>Where the cycles go</h2>"
        + _table(["part", "cycles", "of the run"], summary_rows, "split")
        + "<h2>What limits the run: the longest supersteps</h2>"
        + _table(["superstep", "cycles", "share", "why"], limits, "longest")
        + "<h2>Supersteps</h2>" + superstep_chart(profile)
        + "<h2>Tiles x supersteps (share of each superstep a tile is busy)</h2>"
        + '<canvas id="heat-map"></canvas>'
        + "<h2>Kernels by share of the critical path</h2>"
        + _table(["kernel", "cycles on the busiest tile", "share of the run"], kernels,
                 "kernels")
        + "<h2>Exchange phases</h2>"
        + _table(["phase", "horizon", "lower bound", "ratio", "instruction horizon", "chunks",
                  "transfers"], exchanges, "exchanges")
    )
    scripts = (f'<script type="application/json" id="heat-data">{inert_json(heat)}</script>'
               f"<script>{_JS}</script>")
    return standalone_page(f"{profile.workload} execution profile", _CSS, body + scripts)


def write_report(path: Path, profile: Profile) -> int:
    page = report_html(profile)
    write_text_atomic(path, page)
    return len(page)


_CSS = """
body { font: 14px sans-serif; margin: 16px; color: #222; }
table { border-collapse: collapse; margin: 8px 0 16px; }
td, th { border: 1px solid #ccc; padding: 2px 8px; text-align: left; }
canvas { border: 1px solid #ccc; image-rendering: pixelated; }
"""

_JS = """
(function () {
  var data = JSON.parse(document.getElementById("heat-data").textContent);
  var canvas = document.getElementById("heat-map");
  var rowHeight = 6;
  canvas.width = data.tiles;
  canvas.height = Math.max(1, data.rows.length * rowHeight);
  var ctx = canvas.getContext("2d");
  var image = ctx.createImageData(canvas.width, canvas.height);
  var painted = 0;
  data.rows.forEach(function (row, r) {
    var bytes = atob(row);
    for (var t = 0; t < data.tiles; t++) {
      var v = bytes.charCodeAt(t);
      for (var y = r * rowHeight; y < (r + 1) * rowHeight; y++) {
        var i = (y * canvas.width + t) * 4;
        image.data[i] = 255 - v; image.data[i + 1] = 255 - Math.round(v * 0.6);
        image.data[i + 2] = 255; image.data[i + 3] = 255;
      }
      if (v > 0) { painted++; }
    }
  });
  ctx.putImageData(image, 0, 0);
  canvas.setAttribute("data-cells", String(data.rows.length * data.tiles));
  canvas.setAttribute("data-painted", String(painted));
  canvas.setAttribute("data-rendered", "1");
})();
"""
