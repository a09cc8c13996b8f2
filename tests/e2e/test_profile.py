"""Execution profiles: written by ``bench --profile``, a valid trace whose tracks each cover
the run, a report that renders and draws in headless Chromium, and ``profile A B``."""

from __future__ import annotations

import json
import re
import struct
import zlib
from collections import defaultdict
from pathlib import Path

import pytest

from ipu_stack.cli import main
from ipu_stack.profile import compare, load_profile
from ipu_stack.util.errors import UsageError
from tests.chromium import headless, rendered_dom
from tests.helpers import Bench, bench

SMALL = ["--tokens", "17", "--dim", "64", "--heads", "4", "--hidden", "96"]


@pytest.fixture(scope="module")
def profiled(tmp_path_factory, cache_dir) -> tuple[Path, dict]:
    """A small siglip-layer bench with ``--profile``: the folder and the record."""
    folder = tmp_path_factory.mktemp("profiled")
    run = _profiled_bench(folder, cache_dir, "siglip-layer", *SMALL)
    assert run.code == 0
    return folder, run.record


def _profiled_bench(folder: Path, cache_dir: Path, workload: str, *extra: str) -> Bench:
    """``bench`` with ``--profile folder/profile`` (three finalists, the CLI's default)."""
    return bench(workload, *extra, "--profile", str(folder / "profile"), folder=folder,
                 cache_dir=cache_dir, finalists=3)


def test_bench_profile_writes_the_three_files(profiled) -> None:
    folder, record = profiled
    for name in ("profile.json", "trace.json", "report.html"):
        assert (folder / "profile" / name).stat().st_size > 0
    profile = load_profile(folder / "profile" / "profile.json")
    assert profile.cycles == record["cycles"]
    assert profile.compute_cycles + profile.exchange_cycles + profile.sync_cycles == (
        record["cycles"])
    kinds = {s.kind for s in profile.steps}
    assert {"compute", "exchange", "host_write", "host_read"} <= kinds
    # every compute superstep's critical tile did exactly that superstep's cycles of work
    for step in profile.supersteps:
        if step.kind == "compute":
            assert sum(item["cycles"] for item in step.busiest_work) == step.cycles
            assert step.tile_cycles.max() == step.cycles
        else:
            assert step.exchange["horizon"] >= step.exchange["lower_bound"]


def test_trace_events_are_valid_and_each_track_covers_the_run(profiled) -> None:
    folder, record = profiled
    data = json.loads((folder / "profile" / "trace.json").read_text())
    events = data["traceEvents"]
    per_track: dict[tuple[int, int], int] = defaultdict(int)
    named: set[tuple[int, int]] = set()
    clock = data["otherData"]["clock_hz"]
    for event in events:
        assert event["ph"] in ("X", "M", "C", "i"), event
        assert isinstance(event["name"], str) and isinstance(event["pid"], int)
        if event["ph"] == "M":
            if event["name"] == "thread_name":
                named.add((event["pid"], event["tid"]))
            continue
        assert isinstance(event["ts"], (int, float)) and event["ts"] >= 0
        if event["ph"] == "X":
            assert isinstance(event["tid"], int) and event["dur"] > 0
            assert abs(event["dur"] - event["args"]["cycles"] * 1e6 / clock) < 1e-3
            per_track[(event["pid"], event["tid"])] += event["args"]["cycles"]
        if event["ph"] == "C":
            assert all(isinstance(v, (int, float)) for v in event["args"].values())
    assert len(per_track) >= 1 + 2 + 7  # program, two tiles at least, supervisor + 6 workers
    assert set(per_track) <= named
    for track, cycles in per_track.items():
        assert cycles == record["cycles"], track


def _png_pixels(path: Path) -> tuple[int, int, set[bytes]]:
    """Width, height and the distinct RGB colours of an 8-bit RGB(A) PNG (filters undone)."""
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    pos, idat, header = 8, b"", None
    while pos < len(data):
        length, kind = struct.unpack(">I4s", data[pos : pos + 8])
        chunk = data[pos + 8 : pos + 8 + length]
        if kind == b"IHDR":
            header = struct.unpack(">IIBBBBB", chunk)
        elif kind == b"IDAT":
            idat += chunk
        pos += 12 + length
    width, height, depth, colour = header[:4]
    assert depth == 8 and colour in (2, 6)
    size = 3 if colour == 2 else 4
    raw = zlib.decompress(idat)
    stride = width * size
    previous = bytearray(stride)
    colours: set[bytes] = set()
    for y in range(height):
        kind = raw[y * (stride + 1)]
        line = bytearray(raw[y * (stride + 1) + 1 : (y + 1) * (stride + 1)])
        for x in range(stride):
            a = line[x - size] if x >= size else 0
            b = previous[x]
            c = previous[x - size] if x >= size else 0
            if kind == 1:
                line[x] = (line[x] + a) & 255
            elif kind == 2:
                line[x] = (line[x] + b) & 255
            elif kind == 3:
                line[x] = (line[x] + (a + b) // 2) & 255
            elif kind == 4:
                p = a + b - c
                pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
                line[x] = (line[x] + (a if pa <= pb and pa <= pc else b if pb <= pc else c)) & 255
        if y % 4 == 0:
            colours.update(bytes(line[i : i + 3]) for i in range(0, stride, size * 4))
        previous = line
    return width, height, colours


def test_report_renders_and_draws_in_headless_chromium(profiled, tmp_path) -> None:
    folder, record = profiled
    page = folder / "profile" / "report.html"
    dom = rendered_dom(tmp_path, page.as_uri())
    profile = load_profile(folder / "profile" / "profile.json")
    steps = len(profile.supersteps)
    assert 'id="heat-map"' in dom and 'data-rendered="1"' in dom
    assert f'data-cells="{steps * 1472}"' in dom
    painted = int(dom.split('data-painted="')[1].split('"')[0])
    assert painted >= len(profile.active_tiles())  # every active tile is busy somewhere
    assert f'data-bars="{steps}"' in dom
    assert "placement.html" in dom
    shot = tmp_path / "report.png"
    headless(tmp_path, f"--screenshot={shot}", "--window-size=1400,1200", page.as_uri())
    assert shot.exists()
    width, height, colours = _png_pixels(shot)
    assert (width, height) == (1400, 1200)
    # the bar chart's three colours and the heat map's shades are on screen
    assert {bytes.fromhex("3b7dd8"), bytes.fromhex("e08a2c")} <= colours
    assert len(colours) > 20


def test_profile_command_summarises_and_compares(profiled, tmp_path, cache_dir, capsys) -> None:
    folder, record = profiled
    assert main(["profile", str(folder / "profile")]) == 0
    text = capsys.readouterr().out
    assert f"{record['cycles']} cycles" in text and "longest supersteps:" in text
    assert "exchange phases (horizon / lower bound):" in text
    # the folder `bench --out` wrote holds a package and no profile: profile runs it
    assert main(["profile", str(folder / "pkg")]) == 0
    assert f"{record['cycles']} cycles" in capsys.readouterr().out
    # the same workload planned for less memory: four stacked MLPs keep eight weight blocks
    # resident, so at 10 % of tile memory the fastest plans do not fit the planner's budget
    # and it moves stages to leaner, slower plans, named step by step
    tight = tmp_path / "tight"
    tight_run = _profiled_bench(tight, cache_dir, "siglip-mlp", "--tokens", "64", "--blocks",
                                "4", "--memory-proportion", "0.1")
    roomy = tmp_path / "roomy"
    roomy_run = _profiled_bench(roomy, cache_dir, "siglip-mlp", "--tokens", "64", "--blocks", "4")
    traded, plain = tight_run.record, roomy_run.record
    assert traded["numericalTest"] == plain["numericalTest"] == "PASS"
    assert "traded cycles for memory" not in roomy_run.stderr
    moved = re.search(r"traded cycles for memory moves=(\d+) budget_bytes=(\d+) "
                      r"estimated_bytes=(\d+)", tight_run.stderr)
    assert moved, tight_run.stderr
    moves, budget, estimated = (int(g) for g in moved.groups())
    assert moves >= 1 and estimated <= budget
    assert traded["cycles"] > plain["cycles"]
    capsys.readouterr()
    assert main(["profile", str(roomy / "profile"), str(tight / "profile")]) == 0
    text = capsys.readouterr().out
    delta = traded["cycles"] - plain["cycles"]
    assert f"B - A = {delta:+d}" in text
    changed = [line for line in text.splitlines() if line.startswith("  stage")]
    assert changed and all("->" in line or " only in " in line for line in changed)
    # steps matched by name, kind and pass: their changes are the whole difference
    rows = compare(load_profile(roomy / "profile" / "profile.json"),
                   load_profile(tight / "profile" / "profile.json"))
    assert sum(row["delta"] for row in rows) == delta and len(rows) == len(changed)


def test_damaged_profiles_are_refused_with_one_line(profiled, tmp_path) -> None:
    folder, _ = profiled
    data = json.loads((folder / "profile" / "profile.json").read_text())
    data["profile"]["cycles"] += 1
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(data))
    with pytest.raises(UsageError, match="checksum does not match"):
        load_profile(bad)
    bad.write_text("{not json")
    with pytest.raises(UsageError, match="not a readable ipu-stack profile"):
        load_profile(bad)
