"""Memory reports: the profile against brute force, JSON round trip, the placement page.

The profile's numbers are checked against a plain loop over buffers (independent of the
matrix products the module uses), and the page's embedded data against the placement it
was made from.  A headless Chromium run checks that the page's own JS renders the map.
"""

from __future__ import annotations

import json
import logging
import time
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from ipu_stack.lowering.driver import lower
from ipu_stack.lowering.program import ComputeSet, Program
from ipu_stack.memory.placement import Placement, place_storage
from ipu_stack.memory.report import (
    memory_profile,
    placement_html,
    write_memory_profile,
    write_placement_html,
)
from ipu_stack.memory.support import support_bytes
from ipu_stack.planning.gemm import gemm_candidates
from ipu_stack.planning.stages import find_stages
from ipu_stack.target import IPU21, MemoryClass
from ipu_stack.workloads.mlp import build_mlp
from tests.chromium import headless
from tests.memory.shapes import stage_shape

STD, INT = MemoryClass.STANDARD, MemoryClass.INTERLEAVED
MLP = {"batch": 1, "tokens": 16, "dim": 64, "hidden": 128, "blocks": 1, "precision": "fp8",
       "biases": False, "seed": 0}


def hand_program() -> tuple[Program, Placement, dict[str, np.ndarray]]:
    """Four steps, four buffers on tiles 0-5; one never touched, one with a hostile type."""
    program = Program()
    program.initialize = [ComputeSet("load")]
    program.run = [ComputeSet("a"), ComputeSet("b"), ComputeSet("c")]
    spec = [("a", [0, 1, 2], 4096, STD, 0, 2), ("b", [1, 2], 8192, INT, 1, 3),
            ("c", [2], 1000, STD, 3, 3), ("d", [5], 16, STD, -1, -1)]
    for name, tiles, nbytes, cls, first, last in spec:
        bid = program.add_buffer(name, np.array(tiles), nbytes, cls, f"{name} </script><!-- &")
        program.buffers[bid].first, program.buffers[bid].last = first, last
    total = np.full(IPU21.tiles, 1024, dtype=np.int64)
    total[2] = 2048
    support = {"runtime": total - 24, "host": np.full(IPU21.tiles, 24), "total": total}
    return program, place_storage(program, total, IPU21), support


@pytest.fixture(scope="module")
def lowered() -> tuple[Program, Placement, dict[str, np.ndarray]]:
    graph, _ = build_mlp(MLP)
    stages = find_stages(graph)
    plans = [(s, gemm_candidates(stage_shape(graph, s), IPU21, keep=1)[0]) for s in stages]
    program = lower(graph, plans, IPU21)
    tables = np.arange(IPU21.tiles, dtype=np.int64) % 7 * 40  # varied support per tile
    support = support_bytes(program, tables, IPU21)
    return program, place_storage(program, support["total"], IPU21), support


def brute_force(program: Program, support: np.ndarray) -> np.ndarray:
    """Support plus live bytes ``[steps, tiles]`` by looping over buffers, tiles and steps."""
    steps = len(program.initialize) + len(program.run)
    total = np.tile(np.asarray(support, dtype=np.int64), (steps, 1))
    for buffer in program.buffers:
        for tile in buffer.tiles.tolist():
            for step in range(buffer.first, buffer.last + 1):
                if step >= 0:
                    total[step, tile] += buffer.nbytes
    return total


def check_against_brute_force(program: Program, placement: Placement) -> dict[str, Any]:
    profile = memory_profile(program, placement, IPU21, "test")
    total = brute_force(program, placement.support_bytes)
    step, tile = np.unravel_index(int(total.argmax()), total.shape)
    assert profile["effective_peak_bytes"] == total.max() == placement.peak_bytes.max()
    assert (profile["peak_step"], profile["peak_tile"]) == (step, tile)
    assert profile["support_bytes"] == placement.support_bytes[tile]
    classes = profile["by_class"]
    live = np.array(classes[STD.value]) + np.array(classes[INT.value])
    np.testing.assert_array_equal(live + placement.support_bytes[tile], total[:, tile])
    peaks = total.max(axis=0)
    np.testing.assert_array_equal(peaks, placement.peak_bytes)
    assert profile["tile_peaks"]["max"] == peaks.max()
    assert profile["tile_peaks"]["min"] == peaks.min()
    for row in profile["busiest_tiles"]:
        assert row["peak_bytes"] == peaks[row["tile"]]
        assert total[row["peak_step"], row["tile"]] == row["peak_bytes"]
    listed = [row["peak_bytes"] for row in profile["busiest_tiles"]]
    assert listed == sorted(peaks.tolist(), reverse=True)[:16]
    assert len(profile["steps"]) == total.shape[0]
    return profile


def test_hand_program_profile_by_hand_and_brute_force() -> None:
    program, placement, _ = hand_program()
    profile = check_against_brute_force(program, placement)
    assert profile["steps"] == ["initialize/0 ComputeSet load", "run/1 ComputeSet a",
                                "run/2 ComputeSet b", "run/3 ComputeSet c"]
    assert (profile["peak_step"], profile["peak_tile"]) == (1, 2)
    assert profile["effective_peak_bytes"] == 2048 + 4096 + 8192
    assert profile["by_class"] == {STD.value: [4096, 4096, 4096, 1000],
                                   INT.value: [0, 8192, 8192, 8192]}
    assert profile["tile_peaks"] == {"min": 1024, "median": 1024, "max": 14336}
    assert profile["busiest_tiles"][:3] == [
        {"tile": 2, "peak_bytes": 14336, "peak_step": 1},
        {"tile": 1, "peak_bytes": 13312, "peak_step": 1},
        {"tile": 0, "peak_bytes": 5120, "peak_step": 0},
    ]
    assert profile["busiest_tiles"][3]["tile"] == 3  # ties broken by tile number


def test_lowered_program_profile_matches_brute_force(lowered: Any) -> None:
    program, placement, _ = lowered
    check_against_brute_force(program, placement)


def test_write_memory_profile_round_trips_and_logs(
    tmp_path: Path, lowered: Any, caplog: pytest.LogCaptureFixture
) -> None:
    program, placement, _ = lowered
    path = tmp_path / "reports" / "memory.json"
    with caplog.at_level(logging.INFO, logger="ipu_stack.memory"):
        profile = write_memory_profile(path, program, placement, IPU21)
    text = path.read_text()
    assert json.loads(text) == profile
    assert text == json.dumps(profile, sort_keys=True, indent=1) + "\n"
    assert profile["scope"] == "final" and profile["target"] == "ipu21"
    assert profile["tiles"] == 1472
    assert list(tmp_path.joinpath("reports").iterdir()) == [path]  # no temporary left behind
    message = caplog.records[-1].getMessage()
    assert message.startswith("wrote planner memory profile path=")
    assert f"effective_peak_bytes={profile['effective_peak_bytes']}" in message


def test_profile_is_fast_at_full_size() -> None:
    """1472 tiles x 60 buffers x 30 steps, every tile a distinct placement."""
    rng = np.random.default_rng(0)
    program = Program()
    program.run = [ComputeSet(f"s{i}") for i in range(30)]
    addresses = np.full((60, IPU21.tiles), -1, dtype=np.int64)
    for i in range(60):
        tiles = np.flatnonzero(rng.random(IPU21.tiles) < 0.5)
        program.add_buffer(f"b{i}", tiles, int(rng.integers(1, 4000)) * 8,
                           INT if i % 3 else STD, "random")
        first = int(rng.integers(0, 30))
        program.buffers[i].first, program.buffers[i].last = first, int(rng.integers(first, 30))
        addresses[i, tiles] = IPU21.memory_base + 8 * rng.integers(0, 1000, len(tiles))
    support = np.full(IPU21.tiles, 8192, dtype=np.int64)
    placement = Placement(addresses, support, np.zeros_like(support), np.zeros_like(support))
    start = time.perf_counter()
    profile = memory_profile(program, placement, IPU21, "bench")
    assert time.perf_counter() - start < 1.0
    assert profile["effective_peak_bytes"] == brute_force(program, support).max()
    page = placement_html(program, placement, {"total": support}, IPU21, "bench")
    assert 'id="tile-map"' in page


class Page(HTMLParser):
    """Elements with an id, the embedded JSON, and everything inside one tracked element."""

    VOID = {"area", "base", "br", "col", "embed", "hr", "img", "input", "link", "meta",
            "source", "track", "wbr"}

    def __init__(self, track: str = "address-map") -> None:
        super().__init__()
        self.track, self.depth = track, 0
        self.ids: dict[str, dict[str, str | None]] = {}
        self.inside: list[tuple[str, dict[str, str | None]]] = []
        self.text: list[str] = []
        self.data, self.in_data = "", False
        self.tags = 0
        self.root: dict[str, str | None] = {}

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags += 1
        found = dict(attrs)
        if tag == "html":
            self.root = found
        if found.get("id"):
            self.ids[str(found["id"])] = found
        self.in_data = found.get("id") == "placement-data"
        if self.depth:
            self.inside.append((tag, found))
        if self.depth or found.get("id") == self.track:
            self.depth += tag not in self.VOID

    def handle_endtag(self, tag: str) -> None:
        self.in_data = False
        if self.depth and tag not in self.VOID:
            self.depth -= 1

    def handle_data(self, data: str) -> None:
        if self.in_data:
            self.data += data
        if self.depth:
            self.text.append(data)


def parse(text: str) -> Page:
    page = Page()
    page.feed(text)
    page.close()
    return page


def test_placement_html_embeds_the_placement(lowered: Any) -> None:
    program, placement, support = lowered
    title = "<script>alert(1)</script> & co"
    text = placement_html(program, placement, support, IPU21, title)
    assert "<script>alert" not in text
    page = parse(text)
    assert {"tile-map", "address-map", "busiest", "legend", "placement-data"} <= set(page.ids)
    assert "http://" not in text.replace("http://www.w3.org/2000/svg", "")
    assert "https://" not in text
    data = json.loads(page.data)
    assert data["title"] == title and data["tiles"] == IPU21.tiles == len(data["tile_signature"])
    assert len(data["signatures"]) < 64 < IPU21.tiles  # compact: one entry per placement
    profile = memory_profile(program, placement, IPU21, "final")
    assert data["steps"] == profile["steps"]
    peaks = []
    for tile in range(IPU21.tiles):
        sig = data["signatures"][data["tile_signature"][tile]]
        want = {(b, int(placement.addresses[b, tile]))
                for b in np.flatnonzero(placement.addresses[:, tile] >= 0).tolist()}
        assert {tuple(p) for p in sig["buffers"]} == want
        row = data["supports"][data["tile_support"][tile]]
        assert row[0] == placement.support_bytes[tile]
        assert row[data["support_kinds"].index("code")] == support["code"][tile]
        peaks.append(row[0] + sig["live_peak"])
    np.testing.assert_array_equal(peaks, placement.peak_bytes)
    assert data["busiest"][:16] == profile["busiest_tiles"]
    assert len(data["busiest"]) == 32
    assert [b["name"] for b in data["buffers"]] == [b.name for b in program.buffers]


def test_hostile_descriptions_stay_inert(tmp_path: Path) -> None:
    program, placement, support = hand_program()
    path = tmp_path / "placement.html"
    write_placement_html(path, program, placement, support, IPU21, "hand")
    page = parse(path.read_text())
    data = json.loads(page.data)
    assert data["buffers"][0]["description"] == "a </script><!-- &"
    assert data["support_kinds"] == ["total", "runtime", "host"]


def run_chromium(path: Path, tmp_path: Path, fragment: str = "") -> Page:
    page = parse(headless(tmp_path, "--dump-dom", path.as_uri() + fragment).stdout)
    assert "data-js-error" not in page.root, page.root.get("data-js-error")
    assert page.ids["tile-map"].get("data-rendered") == "1"
    return page


def test_page_renders_in_headless_chromium(tmp_path: Path, lowered: Any) -> None:
    program, placement, support = lowered
    path = tmp_path / "placement.html"
    write_placement_html(path, program, placement, support, IPU21, "mlp")
    page = run_chromium(path, tmp_path)
    assert page.tags > IPU21.tiles  # the 1472 cells exist only once the JS has run
    busiest = memory_profile(program, placement, IPU21, "final")["busiest_tiles"][0]["tile"]
    assert page.ids["address-map"].get("data-tile") == str(busiest)
    rows = {a["data-buffer"] for tag, a in page.inside if tag == "tr" and "data-buffer" in a}
    on_tile = {str(b) for b in np.flatnonzero(placement.addresses[:, busiest] >= 0).tolist()}
    assert rows == on_tile | {"support"}
    text = " ".join(page.text)
    for b in on_tile:
        assert program.buffers[int(b)].name in text


def test_page_selects_tile_from_fragment(tmp_path: Path) -> None:
    program, placement, support = hand_program()
    path = tmp_path / "hand.html"
    write_placement_html(path, program, placement, support, IPU21, "hand")
    page = run_chromium(path, tmp_path, "#tile=1")
    assert page.ids["address-map"].get("data-tile") == "1"
    rects = {a.get("data-buffer") for tag, a in page.inside if tag == "rect"}
    assert rects == {None, "0", "1"}  # support (no id), a and b
    assert "0x80000 interleaved" in " ".join(page.text)
