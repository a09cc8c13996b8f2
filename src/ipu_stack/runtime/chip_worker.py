"""One chip of a system package, simulated in a worker of its own.

A :class:`ChipWorker` holds only its own chip: the devices of the pipeline groups placed on
that chip (each a simulated device of its group's tiles, loaded with its program and
initialised with its layers' weights).  It runs an image through its groups in order and
hands back the chip's output activation, the probe reads the verdict judges, and what each
group executed (its supersteps' kinds and cycles).

Three engines run the workers (``runtime.engines``): in this process, forked processes that
talk over pipes, and Ray actors.  The last two move arrays in one wire form, a JSON header and
the raw bytes (:func:`encode` / :func:`decode`), never pickled Python objects.
"""

from __future__ import annotations

import json
import resource
import traceback
from collections.abc import Callable
from multiprocessing.connection import Connection
from typing import Any

import numpy as np

from ipu_stack.contract.system import SystemProgram
from ipu_stack.device.simulator import CallReport
from ipu_stack.ir.graph import Graph
from ipu_stack.ir.values import DeferredTensors, weight_storer
from ipu_stack.package import Package
from ipu_stack.runtime.groups import chip_weight_names, load_groups, read_system, run_through
from ipu_stack.util import errors
from ipu_stack.verdict.host_process import decode_array, encode_array

Wire = list[tuple[str, bytes]]
"""Arrays as ``(JSON header, raw bytes)`` pairs: what crosses between a worker and the
coordinator."""


def encode(items: list[tuple[str, Any]]) -> Wire:
    """``(name, array or StoredTensor)`` pairs in the wire form (``host_process``'s, with
    the bytes copied out, as Ray sends them)."""
    return [(header, bytes(body)) for header, body in
            (encode_array(name, value) for name, value in items)]


def decode(wire: Wire) -> list[tuple[str, Any]]:
    """The pairs :func:`encode` made."""
    return [decode_array(header, body) for header, body in wire]


class ChipWorker:
    """Chip ``chip``'s groups on devices of their tiles, weights loaded."""

    def __init__(self, package: Package, system: SystemProgram, chip: int,
                 weights: Any, record: bool = False, poison: bool = False,
                 keep_reports: bool = False) -> None:
        self.chip = chip
        self.recording = record
        # in this process, a whole-chip run reads its devices' reports themselves
        self.keep_reports = keep_reports
        self.reports: list[CallReport] = []
        self.groups = load_groups(package, system, record, chip=chip, poison=poison)
        if not self.groups:
            raise errors.PackageError(f"the package places no pipeline group on chip {chip}")
        self.initialized = [group.initialize(weights) for group in self.groups]

    def run(self, inputs: dict[str, Any], on_probes: Callable[[list], None], number: int = 0
            ) -> tuple[dict[str, np.ndarray], list[dict[str, Any]]]:
        """Image ``number`` through this chip's groups: the chip's output (by the tower's
        names) and each group's executed supersteps; probe reads go to ``on_probes`` (tower
        names) as they arrive.  When recording, a group's run carries its superstep records
        (``records``) if it belongs to the chip's first full step: its ``j``-th group on
        image ``G - 1 - j``."""
        carried, reports = run_through(self.groups, inputs, on_probes)
        if self.keep_reports:
            self.reports = reports
        runs = []
        for position, (group, report) in enumerate(zip(self.groups, reports, strict=True)):
            runs.append({"group": group.index, "cycles": int(report.cycles),
                         "supersteps": [int(c) for c in report.superstep_cycles],
                         "kinds": list(report.superstep_kinds),
                         "host_bytes": int(report.host_bytes)})
            if self.recording and not self.keep_reports \
                    and number + position == len(self.groups) - 1:
                runs[-1]["records"] = [r.to_json() for r in report.steps
                                       if r.kind in ("compute", "exchange")]
        return carried, runs


def chip_weights(package: Package, system: SystemProgram, chip: int,
                 tensors: Any) -> dict[str, Any]:
    """The weights (by the tower's names) the groups on ``chip`` load: all a worker that
    does not share the coordinator's memory needs to be sent."""
    return {name: tensors[name] for name in chip_weight_names(package, system, chip)}


def peak_rss() -> int:
    """This process's peak resident bytes so far (a worker reports its own)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


# --------------------------------------------------------------------- the pipe protocol
def receive(conn: Connection) -> tuple[dict[str, Any], Wire]:
    """One message: its header and its arrays in the wire form."""
    header = json.loads(conn.recv_bytes())
    wire = [(conn.recv_bytes().decode(), conn.recv_bytes()) for _ in range(header["arrays"])]
    return header, wire


def send(conn: Connection, header: dict[str, Any], wire: Wire | tuple = ()) -> None:
    """One message: a JSON header and arrays in the wire form."""
    conn.send_bytes(json.dumps({**header, "arrays": len(wire)}).encode())
    for head, body in wire:
        conn.send_bytes(head.encode())
        conn.send_bytes(body)


def serve(conn: Connection, package: Package, chip: int, tensors: Any, graph: Graph,
          record: bool = False, poison: bool = False) -> None:
    """A forked worker's loop: make this chip's weights (and only those: a worker's memory is
    its chip's, not the model's), build chip ``chip``, then run each image it is sent until
    told to stop; a failure goes back as one line naming its type."""
    try:
        system = read_system(package)
        if isinstance(tensors, DeferredTensors):
            tensors.make_all(1, weight_storer(graph),
                             only=set(chip_weight_names(package, system, chip)))
        worker = ChipWorker(package, system, chip, tensors, record, poison)
        del tensors
        send(conn, {"op": "ready", "chip": chip})
        while True:
            header, wire = receive(conn)
            if header["op"] == "stop":
                return
            number = int(header["image"])

            def probes(items: list, number: int = number) -> None:
                send(conn, {"op": "probes", "image": number}, encode(items))

            outputs, runs = worker.run(dict(decode(wire)), probes, number)
            send(conn, {"op": "done", "image": number, "runs": runs, "peak": peak_rss()},
                 encode(list(outputs.items())))
    except (EOFError, BrokenPipeError):
        return
    except BaseException as failure:  # noqa: BLE001 - reported to the coordinator
        kind = type(failure).__name__ if isinstance(failure, errors.IpuStackError) \
            else "DeviceError"
        try:
            send(conn, {"op": "error", "kind": kind,
                        "message": f"{failure}" if isinstance(failure, errors.IpuStackError)
                        else f"{type(failure).__name__}: {failure}",
                        "trace": traceback.format_exc()})
        except (OSError, ValueError):
            pass


__all__ = ["ChipWorker", "Wire", "chip_weights", "decode", "encode",
           "peak_rss", "receive", "send", "serve"]
