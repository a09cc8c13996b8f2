"""JSON instance/schedule files and the ``ipu-stack exchange`` commands.

The formats are stable (other tools read them):
``INSTANCE.json`` ``{"tiles": 1472, "transfers": [{"src": 3, "dst": [5, 9], "words": 12}]}``
and ``SCHEDULE.json`` ``{"horizon": H, "lower_bound": L, "kind": "...", "chunks":
[{"transfer": i, "start": c, "words": w}]}``.  A schedule made with the paired-tiles option
adds ``"paired": true`` and a ``"lanes"`` field (1 or 2) to every chunk; plain readers that
ignore unknown fields still see a well-formed schedule, and the verifier checks the lanes.
Writes are atomic so a crashed run never leaves a half-written file that a later ``verify``
would misread; every malformed input becomes one :class:`ExchangeError` line naming the
problem.
"""

from __future__ import annotations

import json
import os
import time
from typing import Any

import numpy as np

from ipu_stack.exchange.instructions import instruction_horizon
from ipu_stack.exchange.model import ExchangeError, Schedule, Transfers, table_bytes
from ipu_stack.exchange.scheduler import schedule_exchange
from ipu_stack.exchange.verify import verify_schedule
from ipu_stack.util.files import open_regular, write_text_atomic

PathLike = str | os.PathLike[str]


def _read_json(path: PathLike, what: str) -> Any:
    try:
        with open_regular(path) as handle:  # never a device or FIFO: refused unread
            return json.loads(handle.read().decode("utf-8"))
    except OSError as exc:
        raise ExchangeError(f"cannot read {what} {os.fspath(path)}: {exc.strerror}") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ExchangeError(f"malformed {what} JSON in {os.fspath(path)}: {exc}") from None
    except RecursionError:  # arrays nested thousands deep: no instance or schedule is
        raise ExchangeError(f"malformed {what} JSON in {os.fspath(path)}: nested too "
                            "deeply") from None


INT64 = 1 << 63  # the arrays' integers: a larger one is no tile, size or cycle of a phase


def _int(value: Any, where: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ExchangeError(f"{where} must be an integer, got {json.dumps(value)[:40]}")
    if not -INT64 <= value < INT64:
        raise ExchangeError(f"{where} is out of range, got {str(value)[:40]}")
    return value


def _field(obj: Any, key: str, where: str) -> Any:
    if not isinstance(obj, dict):
        raise ExchangeError(f"{where} must be an object")
    if key not in obj:
        raise ExchangeError(f"{where} is missing field '{key}'")
    return obj[key]


def load_instance(path: PathLike) -> Transfers:
    """Read and validate an INSTANCE.json."""
    data = _read_json(path, "instance")
    tiles = _int(_field(data, "tiles", "instance"), "tiles")
    rows = _field(data, "transfers", "instance")
    if not isinstance(rows, list):
        raise ExchangeError("instance field 'transfers' must be a list")
    src, dsts, words = [], [], []
    for i, row in enumerate(rows):
        where = f"transfer {i}"
        src.append(_int(_field(row, "src", where), f"{where} src"))
        dst = _field(row, "dst", where)
        if not isinstance(dst, list):
            raise ExchangeError(f"{where} dst must be a list of tiles")
        dsts.append([_int(d, f"{where} dst") for d in dst])
        words.append(_int(_field(row, "words", where), f"{where} words"))
    t = Transfers.from_lists(tiles, src, dsts, words)
    t.validate()
    return t


def save_instance(path: PathLike, t: Transfers) -> None:
    """Write an INSTANCE.json atomically."""
    offsets = t.dst_offsets.tolist()
    dst = t.dst.tolist()
    rows = [
        {"src": s, "dst": dst[offsets[i] : offsets[i + 1]], "words": w}
        for i, (s, w) in enumerate(zip(t.src.tolist(), t.words.tolist(), strict=True))
    ]
    write_text_atomic(path, json.dumps({"tiles": t.tiles, "transfers": rows}) + "\n")


def load_schedule(path: PathLike) -> Schedule:
    """Read a SCHEDULE.json (structure only; ``verify_schedule`` judges it)."""
    data = _read_json(path, "schedule")
    horizon = _int(_field(data, "horizon", "schedule"), "horizon")
    bound = _int(_field(data, "lower_bound", "schedule"), "lower_bound")
    kind = _field(data, "kind", "schedule")
    if not isinstance(kind, str):
        raise ExchangeError("schedule field 'kind' must be a string")
    chunks = _field(data, "chunks", "schedule")
    if not isinstance(chunks, list):
        raise ExchangeError("schedule field 'chunks' must be a list")
    paired = data.get("paired", False)
    if not isinstance(paired, bool):
        raise ExchangeError("schedule field 'paired' must be true or false")
    cols: dict[str, list[int]] = {"transfer": [], "start": [], "words": []}
    if paired:
        cols["lanes"] = []
    for k, chunk in enumerate(chunks):
        for key, col in cols.items():
            col.append(_int(_field(chunk, key, f"chunk {k}"), f"chunk {k} {key}"))
    return Schedule(
        horizon=horizon,
        lower_bound=bound,
        kind=kind,
        chunk_transfer=np.asarray(cols["transfer"], dtype=np.int64),
        chunk_start=np.asarray(cols["start"], dtype=np.int64),
        chunk_words=np.asarray(cols["words"], dtype=np.int64),
        chunk_lanes=np.asarray(cols["lanes"], dtype=np.int64) if paired else None,
    )


def save_schedule(path: PathLike, s: Schedule) -> None:
    """Write a SCHEDULE.json atomically."""
    columns = {"transfer": s.chunk_transfer, "start": s.chunk_start, "words": s.chunk_words}
    if s.chunk_lanes is not None:
        columns["lanes"] = s.chunk_lanes
    names = list(columns)
    chunks = [dict(zip(names, row, strict=True))
              for row in zip(*(c.tolist() for c in columns.values()), strict=True)]
    data: dict[str, Any] = {"horizon": s.horizon, "lower_bound": s.lower_bound, "kind": s.kind}
    if s.paired:
        data["paired"] = True
    data["chunks"] = chunks
    write_text_atomic(path, json.dumps(data) + "\n")


def schedule_command(instance_path: str, out_path: str, paired: bool = False) -> int:
    """``ipu-stack exchange schedule INSTANCE.json -o SCHEDULE.json [--paired]``: one
    summary line."""
    t = load_instance(instance_path)
    began = time.perf_counter()
    s = schedule_exchange(t, paired=paired)
    seconds = time.perf_counter() - began
    save_schedule(out_path, s)
    tables = table_bytes(s, t)
    instruction, shifted = instruction_horizon(s, t)
    print(
        f"scheduled horizon={s.horizon} lower_bound={s.lower_bound} ratio={s.ratio:.4f} "
        f"instruction_horizon={instruction} shifted_sends={shifted} "
        f"chunks={s.chunks} table_bytes_max={int(tables.max(initial=0))} "
        f"table_bytes_total={int(tables.sum())} kind={s.kind} seconds={seconds:.3f}"
    )
    return 0


def verify_command(instance_path: str, schedule_path: str) -> int:
    """``ipu-stack exchange verify INSTANCE.json SCHEDULE.json``: raises ScheduleError."""
    t = load_instance(instance_path)
    s = load_schedule(schedule_path)
    verify_schedule(t, s)
    print(f"valid horizon={s.horizon} lower_bound={s.lower_bound}")
    return 0
