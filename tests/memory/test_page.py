"""The placement page as a person reads it: the layout in words, the busiest tiles grouped,
KiB ticks, buffers named by model part.

The pure pieces (``BlockLayout.human``, ``busiest_groups``, ``kib_ticks``, ``unplaced``) are
checked against hand-computed values; the rendered page (headless Chromium, skipped without
it) on a lowered MLP against its own placement, grouped here by a plain dict, independently
of the module's numpy grouping.
"""

from __future__ import annotations

import re
from dataclasses import replace
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from ipu_stack.ir.layout import BlockLayout
from ipu_stack.ir.names import step_label
from ipu_stack.ir.precision import F16, F32, f143, f152
from ipu_stack.lowering.driver import lower
from ipu_stack.memory.placement import place_storage
from ipu_stack.memory.report import (
    buffer_rows,
    busiest_groups,
    kib_ticks,
    unplaced,
    write_placement_html,
)
from ipu_stack.memory.support import support_bytes
from ipu_stack.planning.gemm import gemm_candidates
from ipu_stack.planning.stages import find_stages, stage_parts
from ipu_stack.target import IPU21
from ipu_stack.workloads.mlp import build_mlp
from tests.chromium import rendered_dom
from tests.memory.shapes import stage_shape
from tests.memory.test_report import MLP, hand_program

# the MLP at SigLIP's sizes: buffers tens of KiB wide, big enough to be named on the map
WIDE = {**MLP, "tokens": 729, "dim": 1152, "hidden": 4304}
SPAN = IPU21.memory_end - IPU21.memory_base  # 637,872 bytes: 622.9 KiB
KIB = 1024


def grid(*shape: int) -> np.ndarray:
    return np.arange(int(np.prod(shape)), dtype=np.int32).reshape(shape)


def test_human_names_shape_precision_grid_tiles_and_replicas() -> None:
    fc1 = BlockLayout(729, 1152, f143(-4), 184, 288, grid(4, 4, 90))
    assert fc1.human() == ("[729, 1152] FP8 F143 × 2^-4, 4 × 4 blocks of 184 × 288 over "
                           "1,440 tiles, 90 replicas")
    assert fc1.describe().startswith("TensorTiling { tile_count: 1440, replicas: 90, axes:")
    one = BlockLayout(1, 64, F16, 1, 64, np.array([[[7]]], dtype=np.int32))
    assert one.human() == "[1, 64] F16, 1 block of 1 × 64 over 1 tile, 1 replica"
    # a scale exponent of 0 is left out; a tile holding two blocks counts once
    shared = BlockLayout(10, 8, f152(0), 5, 8, np.array([[[3, 4]], [[4, 9]]], dtype=np.int32))
    assert shared.human() == "[10, 8] FP8 F152, 2 × 1 blocks of 5 × 8 over 3 tiles, 2 replicas"
    wide = BlockLayout(3, 40, F32, 3, 16, grid(1, 3, 1))
    assert wide.human() == "[3, 40] F32, 1 × 3 blocks of 3 × 16 over 3 tiles, 1 replica"
    assert BlockLayout(2, 4, f143(5), 2, 4, grid(1, 1, 2)).human() == (
        "[2, 4] FP8 F143 × 2^5, 1 block of 2 × 4 over 2 tiles, 2 replicas")


def test_busiest_groups_put_equal_peak_and_step_on_one_row() -> None:
    peaks = np.array([5, 9, 9, 7, 9, 7, 1])
    steps = np.array([0, 2, 2, 1, 3, 1, 0])
    assert busiest_groups(peaks, steps, 3) == [
        {"tiles": [1, 2], "peak_bytes": 9, "peak_step": 2},
        {"tiles": [4], "peak_bytes": 9, "peak_step": 3},  # same peak, other step: own row
        {"tiles": [3, 5], "peak_bytes": 7, "peak_step": 1},
    ]
    every = busiest_groups(peaks, steps, 100)
    assert [g["tiles"] for g in every] == [[1, 2], [4], [3, 5], [0], [6]]
    assert busiest_groups(np.array([], dtype=np.int64), np.array([], dtype=np.int64), 4) == []


def test_kib_ticks_are_power_of_two_kib_and_end_on_the_memory_size() -> None:
    assert kib_ticks(SPAN, 5) == [0, 128 * KIB, 256 * KIB, 384 * KIB, 512 * KIB, SPAN]
    # 576 KiB is 46.9 KiB short of the end, under 0.8 of a 64 KiB step: dropped
    assert kib_ticks(SPAN, 10) == [k * 64 * KIB for k in range(9)] + [SPAN]
    assert kib_ticks(100, 5) == [0, 100]
    assert kib_ticks(0, 5) == [0]


def test_unplaced_counts_buffers_and_tiles_without_an_address() -> None:
    program, placement, _ = hand_program()
    assert unplaced(program, placement) == {"buffers": 0, "pairs": 0}
    addresses = placement.addresses.copy()
    addresses[0, [0, 2]] = -1  # buffer a is on tiles 0-2
    addresses[2, 2] = -1
    missing = replace(placement, addresses=addresses)
    assert unplaced(program, missing) == {"buffers": 2, "pairs": 3}


@pytest.fixture(scope="module")
def mlp() -> dict[str, Any]:
    """A lowered, placed one-block MLP with its stages' model parts."""
    graph, _ = build_mlp(WIDE)
    stages = find_stages(graph)
    plans = [(s, gemm_candidates(stage_shape(graph, s), IPU21, keep=1)[0]) for s in stages]
    program = lower(graph, plans, IPU21)
    support = support_bytes(program, np.arange(IPU21.tiles, dtype=np.int64) % 7 * 40, IPU21)
    return {"program": program, "placement": place_storage(program, support["total"], IPU21),
            "support": support, "parts": stage_parts(graph, stages)}


def test_buffer_types_read_as_words_and_descriptions_keep_the_log_format(mlp: Any) -> None:
    program, parts = mlp["program"], mlp["parts"]
    rows = buffer_rows(program, parts)
    tiled = [b for b in program.buffers if "TensorTiling" in b.description]
    assert tiled  # the lowering's layouts: every one of them must reach the page in words
    for buffer, row in zip(program.buffers, rows, strict=True):
        assert row["description"] == buffer.description
        assert "TensorTiling" not in row["type"], buffer.name
        if buffer in tiled:
            assert buffer.layout is not None, buffer.name
            assert row["type"] == buffer.layout.human()
        assert row["part"] == step_label(buffer.name, parts)
    assert any(r["part"] != b.name for r, b in zip(rows, program.buffers, strict=True))


class Tree(HTMLParser):
    """The DOM as nested ``[tag, attrs, children]`` lists (text children as strings)."""

    VOID = {"br", "hr", "img", "input", "link", "meta", "wbr", "col", "area", "base", "source"}

    def __init__(self) -> None:
        super().__init__()
        self.root: list[Any] = ["#root", {}, []]
        self.stack = [self.root]

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        node = [tag, {k: v or "" for k, v in attrs}, []]
        self.stack[-1][2].append(node)
        if tag not in self.VOID:
            self.stack.append(node)

    def handle_endtag(self, tag: str) -> None:
        for depth in range(len(self.stack) - 1, 0, -1):
            if self.stack[depth][0] == tag:
                del self.stack[depth:]
                return

    def handle_data(self, data: str) -> None:
        self.stack[-1][2].append(data)


def walk(node: list[Any]) -> list[list[Any]]:
    found = [node]
    for child in node[2]:
        if isinstance(child, list):
            found += walk(child)
    return found


def text(node: list[Any], skip: str = "title") -> str:
    """The node's text, leaving out ``<title>`` tooltips (what a reader sees)."""
    return "".join(c if isinstance(c, str) else "" if c[0] == skip else text(c, skip)
                   for c in node[2])


def find(node: list[Any], tag: str, **attrs: str) -> list[list[Any]]:
    return [n for n in walk(node) if n[0] == tag
            and all(n[1].get(k.replace("_", "-")) == v for k, v in attrs.items())]


def by_id(root: list[Any], ident: str) -> list[Any]:
    [node] = [n for n in walk(root) if n[1].get("id") == ident]
    return node


def render(tmp_path: Path, mlp: Any, name: str = "mlp", fragment: str = "") -> list[Any]:
    path = tmp_path / "placement.html"
    write_placement_html(path, mlp["program"], mlp["placement"], mlp["support"], IPU21, name,
                         parts=mlp["parts"])
    tree = Tree()
    tree.feed(rendered_dom(tmp_path, path.as_uri() + fragment))
    return tree.root


def test_colour_bar_has_kib_ticks_and_says_what_colour_means(tmp_path: Path, mlp: Any) -> None:
    legend = by_id(render(tmp_path, mlp), "legend")
    ticks = find(legend, "span")
    ticks = [t for t in ticks if "tick" in t[1].get("class", "").split()]
    assert [text(t) for t in ticks] == ["0 KiB", "128 KiB", "256 KiB", "384 KiB", "512 KiB",
                                        "622.9 KiB"]
    assert [t[1]["title"] for t in ticks][-1] == "637,872 bytes"
    assert "peak bytes in use on the tile" in text(legend)
    assert "100%" not in text(legend)


def test_address_map_names_every_buffer_rectangle(tmp_path: Path, mlp: Any) -> None:
    root = render(tmp_path, mlp)
    program, parts = mlp["program"], mlp["parts"]
    area = by_id(root, "address-map")
    rects = [r for r in find(area, "rect") if "data-buffer" in r[1]]
    tile = int(area[1]["data-tile"])
    on_tile = np.flatnonzero(mlp["placement"].addresses[:, tile] >= 0)
    assert {int(r[1]["data-buffer"]) for r in rects} == {
        b for b in on_tile.tolist() if program.buffers[b].first >= 0}
    labels = {t[1]["data-buffer"]: text(t) for t in find(area, "text") if "data-buffer" in t[1]}
    roomy = 0
    for rect in rects:
        buffer = program.buffers[int(rect[1]["data-buffer"])]
        part = step_label(buffer.name, parts)
        [title] = find(rect, "title")
        assert part in text(title, skip="") and buffer.name in text(title, skip="")
        width, height = float(rect[1]["width"]), float(rect[1]["height"])
        if (width >= 60 and height >= 11) or (height >= 60 and width >= 12):  # 9 letters
            roomy += 1
            label = labels[rect[1]["data-buffer"]]
            assert label.rstrip("…") and label.rstrip("…") in part, (label, part)
    assert roomy  # a tile of this program has buffers big enough to be named inside
    axis = [t for t in find(area, "text") if "data-offset" in t[1]]
    assert len(axis) > 3 and all(text(t).endswith(" KiB") for t in axis)
    assert {text(t) for t in axis} >= {"0 KiB", "64 KiB", "128 KiB", "622.9 KiB"}
    assert "hatched" in text(area)  # the memory class, since colour means buffer


def test_buffer_table_leads_with_model_part_in_words(tmp_path: Path, mlp: Any) -> None:
    program, parts = mlp["program"], mlp["parts"]
    table = by_id(render(tmp_path, mlp), "buffers")
    assert [text(th) for th in find(table, "th")][:2] == ["model part", "buffer"]
    assert "TensorTiling" not in text(table, skip="") and "AxisTiling" not in text(table)
    rows = [r for r in find(table, "tr") if r[1].get("data-buffer", "support") != "support"]
    assert rows
    for row in rows:
        cells = find(row, "td")
        buffer = program.buffers[int(row[1]["data-buffer"])]
        assert text(cells[0]).strip() == step_label(buffer.name, parts)
        assert text(cells[1]) == buffer.name
        assert re.fullmatch(r"\d+ B|\d+\.\d (KiB|MiB)", text(cells[3]).strip()), text(cells[3])
        if buffer.layout is not None:
            assert text(cells[6]) == buffer.layout.human()


def expected_groups(mlp: Any) -> list[tuple[int, int, list[int]]]:
    """``(peak, step, tiles)`` for the 16 highest peaks, grouped with a dict."""
    placement = mlp["placement"]
    groups: dict[tuple[int, int], list[int]] = {}
    for tile, (peak, step) in enumerate(zip(placement.peak_bytes.tolist(),
                                            placement.peak_step.tolist(), strict=True)):
        groups.setdefault((peak, step), []).append(tile)
    ordered = sorted(groups.items(), key=lambda kv: (-kv[0][0], kv[1][0]))
    return [(peak, step, tiles) for (peak, step), tiles in ordered[:16]]


def test_busiest_list_has_one_row_per_peak_and_step(tmp_path: Path, mlp: Any) -> None:
    items = find(by_id(render(tmp_path, mlp), "busiest"), "li")
    want = expected_groups(mlp)
    assert any(len(tiles) > 1 for _, _, tiles in want)  # this program has repeated rows
    assert len(items) == len(want)
    seen = set()
    for item, (peak, step, tiles) in zip(items, want, strict=True):
        line = text(item)
        assert line not in seen
        seen.add(line)
        shown = ", ".join(map(str, tiles[:3]))
        more = f" (+{len(tiles) - 3} more)" if len(tiles) > 3 else ""
        who = f"tile {shown}" if len(tiles) == 1 else f"tiles {shown}{more}"
        assert line.startswith(f"{who}: {peak / KIB:.1f} KiB ({100 * peak / SPAN:.1f} %) at "
                               f"step {step}"), line
        assert item[1]["title"].startswith(f"{peak:,} bytes")


def test_summary_says_whether_it_fits(tmp_path: Path, mlp: Any) -> None:
    summary = text(by_id(render(tmp_path, mlp), "summary"))
    peak = int(mlp["placement"].peak_bytes.max())
    assert summary.startswith("Fits. Busiest tile")
    assert f"{peak / KIB:.1f} KiB of 622.9 KiB" in summary
    program, placement, support = hand_program()
    addresses = placement.addresses.copy()
    addresses[1, 1] = -1
    path = tmp_path / "hand.html"
    write_placement_html(path, program, replace(placement, addresses=addresses), support,
                         IPU21, "hand")
    tree = Tree()
    tree.feed(rendered_dom(tmp_path, path.as_uri()))
    assert text(by_id(tree.root, "summary")).startswith(
        "Does not fit. 1 buffer(s) found no room on 1 tile(s)")
