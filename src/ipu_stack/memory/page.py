"""The exact tile placement page's HTML, CSS and script (``memory.report`` fills in the data).

The page is read by a person deciding why a tile is full, so it speaks in model parts and
KiB, not in buffer ids and byte counts: the tile map has a colour bar with KiB ticks, the
busiest list puts tiles with the same peak at the same step on one row, and the address map
colours each buffer on its own (hashed from its name, so a buffer keeps its colour from
tile to tile) and writes its model part inside where there is room.  Since colour means
buffer, the memory class is drawn as hatching (interleaved) instead.  Exact bytes, hex
addresses and internal names stay one hover away, in ``title`` tooltips.

Everything is inline (no network): the page is mailed and opened offline.  After its script
ran, ``#tile-map`` carries ``data-rendered="1"`` and ``#address-map`` the selected tile, which
the headless browser tests read.
"""

from __future__ import annotations

PAGE_BODY = """<h1>@TITLE@</h1>
<p id="summary"></p>
<p id="about"></p>
<div id="top">
<section><h2>Tile map: peak memory in use per tile</h2>
<div id="tile-map" role="grid" aria-label="tiles"></div>
<div id="legend"></div>
<p><label>tile <input id="tile-input" type="number" min="0"></label>
click a tile, or add <code>#tile=N</code> to the address</p></section>
<section><h2>Busiest tiles</h2>
<p class="note">tiles with the same peak at the same step share a row; click one to see it</p>
<ol id="busiest"></ol></section>
</div>
<section id="address-map" aria-live="polite"></section>
<script type="application/json" id="placement-data">@DATA@</script>
<script>@JS@</script>
"""

PAGE_CSS = """
:root { --cell: 13px; --sup: #8a8a8a; }
body { font: 13px/1.4 system-ui, sans-serif; margin: 16px; color: #222; }
h1 { font-size: 18px; } h2 { font-size: 15px; margin: 8px 0; }
#summary { font-size: 14px; margin-bottom: 2px; } #about { color: #555; margin-top: 0; }
#summary.fits strong { color: #176b2c; } #summary.nofit strong { color: #b00020; }
.size, .step { border-bottom: 1px dotted #aaa; }
.note { color: #666; margin: 0 0 4px; }
#top { display: flex; gap: 24px; flex-wrap: wrap; }
#tile-map { display: grid; gap: 1px; background: #ddd; border: 1px solid #ccc; width: max-content; }
#tile-map .cell { width: var(--cell); height: var(--cell); cursor: pointer; }
#tile-map .cell.grp { outline: 2px solid #555; outline-offset: -2px; }
#tile-map .cell.sel { outline: 2px solid #000; outline-offset: -1px; }
#legend { margin-top: 6px; max-width: 600px; }
#legend .scale { position: relative; width: 480px; height: 34px; margin: 4px 8px 0; }
#legend .bar { height: 12px; border: 1px solid #999; }
#legend .tick { position: absolute; top: 14px; font-size: 11px; white-space: nowrap; }
#legend .tick::before { content: ""; position: absolute; top: -3px; left: 50%; height: 4px;
  border-left: 1px solid #333; }
#legend .tick.first { transform: none; } #legend .tick.first::before { left: 0; }
#legend .tick.mid { transform: translateX(-50%); }
#legend .tick.last { transform: translateX(-100%); } #legend .tick.last::before { left: 100%; }
#busiest { max-height: 470px; overflow-y: auto; margin: 0; padding-left: 28px; }
#busiest li { cursor: pointer; margin-bottom: 2px; } #busiest li:hover { text-decoration: underline; }
#address-map svg { width: 100%; max-width: 1100px; border: 1px solid #ccc; background: #fafafa; }
#address-map svg .grid { stroke: #e4e4e4; } #address-map svg .axis { font-size: 11px; fill: #333; }
#address-map svg .buf { stroke: #fff; stroke-width: 0.5; }
#address-map svg .lbl { font-size: 10px; fill: #111; pointer-events: none; }
#address-map svg .hatch { pointer-events: none; }
#address-map table { border-collapse: collapse; margin-top: 8px; }
#address-map td, #address-map th { border: 1px solid #ddd; padding: 2px 6px; text-align: left; }
#address-map td.num { text-align: right; font-variant-numeric: tabular-nums; white-space: nowrap; }
#address-map td.name { font: 11px ui-monospace, monospace; color: #666; }
.key { display: inline-block; width: 11px; height: 11px; margin-right: 5px;
  vertical-align: -1px; border: 1px solid #999; }
.key.hatch { background-image: repeating-linear-gradient(45deg, rgba(0,0,0,.4) 0 1.5px,
  transparent 1.5px 4px); }
.key.support { background-color: var(--sup); } .type { color: #444; max-width: 560px; }
"""

PAGE_JS = r"""
(function () {
  "use strict";
  var D = JSON.parse(document.getElementById("placement-data").textContent);
  var span = D.memory_end - D.memory_base, T = D.tiles, S = D.steps.length;
  var INTER = "Ipu21Interleaved", CHAR = 6, SUPPORT = "#8a8a8a";
  var peak = [], peakStep = [];
  for (var t = 0; t < T; t++) {
    var sig = D.signatures[D.tile_signature[t]];
    peak.push(D.supports[D.tile_support[t]][0] + sig.live_peak);
    peakStep.push(sig.live_peak_step);
  }
  function heat(f) {
    f = Math.min(Math.max(f, 0), 1);
    return "hsl(" + Math.round(230 * (1 - f)) + ",80%," + Math.round(40 + 10 * f) + "%)";
  }
  function fmt(n) { return n.toLocaleString("en-US"); }
  function hex(n) { return "0x" + n.toString(16); }
  function human(n) {
    if (n < 1024) return n + " B";
    if (n < 1048576) return (n / 1024).toFixed(1) + " KiB";
    return (n / 1048576).toFixed(2) + " MiB";
  }
  function kib(n) {
    var k = n / 1024;
    return (k === Math.round(k) ? String(k) : k.toFixed(1)) + " KiB";
  }
  function pct(n) { return (100 * n / span).toFixed(1) + " %"; }
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
  function add(parent, items) {
    items.forEach(function (p) {
      parent.appendChild(typeof p === "string" ? document.createTextNode(p) : p);
    });
    return parent;
  }
  function size(n) { return el("span", { "class": "size", title: fmt(n) + " bytes" }, human(n)); }
  function stepText(k) {
    var part = D.step_parts[k];
    return "step " + k + (part ? " (" + part + ")" : "");
  }
  function step(k) { return el("span", { "class": "step", title: D.steps[k] || "" }, stepText(k)); }
  function fill(b) {  // FNV-1a of the name: a buffer keeps its colour on every tile
    var h = 2166136261;
    for (var i = 0; i < b.name.length; i++) h = Math.imul(h ^ b.name.charCodeAt(i), 16777619);
    h = h >>> 0;
    return "hsl(" + (h % 360) + ",62%," + [66, 76, 58][(h >>> 12) % 3] + "%)";
  }
  function memory(b) { return b["class"] === INTER ? "interleaved" : "standard"; }
  var top = D.busiest.length ? D.busiest[0] : { tile: 0, peak_bytes: peak[0], peak_step: 0 };

  function summary() {
    var p = document.getElementById("summary"), miss = D.unplaced;
    var fits = miss.pairs === 0 && top.peak_bytes <= span;
    p.className = fits ? "fits" : "nofit";
    add(p, [el("strong", {}, fits ? "Fits." : "Does not fit."), " "]);
    if (miss.pairs) {
      add(p, [miss.buffers + " buffer(s) found no room on " + fmt(miss.pairs) +
        " tile(s) and are missing from the maps below. "]);
    }
    add(p, ["Busiest tile " + top.tile + " peaks at ", size(top.peak_bytes), " of ", size(span),
      " (" + pct(top.peak_bytes) + ") at ", step(top.peak_step)]);
    if (top.peak_bytes <= span) add(p, [", ", size(span - top.peak_bytes), " to spare."]);
    add(document.getElementById("about"), [D.target + ": " + fmt(T) + " tiles, each with ",
      size(span), " of memory (" + hex(D.memory_base) + "-" + hex(D.memory_end) + "); " +
      fmt(D.signatures.length) + " distinct placements"]);
  }
  summary();

  var map = document.getElementById("tile-map"), cells = [], frag = document.createDocumentFragment();
  map.style.gridTemplateColumns = "repeat(" + D.cols + ", var(--cell))";
  for (t = 0; t < T; t++) {
    var c = el("div", { "class": "cell", "data-tile": t, title: "tile " + t + ": " +
      human(peak[t]) + " (" + fmt(peak[t]) + " bytes, " + pct(peak[t]) + ") at " +
      stepText(peakStep[t]) });
    c.style.background = heat(peak[t] / span);
    cells.push(c); frag.appendChild(c);
  }
  map.appendChild(frag);
  map.addEventListener("click", function (e) {
    var v = e.target.getAttribute("data-tile");
    if (v !== null) select(+v);
  });

  function legend() {
    var box = document.getElementById("legend"), stops = [];
    box.appendChild(el("div", {}, "Colour: peak bytes in use on the tile (support and the " +
      "buffers live at its busiest step), out of " + kib(span) + " per tile"));
    var scale = el("div", { "class": "scale" }), bar = el("div", { "class": "bar" });
    for (var i = 0; i <= 10; i++) stops.push(heat(i / 10) + " " + (i * 10) + "%");
    bar.style.background = "linear-gradient(to right," + stops.join(",") + ")";
    scale.appendChild(bar);
    D.scale_ticks.forEach(function (v, j) {
      var where = j === 0 ? "first" : j === D.scale_ticks.length - 1 ? "last" : "mid";
      var tick = el("span", { "class": "tick " + where, "data-bytes": v,
        title: fmt(v) + " bytes" }, kib(v));
      tick.style.left = (100 * v / span) + "%";
      scale.appendChild(tick);
    });
    box.appendChild(scale);
  }
  legend();

  var list = document.getElementById("busiest");
  D.busiest_groups.forEach(function (g) {
    var n = g.tiles.length, shown = g.tiles.slice(0, 3).join(", ");
    var who = n === 1 ? "tile " + shown : "tiles " + shown + (n > 3 ? " (+" + (n - 3) + " more)" : "");
    var li = el("li", { "data-tile": g.tiles[0], "data-count": n, title: fmt(g.peak_bytes) +
      " bytes" + (n > 1 ? " on tiles " + g.tiles.slice(0, 200).join(", ") +
      (n > 200 ? ", ..." : "") : "") });
    add(li, [who + ": ", el("b", {}, human(g.peak_bytes)), " (" + pct(g.peak_bytes) + ") at " +
      stepText(g.peak_step)]);
    li.addEventListener("click", function () { select(g.tiles[0], g.tiles); });
    list.appendChild(li);
  });
  var input = document.getElementById("tile-input");
  input.max = T - 1;
  input.addEventListener("change", function () {
    var v = parseInt(input.value, 10);
    if (v >= 0 && v < T) select(v);
  });
  var current = -1, group = [];
  function select(tile, tiles) {
    if (current >= 0) cells[current].classList.remove("sel");
    group.forEach(function (g) { cells[g].classList.remove("grp"); });
    group = tiles && tiles.length > 1 ? tiles : [];
    group.forEach(function (g) { cells[g].classList.add("grp"); });
    current = tile; cells[tile].classList.add("sel"); input.value = tile;
    renderTile(tile);
  }

  function label(s, text, x0, y0, w, h, id) {  // the part's name inside, if there is room
    var roomH = h >= 11 ? w - 4 : 0, roomV = w >= 12 ? h - 4 : 0;
    var across = roomH >= text.length * CHAR || roomH >= roomV;
    var fit = Math.floor((across ? roomH : roomV) / CHAR);
    var short = text.replace(/^layer \d+ /, "");  // too long: drop the layer (tooltip and table keep it)
    if (text.length > fit && short.length < text.length) text = short;
    if (fit < Math.min(text.length, 6)) return;
    var cx = x0 + w / 2, cy = y0 + h / 2, attrs = { x: cx, y: cy, "class": "lbl",
      "text-anchor": "middle", "dominant-baseline": "central", "data-buffer": id };
    if (!across) attrs.transform = "rotate(-90 " + cx + " " + cy + ")";
    s.appendChild(svg("text", attrs, text.length <= fit ? text : text.slice(0, fit - 1) + "\u2026"));
  }
  function hatch() {
    var defs = svg("defs", {}), pat = svg("pattern", { id: "hatch", width: 5, height: 5,
      patternUnits: "userSpaceOnUse", patternTransform: "rotate(45)" });
    pat.appendChild(svg("line", { x1: 0, y1: 0, x2: 0, y2: 5, stroke: "rgba(0,0,0,0.4)",
      "stroke-width": 1.5 }));
    defs.appendChild(pat);
    return defs;
  }
  function axes(s, x, TOP, rows, row) {
    D.address_ticks.forEach(function (o, i) {
      var xx = x(D.memory_base + o), last = i === D.address_ticks.length - 1;
      s.appendChild(svg("line", { x1: xx, x2: xx, y1: TOP, y2: TOP + rows, "class": "grid" }));
      var tx = svg("text", { x: xx, y: TOP + rows + 14, "class": "axis", "data-offset": o,
        "text-anchor": i === 0 ? "start" : last ? "end" : "middle" }, kib(o));
      tx.appendChild(svg("title", {}, hex(D.memory_base + o) + ", " + fmt(o) +
        " bytes from the memory base"));
      s.appendChild(tx);
    });
    for (var k = 0; k < S; k += Math.max(1, Math.ceil(S / 20))) {
      var st = svg("text", { x: 2, y: TOP + k * row + row - 2, "class": "axis" }, String(k));
      st.appendChild(svg("title", {}, D.steps[k] + " (" + D.step_parts[k] + ")"));
      s.appendChild(st);
    }
  }
  function drawMap(sig, sup, supText) {
    var W = 1000, L = 34, R = 10, TOP = 16, row = S > 40 ? 8 : 14;
    var rows = Math.max(S, 1) * row, H = TOP + rows + 22;
    function x(a) { return L + (a - D.memory_base) / span * (W - L - R); }
    var s = svg("svg", { viewBox: "0 0 " + W + " " + H, role: "img" });
    s.appendChild(svg("title", {}, "addresses (x, KiB from " + hex(D.memory_base) +
      ") by step (y)"));
    s.appendChild(hatch());
    axes(s, x, TOP, rows, row);
    var sw = x(D.memory_base + sup[0]) - L;
    var sr = svg("rect", { x: L, y: TOP, width: sw, height: rows, fill: SUPPORT });
    sr.appendChild(svg("title", {}, "support: " + human(sup[0]) + " (" + fmt(sup[0]) +
      " bytes): " + supText));
    s.appendChild(sr);
    label(s, "support", L, TOP, sw, rows, "support");
    sig.buffers.forEach(function (p) {
      var b = D.buffers[p[0]], a = p[1];
      if (b.first < 0) return;
      var x0 = x(a), w = Math.max(x(a + b.bytes) - x0, 1), y0 = TOP + b.first * row;
      var h = (b.last - b.first + 1) * row, box = { x: x0, y: y0, width: w, height: h };
      var r = svg("rect", Object.assign({ fill: fill(b), "class": "buf", "data-buffer": p[0] }, box));
      r.appendChild(svg("title", {}, b.part + " (" + b.name + "): " + human(b.bytes) + " (" +
        fmt(b.bytes) + " bytes) at " + hex(a) + ", steps " + b.first + "-" + b.last + ", " +
        memory(b) + " memory\n" + b.type));
      s.appendChild(r);
      if (b["class"] === INTER) {
        s.appendChild(svg("rect", Object.assign({ fill: "url(#hatch)", "class": "hatch" }, box)));
      }
      label(s, b.part, x0, y0, w, h, p[0]);
    });
    var xi = x(D.interleaved_base);
    s.appendChild(svg("line", { x1: xi, x2: xi, y1: 2, y2: TOP + rows, stroke: "#c00",
      "stroke-dasharray": "4 3" }));
    s.appendChild(svg("text", { x: xi + 4, y: 11, "class": "axis" },
      hex(D.interleaved_base) + " interleaved"));
    return s;
  }
  function key() {
    var p = el("p", {});
    add(p, [el("span", { "class": "key support" }), "support   ",
      el("span", { "class": "key" }), "standard memory   ",
      el("span", { "class": "key hatch" }), "interleaved memory (hatched)", el("br", {}),
      "Colour: one per buffer, named by its model part where there is room (hover for its " +
      "internal name, size and type). x: address in KiB from the memory base " +
      hex(D.memory_base) + "; y: step; dashed line: interleaved memory from " +
      hex(D.interleaved_base) + "."]);
    return p;
  }
  function addRow(table, attrs, swatch, cells) {
    var tr = el("tr", attrs), first = el("td", {});
    add(first, [swatch, cells[0]]);
    tr.appendChild(first);
    cells.slice(1).forEach(function (c) { tr.appendChild(c); });
    table.appendChild(tr);
  }
  function range(lo, bytes) {
    var a = lo - D.memory_base, b = a + bytes;
    return el("td", { "class": "num", title: hex(lo) + "-" + hex(lo + bytes) + " (" + lo + "-" +
      (lo + bytes) + ")" }, (a / 1024).toFixed(1) + "-" + (b / 1024).toFixed(1) + " KiB");
  }
  function sizeCell(n) { return add(el("td", { "class": "num" }), [size(n)]); }
  function bufferTable(sig, sup, supText) {
    var table = el("table", { id: "buffers" }), head = el("tr", {});
    ["model part", "buffer", "memory", "size", "address", "steps", "type"].forEach(function (h) {
      head.appendChild(el("th", {}, h));
    });
    table.appendChild(head);
    addRow(table, { "data-buffer": "support" }, el("span", { "class": "key support" }), ["support",
      el("td", { "class": "name" }, "support"), el("td", {}, "support"), sizeCell(sup[0]),
      range(D.memory_base, sup[0]), el("td", {}, "always"), el("td", { "class": "type" }, supText)]);
    sig.buffers.slice().sort(function (p, q) { return p[1] - q[1] || p[0] - q[0]; })
      .forEach(function (p) {
        var b = D.buffers[p[0]];
        var swatch = el("span", { "class": "key" + (b["class"] === INTER ? " hatch" : "") });
        swatch.style.backgroundColor = fill(b);
        addRow(table, { "data-buffer": p[0] }, swatch, [b.part,
          el("td", { "class": "name", title: b.description }, b.name), el("td", {}, memory(b)),
          sizeCell(b.bytes), range(p[1], b.bytes), el("td", { "class": "num" }, b.first +
          "-" + b.last), el("td", { "class": "type" }, b.type)]);
      });
    return table;
  }
  function renderTile(tile) {
    var am = document.getElementById("address-map");
    while (am.firstChild) am.removeChild(am.firstChild);
    am.setAttribute("data-tile", tile);
    var sup = D.supports[D.tile_support[tile]], sig = D.signatures[D.tile_signature[tile]];
    var supText = D.support_kinds.slice(1).map(function (k, j) {
      return k.replace(/_/g, " ") + " " + human(sup[j + 1]);
    }).join(", ");
    am.appendChild(el("h2", {}, "Address map of tile " + tile));
    var supParts = [];
    D.support_kinds.slice(1).forEach(function (k, j) {
      supParts.push(j ? ", " : "", k.replace(/_/g, " ") + " ", size(sup[j + 1]));
    });
    am.appendChild(add(el("p", {}), ["Peak ", size(peak[tile]), " (" + pct(peak[tile]) +
      ") at ", step(peakStep[tile]), "; " + sig.buffers.length + " buffers; support ",
      size(sup[0])].concat(supParts.length ? [": "].concat(supParts) : [])));
    am.appendChild(drawMap(sig, sup, supText));
    am.appendChild(key());
    am.appendChild(bufferTable(sig, sup, supText));
  }
  var m = /tile=(\d+)/.exec(location.hash);
  select(m && +m[1] < T ? +m[1] : top.tile);
  map.setAttribute("data-rendered", "1");
})();
"""
