"""``sweep.html``'s latency-throughput plot: one square per record that has throughput and a
latency (``latencyMicroseconds`` before ``deviceMicroseconds``), at the place its axis ticks
say, hover text naming the record, colours and a legend by strategy."""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET

import pytest

from ipu_stack.sweep.results import latency_plot, latency_us, write_page

SVG = "{http://www.w3.org/2000/svg}"


def _records() -> list[dict]:
    base = {"status": "ok", "cycles": 1000, "peakTileBytes": 2000, "point": {}}
    return [
        {**base, "key": "a", "imagesPerSecond": 1000.0, "latencyMicroseconds": 50.0,
         "deviceMicroseconds": 40.0, "strategy": "pipelined"},
        {**base, "key": "b", "imagesPerSecond": 2000.0, "deviceMicroseconds": 80.0,
         "strategy": "sharded", "cycles": 900},
        {**base, "key": "c", "imagesPerSecond": 3500.0, "deviceMicroseconds": 120.0,
         "peakTileBytes": 1500},
        {"key": "d", "status": "error", "error": "does not fit", "point": {}},
        {"key": "e", "status": "fail", "imagesPerSecond": 1500.0, "point": {}},
    ]


def _plot(page: str) -> ET.Element:
    match = re.search(r'<svg id="latency".*?</svg>', page, re.S)
    assert match
    return ET.fromstring(match.group(0))


def _axis(svg: ET.Element, cls: str, coordinate: str) -> list[tuple[float, float]]:
    """(value, position) of each tick on one axis."""
    return [(float(g.get("data-value")), float(g.find(f"{SVG}line").get(coordinate)))
            for g in svg.iter(f"{SVG}g") if g.get("class") == f"tick {cls}"]


def _points(svg: ET.Element) -> dict[str, ET.Element]:
    return {g.get("data-key"): g for g in svg.iter(f"{SVG}g") if g.get("class") == "point"}


def test_latency_prefers_the_measured_latency() -> None:
    records = _records()
    assert [latency_us(r) for r in records] == [50.0, 80.0, 120.0, None, None]


def test_one_point_per_record_where_its_ticks_say(tmp_path) -> None:
    path = tmp_path / "sweep.html"
    write_page(path, _records(), "t")
    page = path.read_text()
    svg = _plot(page)
    points = _points(svg)
    assert set(points) == {"a", "b", "c"} and svg.get("data-latency-points") == "3"
    xs, ys = _axis(svg, "x-tick", "x1"), _axis(svg, "y-tick", "y1")
    for ticks in (xs, ys):
        values = [v for v, _ in ticks]
        assert values == sorted(values) and len(set(values)) == len(values)
        assert [b - a for a, b in zip(values, values[1:], strict=False)] == pytest.approx(
            [values[1] - values[0]] * (len(values) - 1))  # evenly spaced
    assert xs[0][0] <= 1000 and xs[-1][0] >= 3500 and ys[0][0] <= 50 and ys[-1][0] >= 120
    assert xs[0][0] > 1000 - (xs[1][0] - xs[0][0])  # no empty tick interval at the ends
    assert ys[0][1] > ys[-1][1]  # latency grows upwards

    def place(ticks: list[tuple[float, float]], value: float) -> float:
        (v0, p0), (v1, p1) = ticks[0], ticks[-1]
        return p0 + (value - v0) * (p1 - p0) / (v1 - v0)

    for key, (x, y) in {"a": (1000, 50), "b": (2000, 80), "c": (3500, 120)}.items():
        cx, cy = map(float, re.fullmatch(r"translate\(([-\d.]+),([-\d.]+)\)",
                                         points[key].get("transform")).groups())
        assert (cx, cy) == pytest.approx((place(xs, x), place(ys, y)), abs=0.01)
        title = "".join(points[key].find(f"{SVG}title").itertext())
        assert title.startswith(f"{key}: ") and "images/s" in title
    texts = {t.get("class"): "".join(t.itertext()) for t in svg.iter(f"{SVG}text")}
    assert texts["axis-label x-label"] == "throughput (images per second)"
    assert texts["axis-label y-label"] == "latency (microseconds)"
    assert 'id="pareto"' in page
    # the Pareto plot's circles are drawn by the page's script (the browser test counts
    # them); this plot uses squares so that count stays the Pareto plot's
    assert "<circle" not in page


def test_points_are_coloured_by_strategy_with_a_legend() -> None:
    svg = ET.fromstring(latency_plot(_records()))
    legend = {g.get("data-strategy"): g.find(f"{SVG}rect").get("fill")
              for g in svg.iter(f"{SVG}g") if g.get("class") == "legend-item"}
    assert list(legend) == ["pipelined", "sharded", "(no strategy)"]
    assert len(set(legend.values())) == 3
    fills = {k: g.find(f"{SVG}rect").get("fill") for k, g in _points(svg).items()}
    assert fills == {"a": legend["pipelined"], "b": legend["sharded"],
                     "c": legend["(no strategy)"]}
    plain = [{k: v for k, v in r.items() if k != "strategy"} for r in _records()]
    svg = ET.fromstring(latency_plot(plain))
    assert not [g for g in svg.iter(f"{SVG}g") if g.get("class") == "legend-item"]


def test_no_plottable_records_is_an_empty_frame() -> None:
    svg = ET.fromstring(latency_plot([r for r in _records() if r["key"] in "de"]))
    assert svg.get("data-latency-points") == "0" and not _points(svg)
