"""The suite's numba warm-up compiles the signatures a compile and run use, so that the
worker that loads a group from the cache compiles nothing of it again."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from tests.helpers import small

# A fresh process: warm up, note every signature of the grouped modules' loops, then
# compile and run a small attention block (it schedules multicast and unicast phases, both
# counted) and print the warmed-up loops whose signatures grew.
SCRIPT = """
import json, sys
import numba
from tests import numba_warmup
from ipu_stack.cli import main
from ipu_stack.exchange import dense, multicast, peel
from ipu_stack.ir import rounding
calls = {"multicast": 0, "unicast": 0}
def counted(name, function):
    def call(*args):
        calls[name] += 1
        return function(*args)
    return call
loops = {f"{m.__name__}.{name}": loop for m in (multicast, peel, rounding)
         for name, loop in vars(m).items() if isinstance(loop, numba.core.registry.CPUDispatcher)}
def signatures():
    return {name: sorted(map(str, loop.signatures)) for name, loop in loops.items()}
for group in numba_warmup.GROUPS:
    group()
before = signatures()
setattr(multicast, "_schedule", counted("multicast", getattr(multicast, "_schedule")))
setattr(dense, "peel", counted("unicast", dense.peel))
main(sys.argv[1:])
after = signatures()
print(json.dumps({"calls": calls,
                  "grew": sorted(k for k in before if before[k] and after[k] != before[k])}))
"""


def test_the_warm_up_compiles_what_a_compile_uses(tmp_path: Path) -> None:
    command = [sys.executable, "-c", SCRIPT, "bench", "attention", *small("attention"),
               "--out", str(tmp_path / "out"), "--cache-dir", str(tmp_path / "cache"), "--json"]
    done = subprocess.run(command, capture_output=True, text=True, check=False,
                          cwd=Path(__file__).parents[2])
    assert done.returncode == 0, done.stderr[-2000:]
    record = json.loads(done.stdout.strip().splitlines()[-1])
    assert record["calls"]["multicast"] > 0 and record["calls"]["unicast"] > 0, record
    assert record["grew"] == [], record
