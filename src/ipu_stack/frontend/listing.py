"""``ipu-stack ops MODEL.pt2``: every operation of a program, supported or not, and where.

The answer comes from the importer itself: the program is converted (F16, random inputs)
and each node is marked by what happened to it, so the listing cannot disagree with
``compile``.  Conversion stops at the first operation it cannot map; every later node is
then judged by whether a rule for its target exists ("rule exists": it may still fail in
context, e.g. a view that would move data), or whether all its inputs are constants
(folded at compile time).
"""

from __future__ import annotations

import json
from typing import Any

from ipu_stack.frontend.convert import SIDE_EFFECTS, op_name, user_inputs_read, where
from ipu_stack.frontend.ops import HANDLERS
from ipu_stack.frontend.ops_cache import position_inputs
from ipu_stack.frontend.sizing import program_footprint
from ipu_stack.frontend.user_inputs import random_inputs
from ipu_stack.frontend.walk import Importer
from ipu_stack.frontend.workload import specialize
from ipu_stack.util.errors import CompileError
from ipu_stack.workloads.footprint import check_value


def list_operations(program: Any, label: str = "the program") -> list[dict[str, Any]]:
    """One row per call in the program: target, module, source, status, supported.  A
    value the host's conversion would hold past the bound for one is refused first, in one
    line naming ``label`` (the file)."""
    program = specialize(program, 0)
    check_value(label, program_footprint(program, "f16"))
    converter = Importer(program, random_inputs(program, 0), "f16", {}, "listing")
    failure: tuple[Any, str] | None = None
    try:
        converter.run()
    except CompileError as exc:
        failure = (converter.node, str(exc))
    rows = []
    reached = True
    live = converter.live_nodes()
    positions = set(position_inputs(program))  # a cache step's: the host's arithmetic
    for node in program.graph.nodes:
        if node.op != "call_function":
            continue
        module, source = where(node)
        if failure is not None and node is failure[0]:
            status, supported, reached = "unsupported: " + failure[1], False, False
        elif reached and node not in live and op_name(node.target) not in SIDE_EFFECTS:
            status, supported = "dead (nothing reads it)", True
        elif reached and node in converter.host_nodes:
            status, supported = "host (position arithmetic, before each call)", True
        elif reached:
            folded = node not in converter.dynamic
            status, supported = ("folded (constant)" if folded else "mapped"), True
        elif all(n not in converter.dynamic and n.op != "placeholder" or _is_state(program, n)
                 for n in node.all_input_nodes) and not user_inputs_read(program, node):
            status, supported = "folded (constant)", True
        elif op_name(node.target) in HANDLERS:
            status, supported = "rule exists (not reached)", True
        elif positions and (read := user_inputs_read(program, node)) and read <= positions:
            status, supported = "host (position arithmetic, not reached)", True
        else:
            status, supported = "unsupported: no rule", False
        rows.append({"target": str(node.target), "node": node.name, "module": module,
                     "source": source, "supported": supported, "status": status})
    return rows


def _is_state(program: Any, node: Any) -> bool:
    users = {s.arg.name for s in program.graph_signature.input_specs
             if s.kind.name != "USER_INPUT"}
    return node.op == "placeholder" and node.name in users


def format_operations(rows: list[dict[str, Any]], as_json: bool = False) -> str:
    """The listing as text (one line per operation, then a summary) or JSON lines."""
    if as_json:
        return "\n".join(json.dumps(r) for r in rows)
    lines = [f"{'yes' if r['supported'] else 'NO ':<4}{r['target']:<48} {r['module']:<48} "
             f"{r['status']}" for r in rows]
    bad = sum(1 for r in rows if not r["supported"])
    lines.append(f"operations={len(rows)} supported={len(rows) - bad} unsupported={bad}")
    return "\n".join(lines)
