"""``report.html``'s plots on a small synthetic profile whose numbers are known by hand: the
superstep chart's axis, ticks, legend and hover titles; the heat map's binning (40 tiles in
bins of 16: three bins, the last of 8), its values, axes, colour scale and tracks; and a big
profile stays a small page.  One headless-Chromium check that the page's script paints the
binned map (skipped without Chromium)."""

from __future__ import annotations

import base64
import re
import xml.etree.ElementTree as ET

import numpy as np
import pytest

from ipu_stack.profile.record import Profile, Step
from ipu_stack.profile.report import (
    COLOURS,
    heat_bins,
    heat_bytes,
    heat_map,
    report_html,
    superstep_chart,
)
from ipu_stack.profile.summary import summary
from ipu_stack.util.html import nice_domain, nice_ticks, tick_label

SVG = "{http://www.w3.org/2000/svg}"


def _step(index: int, name: str, kind: str, start: int, cycles: int, sync: int,
          tiles: dict[range, int], count: int = 40) -> Step:
    per_tile = np.zeros(count, dtype=np.int64)
    for span, value in tiles.items():
        per_tile[span.start:span.stop] = value
    return Step(index, name, kind, start, cycles, sync, per_tile)


def _profile(extra_steps: int = 0) -> Profile:
    """40 tiles; ``alpha`` (compute, 100 cycles, no sync): tiles 0-15 busy throughout, 16-31
    half, 32-39 a quarter; a host write; ``beta`` (exchange, 200 cycles after its 20-cycle
    sync): tile 0 busy throughout, tile 39 reports 400 (capped at the superstep's 200), the
    rest idle."""
    steps = [_step(0, "alpha", "compute", 0, 100, 0,
                   {range(0, 16): 100, range(16, 32): 50, range(32, 40): 25}),
             Step(1, "write x", "host_write", 100, 0, 0, None),
             _step(2, "beta", "exchange", 120, 200, 20, {range(0, 1): 200, range(39, 40): 400})]
    start = 320
    for i in range(extra_steps):
        steps.append(_step(3 + i, f"gamma{i}", "compute", start, 50, 0, {range(0, 40): 50}))
        start += 50
    return Profile("synthetic", "ipu", 40, 1.5e9, start, 100, 200, 20, 0, 0, steps)


def _svg(page: str, ident: str) -> ET.Element:
    match = re.search(rf'<svg id="{ident}".*?</svg>', page, re.S)
    assert match, f"no svg #{ident}"
    return ET.fromstring(match.group(0))


def _ticks(svg: ET.Element, cls: str = "tick") -> list[tuple[float, ET.Element]]:
    return [(float(g.get("data-value")), g) for g in svg.iter(f"{SVG}g")
            if cls in (g.get("class") or "").split()]


def _texts(svg: ET.Element, cls: str) -> list[str]:
    return ["".join(t.itertext()) for t in svg.iter(f"{SVG}text")
            if cls in (t.get("class") or "").split()]


def test_tick_helpers_give_round_increasing_values_covering_the_data() -> None:
    assert nice_ticks(0, 330, 8, integer=True) == [0, 50, 100, 150, 200, 250, 300]
    assert nice_ticks(0, 3, 8, integer=True) == [0, 1, 2, 3]  # never half a superstep
    domain = nice_domain(19.503, 19.527)
    assert domain[0] <= 19.503 and domain[-1] >= 19.527
    assert np.allclose(np.diff(domain), domain[1] - domain[0])
    assert tick_label(30000) == "30\u2009000" and tick_label(19.525, 0.005) == "19.525"


def test_superstep_chart_has_a_cycles_axis_microseconds_legend_and_titles() -> None:
    profile = _profile()
    svg = ET.fromstring(superstep_chart(profile))
    ticks = _ticks(svg)
    values = [v for v, _ in ticks]
    assert values == sorted(values) and values[0] == 0
    step = values[1] - values[0]
    assert values[-1] <= profile.cycles < values[-1] + step  # the ticks span the whole run
    # a tick sits where the bars put its cycle: linear from the run's start to its end
    xs = [float(g.find(f"{SVG}line").get("x1")) for _, g in ticks]
    scale = (xs[1] - xs[0]) / step
    bars = [r for r in svg.iter(f"{SVG}rect") if r.get("class") == "bar"]
    assert [float(r.get("x")) for r in bars] == pytest.approx(
        [xs[0], xs[0] + 120 * scale], abs=0.02)
    assert float(bars[0].get("width")) == pytest.approx(100 * scale, abs=0.02)
    # the second row of tick labels is microseconds at 1.5 GHz
    us = ["".join(g.find(f"{SVG}text[@class='tick-us']").itertext()) for _, g in ticks]
    assert [float(u) for u in us] == pytest.approx([v / 1.5e9 * 1e6 for v in values], rel=0.01)
    assert us[2] == "0.0667"  # two digits finer than the ticks' spacing of 0.0333 us
    assert "cycles" in _texts(svg, "x-label")[0] and "1.5 GHz" in _texts(svg, "x-label")[0]
    assert _texts(svg, "y-label") == ["superstep kind"]
    legend = {g.get("data-kind"): g.find(f"{SVG}rect").get("fill") for g in svg.iter(f"{SVG}g")
              if g.get("class") == "legend-item"}
    assert legend == COLOURS
    titles = ["".join(r.find(f"{SVG}title").itertext()) for r in bars]
    # one numbering: beta is the profile's step 2 (after a host write) but superstep 1
    assert titles[0].startswith("superstep 0: alpha (alpha), compute, 100 cycles")
    assert titles[1].startswith("superstep 1: beta (beta), exchange, 200 cycles")
    assert svg.get("data-bars") == "2"


def test_heat_bins_bin_tiles_by_sixteen_with_a_partial_last_bin() -> None:
    bins = heat_bins(_profile())
    assert bins.tile_edges == [0, 16, 32, 40] and bins.step_edges == [0, 1, 2]
    assert bins.values.shape == (3, 2)  # tiles down, supersteps across
    assert bins.values[:, 0] == pytest.approx([1.0, 0.5, 0.25])
    # beta: one of 16 tiles busy; tile 39's 400 cycles count as 200 in a bin of 8 tiles
    assert bins.values[:, 1] == pytest.approx([1 / 16, 0.0, 1 / 8])
    assert bins.tile_labels == ["tiles 0-15", "tiles 16-31", "tiles 32-39"]
    assert bins.step_labels == ["superstep 0: alpha", "superstep 1: beta"]
    assert bins.cycle_edges == [0, 100, 320]  # each column as long as its supersteps run
    assert heat_bytes(bins.values).tolist() == [[255, 16], [128, 0], [64, 32]]


def test_heat_bins_bin_supersteps_past_the_column_limit_weighting_by_length() -> None:
    bins = heat_bins(_profile(extra_steps=3), max_columns=2)  # 5 supersteps, 3 a column
    assert bins.step_edges == [0, 3, 5]
    assert bins.step_labels == ["supersteps 0-2: alpha .. gamma0", "supersteps 3-4: gamma1 .. gamma2"]
    assert bins.cycle_edges == [0, 370, 470]  # gamma0-2 start at 320, 370, 420
    # column 0: (alpha 100 + beta 200 + gamma0 50) cycles; tiles 0-15 busy 100 + 200/16 + 50
    assert bins.values[:, 0] == pytest.approx([(1600 + 200 + 800) / (16 * 350),
                                               (800 + 0 + 800) / (16 * 350),
                                               (200 + 200 + 400) / (8 * 350)])
    assert bins.values[:, 1] == pytest.approx([1.0, 1.0, 1.0])
    assert heat_bytes(np.array([1e-4])).tolist() == [1]  # any work is never drawn blank


def test_heat_map_axes_scale_and_data() -> None:
    profile = _profile()
    block, data = heat_map(profile)
    svg = _svg(block, "heat-axes")
    assert (svg.get("data-rows"), svg.get("data-columns")) == ("3", "2")
    tiles = [v for v, _ in _ticks(svg, "y-tick")]
    assert tiles == sorted(tiles) and tiles[0] == 0 and tiles[-1] <= 40 < tiles[-1] + tiles[1]
    # the chart's time axis: cycles, at the chart's x for the same cycle
    cycles = [v for v, _ in _ticks(svg, "x-tick")]
    assert cycles == [0, 50, 100, 150, 200, 250, 300]
    chart = ET.fromstring(superstep_chart(profile))
    assert [float(g.find(f"{SVG}line").get("x1")) for _, g in _ticks(svg, "x-tick")] == [
        float(g.find(f"{SVG}line").get("x1")) for _, g in _ticks(chart)]
    assert _texts(svg, "y-label") == ["tile (16 per row)"]
    assert _texts(svg, "x-label")[0].startswith("cycles from the start of the run")
    scale = [v for v, _ in _ticks(svg, "scale-tick")]
    assert scale == [0, 25, 50, 75, 100]
    assert "0 %" in block and "100 %" in block and "mean" in _texts(svg, "scale-label")[0]
    assert base64.b64decode(data["cells"]) == bytes([255, 16, 128, 0, 64, 32])
    assert data["stepLabels"] == ["superstep 0: alpha", "superstep 1: beta"]
    assert data["tileEdges"] == [0, 16, 32, 40] and data["supersteps"] == 2
    assert data["cycleEdges"] == [0, 100, 320] and data["cycles"] == 320
    assert '<canvas id="heat-map"' in block and 'id="heat-hover"' in block


def test_tracks_draw_a_line_at_each_inner_edge_and_a_label() -> None:
    profile = _profile()
    block, _ = heat_map(profile, tracks=[("stage 0", range(0, 24)), ("stage 1", range(24, 40))])
    svg = _svg(block, "heat-axes")
    lines = [ln for ln in svg.iter(f"{SVG}line") if ln.get("class") == "track-separator"]
    assert [ln.get("data-tile") for ln in lines] == ["24", "24"]
    frame = next(r for r in svg.iter(f"{SVG}rect") if r.get("class") == "frame")
    top, height = float(frame.get("y")), float(frame.get("height"))
    assert float(lines[0].get("y1")) == pytest.approx(top + height * 24 / 40, abs=0.06)
    assert _texts(svg, "track-label") == ["stage 0 (0-23)", "stage 1 (24-39)"]
    assert "track-separator" not in heat_map(profile)[0]
    with pytest.raises(ValueError, match="not within the 40 tiles"):
        heat_map(profile, tracks=[("too far", range(30, 41))])


def test_a_deep_profile_is_binned_and_stays_a_small_page() -> None:
    tiles, count = 1472, 1500
    rng = np.random.default_rng(0)
    steps = [Step(i, f"s{i}", "compute" if i % 2 else "exchange", 100 * i, 100, 0,
                  rng.integers(0, 101, tiles)) for i in range(count)]
    profile = Profile("deep", "ipu", tiles, 1.5e9, 100 * count, 0, 0, 0, 0, 0, steps)
    bins = heat_bins(profile)
    assert bins.values.shape == (92, 300) and bins.step_edges[1] == 5
    page = report_html(profile)
    assert len(page) < 3_000_000
    assert _svg(page, "heat-axes").get("data-columns") == "300"


def test_the_page_paints_the_binned_map_in_headless_chromium(tmp_path) -> None:
    from tests.chromium import rendered_dom

    page = tmp_path / "report.html"
    # after the page's script: hover the middle of the cell of tiles 32-39 in superstep 1
    hover = """<script>
      var canvas = document.getElementById("heat-map"), box = canvas.getBoundingClientRect();
      canvas.dispatchEvent(new MouseEvent("mousemove", {clientX: box.left + box.width * 0.75,
                                                        clientY: box.top + box.height * 5 / 6}));
    </script>"""
    text = report_html(_profile(), tracks=[("stage 0", range(0, 24))])
    page.write_text(text.replace("</body>", hover + "</body>"))
    dom = rendered_dom(tmp_path, page.as_uri())
    canvas = re.search(r"<canvas[^>]*>", dom).group(0)
    assert 'data-rendered="1"' in canvas and 'width="1100"' in canvas and 'height="3"' in canvas
    assert 'data-cells="80"' in canvas  # 2 supersteps x 40 tiles
    assert 'data-painted="64"' in canvas  # every bin but tiles 16-31 in beta (16 cells)
    expected = "superstep 1: beta; tiles 32-39: 13 % busy"  # 32 of 255 (1/8, rounded up)
    assert f'title="{expected}"' in canvas and f">{expected}</p>" in dom


def test_wide_bars_carry_their_model_part_and_narrow_ones_do_not() -> None:
    steps = [Step(0, "stage3.gemm", "compute", 0, 9000, 0, None, part="layer 3 mlp fc1 gemm"),
             Step(1, "stage3.reduce", "exchange", 9000, 900, 0, None,
                  part="layer 3 mlp fc1 reduce"),
             Step(2, "stage4.copy", "compute", 9900, 10, 0, None, part="layer 3 mlp fc2 copy")]
    profile = Profile("labels", "ipu", 4, 1.5e9, 9910, 9010, 900, 0, 0, 0, steps)
    svg = ET.fromstring(superstep_chart(profile))
    labels = _texts(svg, "bar-label")
    # 9000 of 9910 cycles over 1100 px: the whole part; 900 cycles (100 px, 15 letters):
    # without its layer; 10 cycles (1 px): none
    assert labels == ["layer 3 mlp fc1 gemm", "mlp fc1 reduce"]
    titles = ["".join(r.find(f"{SVG}title").itertext()) for r in svg.iter(f"{SVG}rect")
              if r.get("class") == "bar"]
    assert titles[2].startswith("superstep 2: layer 3 mlp fc2 copy (stage4.copy)")


def test_the_page_numbers_supersteps_one_way_and_keeps_host_time_apart() -> None:
    profile = _profile()
    profile.host_cycles, profile.host_bytes = 900, 4096
    page = report_html(profile)
    split = re.search(r'<table id="split">.*?</table>', page, re.S).group(0)
    rows = re.findall(r"<tr><td>(\w+)</td><td>[\d,]+</td><td>([\d.]+) %</td></tr>", split)
    assert [r[0] for r in rows] == ["compute", "exchange", "sync"]
    assert "host" not in split  # the run's shares sum to the run
    assert 'id="host">Host transfers, outside the run: 900 cycles' in page
    longest = re.search(r'<table id="longest">.*?</table>', page, re.S).group(0)
    assert re.search(r"<tr><td>1</td><td>beta</td><td>beta</td><td>220</td>", longest)
    assert "superstep 1: beta" in page and "superstep 2" not in page


def test_the_heat_map_draws_columns_as_wide_as_their_cycles_in_chromium(tmp_path) -> None:
    from tests.chromium import rendered_dom

    page = tmp_path / "report.html"
    # read back painted pixels of the tiles 0-15 row: alpha (cycles 0-100) is fully busy
    # there, beta (100-320, its sync first) one tile in 16; the boundary sits at 100/320 of
    # 1100 px
    probe = """<script>
      var canvas = document.getElementById("heat-map"), ctx = canvas.getContext("2d");
      var shade = [300, 380, 1000].map(function (x) { return ctx.getImageData(x, 0, 1, 1).data[0]; });
      document.body.setAttribute("data-shade", shade.join(","));
    </script>"""
    page.write_text(report_html(_profile()).replace("</body>", probe + "</body>"))
    dom = rendered_dom(tmp_path, page.as_uri())
    shade = [int(v) for v in re.search(r'data-shade="([\d,]+)"', dom).group(1).split(",")]
    assert shade[0] == 8  # the full colour #08306b's red at x=300 (alpha)
    assert shade[1] > 200 and shade[2] == shade[1]  # beta's light shade from x=380 to the end


def test_every_pass_of_a_loop_has_its_own_number() -> None:
    """A loop body's steps run once a pass with the same program index: numbers follow the
    order they ran, so the chart, the tables and the heat map agree."""
    steps, start = [], 0
    for layer in range(3):
        for index, kind in ((5, "compute"), (6, "exchange")):
            steps.append(Step(index, f"stage{index}.x (layer {layer})", kind, start, 100, 0,
                              None, part=f"layer {layer} part {index}"))
            start += 100
    profile = Profile("loop", "ipu", 4, 1.5e9, start, 300, 300, 0, 0, 0, steps)
    assert sorted(profile.superstep_numbers().values()) == list(range(6))
    svg = ET.fromstring(superstep_chart(profile))
    numbers = [int(r.get("data-number")) for r in svg.iter(f"{SVG}rect")
               if r.get("class") == "bar"]
    assert numbers == list(range(6))
    data = summary(profile)
    assert [e["number"] for e in data["exchanges"]] == [1, 3, 5]
    assert [e["number"] for e in data["longest"]] == [0, 1, 2]  # equal lengths: run order
