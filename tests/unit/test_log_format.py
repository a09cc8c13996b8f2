"""The key=value line a script reads: every field one space-free token, as the reference's
logs render them."""

from __future__ import annotations

from ipu_stack.util.log import format_fields


def test_lists_strings_and_nulls_render_as_single_fields():
    line = format_fields({"generated": [38511, 22074, 26127], "name": "a b", "ok": True,
                          "ratio": 0.5, "missing": None, "kinds": ["gemm", "x y"]})
    assert line == ('generated=[38511,22074,26127] name="a b" ok=true ratio=0.5 '
                    'kinds=[gemm,"x y"]')
    # a reader splitting on spaces outside quotes gets each field whole
    assert [f.split("=", 1)[0] for f in line.replace('"a b"', "q").replace('"x y"', "q")
            .split()] == ["generated", "name", "ok", "ratio", "kinds"]
