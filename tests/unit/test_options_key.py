"""``CompileOptions.key()`` and the package's options record, both derived from the fields'
marks (``phases/state.py``): an option that can change the package changes the key, one
marked as changing nothing does not, and no field escapes both."""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import pytest

from ipu_stack.phases.state import (
    IMPLIED,
    INERT,
    KEYED,
    RECORDED,
    WHEN_SET,
    CompileOptions,
    role,
)

FIELDS = {f.name: f for f in dataclasses.fields(CompileOptions)}
# what the package's options record held before it was derived from the marks
RECORD = ("target", "finalists", "diagnostics", "memory_proportion", "paired_exchange",
          "gemm_mode", "share_layers")
RECORD_WHEN_SET = ("tiles", "support_reserve", "interleaved_reserve", "strategy", "groups",
                   "chips", "fuse_supersteps", "fuse_window", "lean_table_rows")
UNRECORDED = ("slack",)
NOT_IN_THE_PACKAGE = ("cache_dir", "reuse_schedules", "exchange_cache", "dump_stages",
                      "verify_stages")


def _other(name: str) -> Any:
    """A value of option ``name`` other than its default, of its type."""
    default = FIELDS[name].default
    if isinstance(default, bool):
        return not default
    if isinstance(default, int | float):
        return default / 2 if isinstance(default, float) else default + 1
    return "elsewhere" if default is None else default + "-other"


def test_every_option_has_a_known_role() -> None:
    assert {role(f) for f in FIELDS.values()} <= {RECORDED, WHEN_SET, IMPLIED, INERT}
    assert sorted(RECORD + RECORD_WHEN_SET + UNRECORDED + NOT_IN_THE_PACKAGE) == sorted(FIELDS), (
        "a new option: add it to this test's lists as what it is (marked INERT in "
        "phases/state.py only if it cannot change a byte of the package)")
    assert all(role(FIELDS[n]) == RECORDED for n in RECORD)
    assert all(role(FIELDS[n]) == WHEN_SET for n in RECORD_WHEN_SET)
    assert all(role(FIELDS[n]) == IMPLIED for n in UNRECORDED)
    assert all(role(FIELDS[n]) == INERT for n in NOT_IN_THE_PACKAGE)


@pytest.mark.parametrize("name", sorted(FIELDS))
def test_an_option_is_in_the_key_unless_marked_inert(name: str) -> None:
    """Every field is either in the key or marked: changing it changes the key exactly when
    it is not INERT, whatever the role says about the record."""
    base = CompileOptions()
    changed = dataclasses.replace(base, **{name: _other(name)})
    assert (changed.key() != base.key()) == (role(FIELDS[name]) in KEYED)


def test_the_key_is_a_sha256_of_the_options_alone() -> None:
    key = CompileOptions().key()
    assert len(key) == 64 and int(key, 16) >= 0
    assert CompileOptions().key() == key  # no clock, no process
    assert CompileOptions(memory_proportion=1).key() == key  # 1 and 1.0 are one option
    assert CompileOptions(cache_dir="/elsewhere", dump_stages="/d", verify_stages=True,
                          reuse_schedules=False, exchange_cache=True).key() == key


def test_the_record_is_derived_from_the_marks() -> None:
    """The package's options record: the RECORDED options always, the WHEN_SET ones only
    when they differ from their default, nothing else; as it was written before."""
    plain = CompileOptions()
    assert sorted(plain.to_json()) == sorted(RECORD)
    assert plain.to_json() == {"target": "ipu21", "finalists": 3, "diagnostics": False,
                               "memory_proportion": 1.0, "paired_exchange": True,
                               "gemm_mode": "auto", "share_layers": True}
    every = CompileOptions(tiles=162, support_reserve=1234, interleaved_reserve=8192,
                           strategy="pipeline", groups=9, chips=2, slack=False,
                           dump_stages="/d", verify_stages=True, lean_table_rows=1000)
    assert every.to_json() == {**plain.to_json(), "tiles": 162, "support_reserve": 1234,
                               "interleaved_reserve": 8192, "strategy": "pipeline",
                               "groups": 9, "chips": 2, "lean_table_rows": 1000}
    json.dumps(every.to_json(), allow_nan=False)  # what the package writer requires
