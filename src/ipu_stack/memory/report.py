"""Memory reports: the planner memory profile (JSON) and the exact tile placement page (HTML).

The reference build ends with two reports (its build log's phase 12): a JSON profile with the
chip-wide peak (``peak_step``, ``effective_peak_bytes``) and an HTML page of the exact tile
placement.  Both are derived from the placed program alone, so they explain a placement
failure or a tight tile without re-running the compiler.

Live bytes are computed as two small matrix products, ``[steps, buffers] @ [buffers, tiles]``
per memory class, instead of a loop over tiles: a 1472-tile program with ~60 buffers and ~30
steps takes milliseconds.  The HTML page embeds its data once per distinct placement
*signature* (tiles that hold the same buffers at the same addresses), because replicated
layouts make most of the 1472 tiles identical and the page must stay small enough to mail.
"""

from __future__ import annotations

import html
import json
import logging
import math
import os
from typing import Any

import numpy as np

from ipu_stack.lowering.program import ComputeSet, Exchange, Loop, Program
from ipu_stack.memory.placement import Placement
from ipu_stack.target import MemoryClass, Target
from ipu_stack.util.files import write_text_atomic
from ipu_stack.util.html import inert_json, standalone_page
from ipu_stack.util.log import event

LOG = logging.getLogger("ipu_stack.memory")
PROFILE_BUSIEST = 16
CLASSES = (MemoryClass.STANDARD, MemoryClass.INTERLEAVED)


def step_names(program: Program) -> list[str]:
    """``"<program>/<global step> <kind> <name>"``, indexed like buffer lifetimes."""
    names = []
    for prog, index, step in program.steps():
        label = step.name if isinstance(step, ComputeSet | Exchange | Loop) else step.tensor
        names.append(f"{prog}/{index} {type(step).__name__} {label}")
    return names


def live_bytes(program: Program, placement: Placement) -> dict[MemoryClass, np.ndarray]:
    """Bytes live per class as ``int64[steps, tiles]`` (at least one row, like placement).

    Membership comes from ``placement.addresses`` so the report shows what was placed; a
    buffer's bytes count on every step of its inclusive lifetime ``[first, last]``.
    """
    buffers = program.buffers
    steps = max(len(program.initialize) + len(program.run), 1)
    tiles = placement.addresses.shape[1]
    member = (placement.addresses >= 0).astype(np.int64)  # [buffers, tiles]
    first = np.array([b.first for b in buffers], dtype=np.int64)
    last = np.array([b.last for b in buffers], dtype=np.int64)
    nbytes = np.array([b.nbytes for b in buffers], dtype=np.int64)
    index = np.arange(steps)
    alive = (first[:, None] <= index[None, :]) & (index[None, :] <= last[:, None])
    weight = alive * nbytes[:, None]  # [buffers, steps]
    out = {}
    for memory_class in CLASSES:
        chosen = np.array([b.memory_class is memory_class for b in buffers], dtype=bool)
        if chosen.any():
            # in float64 (BLAS; numpy's int64 matmul has none): every sum is a whole number
            # of bytes far below 2^53, so the result is exact
            product = weight[chosen].T.astype(np.float64) @ member[chosen].astype(np.float64)
            out[memory_class] = np.rint(product).astype(np.int64)
        else:
            out[memory_class] = np.zeros((steps, tiles), dtype=np.int64)
    return out


def _busiest(peaks: np.ndarray, steps: np.ndarray, count: int) -> list[dict[str, int]]:
    """The ``count`` highest peaks, ties broken by tile number so reports are deterministic."""
    order = np.lexsort((np.arange(len(peaks)), -peaks))[:count]
    return [
        {"tile": int(t), "peak_bytes": int(peaks[t]), "peak_step": int(steps[t])} for t in order
    ]


def memory_profile(
    program: Program, placement: Placement, target: Target, scope: str
) -> dict[str, Any]:
    """The planner memory profile: chip-wide peak, the peak tile per step, the busiest tiles.

    ``effective_peak_bytes`` counts support memory, because support is what placement must
    fit around; ``peak_step``/``peak_tile`` are the first step and lowest tile reaching it.
    """
    live = live_bytes(program, placement)
    support = placement.support_bytes.astype(np.int64)
    total = support[None, :] + live[MemoryClass.STANDARD] + live[MemoryClass.INTERLEAVED]
    peak_step, peak_tile = np.unravel_index(int(np.argmax(total)), total.shape)
    peaks = total.max(axis=0)
    steps = len(program.initialize) + len(program.run)
    ordered = np.sort(peaks)
    return {
        "scope": scope,
        "target": target.name,
        "tiles": int(total.shape[1]),
        "memory_base": target.memory_base,
        "memory_end": target.memory_end,
        "steps": step_names(program),
        "peak_step": int(peak_step),
        "peak_tile": int(peak_tile),
        "effective_peak_bytes": int(total[peak_step, peak_tile]),
        "support_bytes": int(support[peak_tile]),
        "by_class": {c.value: live[c][:steps, peak_tile].tolist() for c in CLASSES},
        "tile_peaks": {
            "min": int(ordered[0]),
            "median": int(ordered[(len(ordered) - 1) // 2]),  # lower median: a real tile's
            "max": int(ordered[-1]),
        },
        "busiest_tiles": _busiest(peaks, total.argmax(axis=0), PROFILE_BUSIEST),
    }


def write_memory_profile(
    path: str | os.PathLike[str],
    program: Program,
    placement: Placement,
    target: Target,
    scope: str = "final",
    filled: tuple[int, dict[str, int]] | None = None,
) -> dict[str, Any]:
    """Write :func:`memory_profile` atomically as sorted, indented JSON and return it;
    ``filled``: a tile and its bytes by category (``memory.categories``), recorded as
    ``tile_by_category``."""
    profile = memory_profile(program, placement, target, scope)
    if filled is not None:
        profile["tile_by_category"] = {"tile": filled[0], **filled[1]}
    write_text_atomic(path, json.dumps(profile, sort_keys=True, indent=1) + "\n")
    event(LOG, "wrote planner memory profile", path=str(path), scope=scope,
          peak_step=profile["peak_step"], effective_peak_bytes=profile["effective_peak_bytes"])
    return profile


def _distinct_rows(rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Distinct rows of ``rows`` (tiles first) and each tile's index into them."""
    if rows.shape[1] == 0:
        return rows[:1], np.zeros(len(rows), dtype=np.int64)
    unique, inverse = np.unique(rows, axis=0, return_inverse=True)
    return unique, inverse.ravel()


def placement_data(
    program: Program,
    placement: Placement,
    support: dict[str, np.ndarray],
    target: Target,
    title: str,
    busiest: int = 32,
) -> dict[str, Any]:
    """The JSON the placement page embeds; a tile's peak is its support plus its signature's.

    Support sizes differ per tile (code, exchange tables) while buffer addresses repeat, so
    support rows and address signatures are deduplicated separately.
    """
    live = live_bytes(program, placement)
    live_total = live[MemoryClass.STANDARD] + live[MemoryClass.INTERLEAVED]
    tiles = placement.addresses.shape[1]
    signatures, tile_signature = _distinct_rows(placement.addresses.T)
    representative = np.full(len(signatures), tiles, dtype=np.int64)
    np.minimum.at(representative, tile_signature, np.arange(tiles))  # first tile of each
    kinds = [k for k in support if k != "total"]
    support_rows = np.stack(
        [placement.support_bytes.astype(np.int64)]
        + [np.asarray(support[k], dtype=np.int64) for k in kinds],
        axis=1,
    )
    supports, tile_support = _distinct_rows(support_rows)
    peaks = placement.support_bytes.astype(np.int64) + live_total.max(axis=0)
    sig_data = []
    for row, tile in zip(signatures, representative, strict=True):
        column = live_total[:, tile]
        sig_data.append({
            "buffers": [[int(b), int(a)] for b, a in enumerate(row) if a >= 0],
            "live_peak": int(column.max()),
            "live_peak_step": int(column.argmax()),
        })
    return {
        "title": title,
        "target": target.name,
        "tiles": tiles,
        "cols": max(1, math.ceil(math.sqrt(tiles * 46 / 32))),
        "memory_base": target.memory_base,
        "memory_end": target.memory_end,
        "interleaved_base": target.interleaved_base,
        "steps": step_names(program),
        "buffers": [
            {"name": b.name, "bytes": b.nbytes, "class": b.memory_class.value,
             "first": b.first, "last": b.last, "description": b.description}
            for b in program.buffers
        ],
        "support_kinds": ["total", *kinds],
        "supports": supports.tolist(),
        "signatures": sig_data,
        "tile_signature": tile_signature.tolist(),
        "tile_support": tile_support.tolist(),
        "busiest": _busiest(peaks, live_total.argmax(axis=0), busiest),
    }


def placement_html(
    program: Program,
    placement: Placement,
    support: dict[str, np.ndarray],
    target: Target,
    title: str,
    busiest: int = 32,
) -> str:
    """One self-contained page (inline CSS and JS, no network) of the exact tile placement."""
    data = placement_data(program, placement, support, target, title, busiest)
    body = (_BODY.replace("@TITLE@", html.escape(title)).replace("@JS@", _JS)
            .replace("@DATA@", inert_json(data)))
    return standalone_page(title, _CSS, body)


def write_placement_html(
    path: str | os.PathLike[str],
    program: Program,
    placement: Placement,
    support: dict[str, np.ndarray],
    target: Target,
    title: str,
) -> None:
    """Write :func:`placement_html` atomically."""
    page = placement_html(program, placement, support, target, title)
    write_text_atomic(path, page)
    event(LOG, "wrote exact tile placement profile", path=str(path), bytes=len(page))


_BODY = """<h1>@TITLE@</h1>
<p id="summary"></p>
<div id="top">
<section><h2>Tile map: peak use of tile memory</h2>
<div id="tile-map" role="grid" aria-label="tiles"></div>
<div id="legend"></div>
<p><label>tile <input id="tile-input" type="number" min="0"></label>
click a tile, or add <code>#tile=N</code> to the address</p></section>
<section><h2>Busiest tiles</h2><ol id="busiest"></ol></section>
</div>
<section id="address-map" aria-live="polite"></section>
<script type="application/json" id="placement-data">@DATA@</script>
<script>@JS@</script>
"""

_CSS = """
:root { --cell: 13px; --std: #3b7dd8; --int: #e08a1e; --sup: #8a8a8a; }
body { font: 13px/1.4 system-ui, sans-serif; margin: 16px; color: #222; }
h1 { font-size: 18px; } h2 { font-size: 15px; margin: 8px 0; }
#top { display: flex; gap: 24px; flex-wrap: wrap; }
#tile-map { display: grid; gap: 1px; background: #ddd; border: 1px solid #ccc; width: max-content; }
#tile-map .cell { width: var(--cell); height: var(--cell); cursor: pointer; }
#tile-map .cell.sel { outline: 2px solid #000; outline-offset: -1px; }
#legend { display: flex; align-items: center; gap: 6px; margin-top: 6px; }
#legend .bar { width: 240px; height: 12px; border: 1px solid #999; }
#busiest { max-height: 470px; overflow-y: auto; margin: 0; padding-left: 28px; }
#busiest li { cursor: pointer; } #busiest li:hover { text-decoration: underline; }
#address-map svg { width: 100%; max-width: 1100px; border: 1px solid #ccc; background: #fafafa; }
#address-map table { border-collapse: collapse; margin-top: 8px; }
#address-map td, #address-map th { border: 1px solid #ddd; padding: 2px 6px; text-align: left; }
#address-map td.num { text-align: right; font-variant-numeric: tabular-nums; }
.key { display: inline-block; width: 10px; height: 10px; margin-right: 4px; }
.Ipu21Standard { background: var(--std); } .Ipu21Interleaved { background: var(--int); }
.support { background: var(--sup); } .desc { color: #666; max-width: 520px; }
"""

_JS = r"""
(function () {
  "use strict";
  var D = JSON.parse(document.getElementById("placement-data").textContent);
  var span = D.memory_end - D.memory_base, T = D.tiles, S = D.steps.length;
  var FILL = { Ipu21Standard: "#3b7dd8", Ipu21Interleaved: "#e08a1e" };
  var peak = [], peakStep = [];
  for (var t = 0; t < T; t++) {
    var sig = D.signatures[D.tile_signature[t]];
    peak.push(D.supports[D.tile_support[t]][0] + sig.live_peak);
    peakStep.push(sig.live_peak_step);
  }
  function colour(f) {
    f = Math.min(Math.max(f, 0), 1);
    return "hsl(" + Math.round(230 * (1 - f)) + ",80%," + Math.round(40 + 10 * f) + "%)";
  }
  function fmt(n) { return n.toLocaleString("en-US"); }
  function hex(n) { return "0x" + n.toString(16); }
  function pct(n) { return (100 * n / span).toFixed(1) + "%"; }
  function el(tag, attrs, text) {
    var e = document.createElement(tag);
    for (var k in attrs || {}) e.setAttribute(k, attrs[k]);
    if (text !== undefined) e.textContent = text;
    return e;
  }
  function svg(tag, attrs, text) {
    var e = document.createElementNS("http://www.w3.org/2000/svg", tag);
    for (var k in attrs) e.setAttribute(k, attrs[k]);
    if (text !== undefined) e.textContent = text;
    return e;
  }
  var top = D.busiest.length ? D.busiest[0] : { tile: 0, peak_bytes: peak[0], peak_step: 0 };
  document.getElementById("summary").textContent = D.target + ", " + T + " tiles, memory " +
    hex(D.memory_base) + "-" + hex(D.memory_end) + " (" + fmt(span) + " bytes); busiest tile " +
    top.tile + ": " + fmt(top.peak_bytes) + " bytes (" + pct(top.peak_bytes) + ") at step " +
    (D.steps[top.peak_step] || top.peak_step) + "; " + D.signatures.length +
    " distinct placements";
  var map = document.getElementById("tile-map"), cells = [], frag = document.createDocumentFragment();
  map.style.gridTemplateColumns = "repeat(" + D.cols + ", var(--cell))";
  for (t = 0; t < T; t++) {
    var c = el("div", { "class": "cell", "data-tile": t,
      title: "tile " + t + ": " + fmt(peak[t]) + " bytes (" + pct(peak[t]) + ")" });
    c.style.background = colour(peak[t] / span);
    cells.push(c); frag.appendChild(c);
  }
  map.appendChild(frag);
  map.addEventListener("click", function (e) {
    var v = e.target.getAttribute("data-tile");
    if (v !== null) select(+v);
  });
  var legend = document.getElementById("legend"), stops = [];
  for (var i = 0; i <= 10; i++) stops.push(colour(i / 10) + " " + (i * 10) + "%");
  var bar = el("span", { "class": "bar" });
  bar.style.background = "linear-gradient(to right," + stops.join(",") + ")";
  legend.appendChild(el("span", {}, "0%")); legend.appendChild(bar);
  legend.appendChild(el("span", {}, "100% of " + fmt(span) + " bytes"));
  var list = document.getElementById("busiest");
  D.busiest.forEach(function (b) {
    var li = el("li", { "data-tile": b.tile }, "tile " + b.tile + ": " + fmt(b.peak_bytes) +
      " B (" + pct(b.peak_bytes) + ") at step " + b.peak_step);
    li.addEventListener("click", function () { select(b.tile); });
    list.appendChild(li);
  });
  var input = document.getElementById("tile-input");
  input.max = T - 1;
  input.addEventListener("change", function () {
    var v = parseInt(input.value, 10);
    if (v >= 0 && v < T) select(v);
  });
  var current = -1;
  function select(tile) {
    if (current >= 0) cells[current].classList.remove("sel");
    current = tile; cells[tile].classList.add("sel"); input.value = tile;
    renderTile(tile);
  }
  function renderTile(tile) {
    var am = document.getElementById("address-map");
    while (am.firstChild) am.removeChild(am.firstChild);
    am.setAttribute("data-tile", tile);
    var sup = D.supports[D.tile_support[tile]], sig = D.signatures[D.tile_signature[tile]];
    am.appendChild(el("h2", {}, "Address map of tile " + tile));
    am.appendChild(el("p", {}, "peak " + fmt(peak[tile]) + " bytes (" + pct(peak[tile]) +
      ") at step " + (D.steps[peakStep[tile]] || peakStep[tile]) + "; support " +
      D.support_kinds.map(function (k, j) { return k + " " + fmt(sup[j]); }).join(", ")));
    var W = 1000, L = 36, R = 8, row = S > 40 ? 8 : 14, H = Math.max(S, 1) * row + 28;
    function x(a) { return L + (a - D.memory_base) / span * (W - L - R); }
    var s = svg("svg", { viewBox: "0 0 " + W + " " + H, role: "img" });
    s.appendChild(svg("title", {}, "addresses (x) by step (y)"));
    var rows = Math.max(S, 1) * row;
    var sr = svg("rect", { x: x(D.memory_base), y: 0, width: x(D.memory_base + sup[0]) - L,
      height: rows, fill: "#8a8a8a" });
    sr.appendChild(svg("title", {}, "support " + fmt(sup[0]) + " bytes"));
    s.appendChild(sr);
    sig.buffers.forEach(function (p) {
      var b = D.buffers[p[0]], a = p[1];
      if (b.first < 0) return;
      var r = svg("rect", { x: x(a), y: b.first * row, width: Math.max(x(a + b.bytes) - x(a), 1),
        height: (b.last - b.first + 1) * row, fill: FILL[b["class"]] || "#999",
        stroke: "#fff", "stroke-width": 0.5, "data-buffer": p[0] });
      r.appendChild(svg("title", {}, b.name + ": " + fmt(b.bytes) + " B at " + hex(a) +
        ", steps " + b.first + "-" + b.last));
      s.appendChild(r);
    });
    for (var k = 0; k < S; k += Math.max(1, Math.ceil(S / 20))) {
      s.appendChild(svg("text", { x: 2, y: k * row + row - 3, "font-size": 10 }, String(k)));
    }
    var xi = x(D.interleaved_base);
    s.appendChild(svg("line", { x1: xi, x2: xi, y1: 0, y2: rows, stroke: "#c00",
      "stroke-dasharray": "4 3" }));
    [[D.memory_base, "start"], [D.interleaved_base, "middle"], [D.memory_end, "end"]]
      .forEach(function (m) {
        s.appendChild(svg("text", { x: x(m[0]), y: rows + 16, "font-size": 11,
          "text-anchor": m[1] }, hex(m[0]) + (m[0] === D.interleaved_base ? " interleaved" : "")));
      });
    am.appendChild(s);
    var keyp = el("p", {});
    [["support", "support"], ["Ipu21Standard", "Ipu21Standard"],
     ["Ipu21Interleaved", "Ipu21Interleaved"]].forEach(function (kv) {
      keyp.appendChild(el("span", { "class": "key " + kv[0] }));
      keyp.appendChild(el("span", {}, kv[1] + "  "));
    });
    keyp.appendChild(el("span", {}, "(x: address, y: step; dashed line: " +
      hex(D.interleaved_base) + ")"));
    am.appendChild(keyp);
    var table = el("table", {}), head = el("tr", {});
    ["buffer", "class", "bytes", "address range", "lifetime", "type"].forEach(function (h) {
      head.appendChild(el("th", {}, h));
    });
    table.appendChild(head);
    function addRow(attrs, cls, name, bytes, lo, life, desc) {
      var tr = el("tr", attrs), key = el("td", {});
      key.appendChild(el("span", { "class": "key " + cls })); key.appendChild(el("span", {}, name));
      tr.appendChild(key); tr.appendChild(el("td", {}, cls));
      tr.appendChild(el("td", { "class": "num" }, fmt(bytes)));
      tr.appendChild(el("td", { "class": "num" }, hex(lo) + "-" + hex(lo + bytes) +
        " (" + lo + "-" + (lo + bytes) + ")"));
      tr.appendChild(el("td", {}, life)); tr.appendChild(el("td", { "class": "desc" }, desc));
      table.appendChild(tr);
    }
    addRow({ "data-buffer": "support" }, "support", "support", sup[0], D.memory_base,
      "always", D.support_kinds.slice(1).map(function (k, j) {
        return k + " " + fmt(sup[j + 1]);
      }).join(", "));
    sig.buffers.slice().sort(function (p, q) { return p[1] - q[1] || p[0] - q[0]; })
      .forEach(function (p) {
        var b = D.buffers[p[0]];
        addRow({ "data-buffer": p[0] }, b["class"], b.name, b.bytes, p[1],
          "[" + b.first + ", " + b.last + "]", b.description);
      });
    am.appendChild(table);
  }
  var m = /tile=(\d+)/.exec(location.hash);
  select(m && +m[1] < T ? +m[1] : top.tile);
  map.setAttribute("data-rendered", "1");
})();
"""
