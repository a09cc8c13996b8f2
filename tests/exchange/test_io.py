"""JSON formats, round trips, malformed input and the CLI commands."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from ipu_stack.exchange import (
    ExchangeError,
    ScheduleError,
    load_instance,
    load_schedule,
    save_instance,
    save_schedule,
    schedule_command,
    schedule_exchange,
    verify_command,
)
from ipu_stack.exchange.families import random_multicast


def test_round_trip(tmp_path: Path) -> None:
    t = random_multicast(300, tiles=64, seed=2)
    save_instance(tmp_path / "i.json", t)
    back = load_instance(tmp_path / "i.json")
    for field in ("src", "dst_offsets", "dst", "words"):
        assert np.array_equal(getattr(t, field), getattr(back, field))
    s = schedule_exchange(t)
    save_schedule(tmp_path / "s.json", s)
    s2 = load_schedule(tmp_path / "s.json")
    assert (s2.horizon, s2.lower_bound, s2.kind) == (s.horizon, s.lower_bound, s.kind)
    assert np.array_equal(s.chunk_start, s2.chunk_start)


def test_commands(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    inst = tmp_path / "i.json"
    inst.write_text(
        json.dumps(
            {
                "tiles": 4,
                "transfers": [{"src": 0, "dst": [1, 2], "words": 3}, {"src": 1, "dst": [0], "words": 2}],
            }
        )
    )
    assert schedule_command(str(inst), str(tmp_path / "s.json")) == 0
    out = capsys.readouterr().out
    assert "horizon=3 lower_bound=3 ratio=1.0000" in out
    # 8 bytes per chunk on its source and on each destination: tiles 0 and 1 hold 16
    assert "chunks=2 table_bytes_max=16 table_bytes_total=40" in out
    assert verify_command(str(inst), str(tmp_path / "s.json")) == 0
    assert "valid horizon=3 lower_bound=3" in capsys.readouterr().out
    bad = json.loads((tmp_path / "s.json").read_text())
    bad["chunks"][0]["words"] = 1
    (tmp_path / "bad.json").write_text(json.dumps(bad))
    with pytest.raises(ScheduleError, match="uncovered word: transfer 0"):
        verify_command(str(inst), str(tmp_path / "bad.json"))


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("{not json", "malformed instance JSON"),
        ('{"transfers": []}', "missing field 'tiles'"),
        ('{"tiles": 4, "transfers": {}}', "'transfers' must be a list"),
        ('{"tiles": 4, "transfers": [{"src": 0, "dst": [1]}]}', "transfer 0 is missing field"),
        (
            '{"tiles": 4, "transfers": [{"src": "a", "dst": [1], "words": 1}]}',
            "transfer 0 src must be an integer",
        ),
        ('{"tiles": 4, "transfers": [{"src": 0, "dst": 1, "words": 1}]}', "dst must be a list"),
        ('{"tiles": 4, "transfers": [{"src": 0, "dst": [0], "words": 1}]}', "source among its destinations"),
        # bounded before any array a tile long is made
        ('{"tiles": 4000000000, "transfers": [{"src": 0, "dst": [1], "words": 1}]}',
         "tiles must be between 1 and 1048576, got 4000000000"),
        ('{"tiles": 0, "transfers": []}', "tiles must be between 1 and 1048576, got 0"),
        # past the arrays' int64, and nested past the parser's recursion
        ('{"tiles": 4, "transfers": [{"src": 0, "dst": [1], "words": 100000000000000000000}]}',
         "transfer 0 words is out of range, got 100000000000000000000"),
        ('{"tiles": 4, "transfers": [{"src": 0, "dst": [-100000000000000000000], '
         '"words": 1}]}', "transfer 0 dst is out of range"),
        ("[" * 100000 + "]" * 100000, "malformed instance JSON .*: nested too deeply"),
    ],
)
def test_malformed_instance(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "i.json"
    path.write_text(text)
    with pytest.raises(ExchangeError, match=message):
        load_instance(path)


def test_malformed_schedule(tmp_path: Path) -> None:
    path = tmp_path / "s.json"
    path.write_text('{"horizon": 1, "lower_bound": 1, "kind": "x", "chunks": [{"start": 0}]}')
    with pytest.raises(ExchangeError, match="chunk 0 is missing field 'transfer'"):
        load_schedule(path)
    path.write_text('{"horizon": 1, "lower_bound": 1, "kind": "x", "chunks": [{"start": '
                    '100000000000000000000, "transfer": 0, "words": 1, "offset": 0}]}')
    with pytest.raises(ExchangeError, match="chunk 0 start is out of range"):
        load_schedule(path)
    with pytest.raises(ExchangeError, match="cannot read schedule"):
        load_schedule(tmp_path / "missing.json")
