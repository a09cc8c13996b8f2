"""The host side of a run in its own process, beside the simulated device.

The host side (the reference at device precision, the float64 model and the stage-by-stage
verdict) and the device each keep one core busy for the whole run.  As two threads of one
process they also take turns on the interpreter lock: measured on the 3-layer tower, the
device took 14.0 s beside a host thread against 9.0 s beside a host process, and the whole
run 15.0 s against 9.6 s.  So the host side runs in a forked child, which starts with the
graph and the (compacted) weights already in its memory, shared page by page with the
parent.

What crosses the pipe, both ways, is arrays as raw bytes behind a small JSON header (no
pickle): the device's probe reads and outputs as they arrive (a sender thread in the parent
keeps the device from ever waiting on the pipe, a receiver thread in the child feeds the
same queue the in-process host side reads), and at the end the verdict and the reference's
outputs.  A failure in the child comes back as one line and is raised in the parent as the
same error type where it is one of ours.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import json
import multiprocessing
import queue
import resource
import threading
from collections.abc import Callable
from multiprocessing.connection import Connection
from typing import Any

import numpy as np

from ipu_stack.ir.graph import Graph
from ipu_stack.ir.precision import Precision
from ipu_stack.ir.values import StoredTensor
from ipu_stack.util import errors
from ipu_stack.verdict.judge import Fidelity, StageAgreement, Verdict

Items = list[tuple[str, Any]]


def encode_array(name: str, value: Any) -> tuple[str, Any]:
    """One named array as ``(JSON header, its bytes)``: storage codes for a stored tensor.
    The bytes are a view of the array (``b""`` when empty); the wire form of every array
    that crosses between processes here and in ``runtime.chip_worker``."""
    stored = isinstance(value, StoredTensor)
    array = np.ascontiguousarray(value.stored if stored else np.asarray(value))
    header = {"name": name, "dtype": array.dtype.str, "shape": list(array.shape),
              "precision": value.precision.to_json() if stored else None}
    return json.dumps(header), (array.view(np.uint8).reshape(-1) if array.size else b"")


def decode_array(header_text: str | bytes, body: bytes) -> tuple[str, Any]:
    """The ``(name, array or StoredTensor)`` :func:`encode_array` made (a writable copy)."""
    header = json.loads(header_text)
    precision = None if header["precision"] is None else Precision.from_json(header["precision"])
    # storage codes take their precision's dtype (FP8 has no numpy type string of its own)
    dtype = precision.dtype if precision is not None else np.dtype(header["dtype"])
    array = np.frombuffer(body, dtype=dtype).reshape(header["shape"]).copy()  # writable
    if precision is not None:
        return header["name"], StoredTensor(precision, array)
    return header["name"], array


def _send_array(conn: Connection, name: str, value: Any) -> None:
    """One named array: a header, then its bytes."""
    header, body = encode_array(name, value)
    conn.send_bytes(header.encode())
    conn.send_bytes(body)


def _receive_array(conn: Connection) -> tuple[str, Any]:
    header = conn.recv_bytes()
    return decode_array(header, conn.recv_bytes())


def _send_items(conn: Connection, items: Items | None) -> None:
    if items is None:
        conn.send_bytes(json.dumps({"kind": "end"}).encode())
        return
    conn.send_bytes(json.dumps({"kind": "items", "count": len(items)}).encode())
    for name, value in items:
        _send_array(conn, name, value)


def _verdict_json(verdict: Verdict) -> dict[str, Any]:
    fidelity = verdict.fidelity
    return {"stages": [[s.stage, s.layer, s.precision, s.max_ulps, s.mismatch, s.elements]
                       for s in verdict.stages],
            "fidelity": None if fidelity is None else [
                fidelity.noise_ratio, fidelity.tail_ratio, fidelity.rms_error,
                fidelity.rms_noise],
            "seconds": verdict.seconds, "ideal_seconds": verdict.ideal_seconds}


def _verdict_from(data: dict[str, Any]) -> Verdict:
    fidelity = None if data["fidelity"] is None else Fidelity(*data["fidelity"])
    return Verdict([StageAgreement(*s) for s in data["stages"]], fidelity, data["seconds"],
                   data["ideal_seconds"])


HostWork = Callable[..., tuple[Any, Any, float, Any]]
M_MMAP_MAX = -4  # glibc's mallopt parameter: how many blocks malloc may serve by mmap


def keep_pages() -> bool:
    """Serve every block of this process from its heap, never from a fresh mapping; whether
    the C library took it.

    The host side makes and drops arrays of 34 MB and more (a tower's attention scores, 68 MB
    in float64) all the time; glibc serves blocks above 32 MiB (its largest mmap threshold)
    by mmap and unmaps them on free, so each one is fresh memory.  On the virtual machines
    this runs on, a first touch of memory the process has not held recently runs at
    0.1-0.2 GB/s (34 MB: 0.25 s, against 7 ms for memory just freed).  From the heap, a
    freed block is reused by the next array: the 27-layer tower's host side took 49-52 s
    instead of 54-65 s, with half the page faults and no higher peak (2.46 GB against
    2.74-2.77 GB).  Only the host process does this; its arrays repeat layer after layer."""
    name = ctypes.util.find_library("c")
    try:
        mallopt = getattr(ctypes.CDLL(name), "mallopt", None) if name else None
    except OSError:
        return False
    if mallopt is None:
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    return bool(mallopt(M_MMAP_MAX, 0))


def _child(conn: Connection, host_side: HostWork, graph: Graph, tensors: dict[str, Any],
           gemm_modes: dict | None, outputs_only: set[str]) -> None:
    """The child's whole life: receive arrivals on a thread, run the host side, send back
    the verdict and the reference's outputs (or the one-line failure)."""
    keep_pages()
    arrivals: queue.SimpleQueue = queue.SimpleQueue()

    def receive() -> None:
        try:
            while True:
                header = json.loads(conn.recv_bytes())
                if header["kind"] == "end":
                    break
                arrivals.put([_receive_array(conn) for _ in range(header["count"])])
        except (EOFError, OSError):
            pass  # the parent went away: the host side ends with what it has
        arrivals.put(None)

    receiver = threading.Thread(target=receive, daemon=True)
    receiver.start()
    try:
        reference, ideal, ideal_seconds, judging = host_side(
            graph, tensors, gemm_modes, None, outputs_only, arrivals)
        verdict = judging.finish(ideal)
        verdict.ideal_seconds = ideal_seconds
        # the outputs, and the values the float64 model judged for them (an argmax's)
        names = [v.name for v in graph.by_role("output")]
        names += sorted(set(outputs_only) - set(names))
        # this process's peak resident memory (pages it shares with the process it was
        # forked from count too, as they do for any process)
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
        conn.send_bytes(json.dumps({"kind": "result", "verdict": _verdict_json(verdict),
                                    "outputs": len(names), "peak_bytes": peak}).encode())
        for name in names:
            _send_array(conn, name, np.asarray(reference[name], dtype=np.float32))
    except BaseException as exc:  # noqa: BLE001 - every failure goes back as one line
        conn.send_bytes(json.dumps({"kind": "error", "type": type(exc).__name__,
                                    "message": str(exc)}).encode())
    finally:
        conn.close()


class HostProcess:
    """The forked host side of one run; ``put`` is the device's probe listener."""

    def __init__(self, host_side: HostWork, graph: Graph, tensors: dict[str, Any],
                 gemm_modes: dict | None, outputs_only: set[str]) -> None:
        context = multiprocessing.get_context("fork")
        self.conn, child_conn = context.Pipe()
        self.process = context.Process(
            target=_child, args=(child_conn, host_side, graph, tensors, gemm_modes,
                                 outputs_only), daemon=True, name="ipu-stack-host")
        self.process.start()
        child_conn.close()
        self.outgoing: queue.SimpleQueue = queue.SimpleQueue()
        self.peak_bytes = 0  # the host side's peak resident memory, once it has finished
        self.sender = threading.Thread(target=self._send, daemon=True)
        self.sender.start()

    def put(self, items: Items | None) -> None:
        """Hand the child a list of ``(name, value)`` (``None``: nothing more)."""
        self.outgoing.put(items)

    def _send(self) -> None:
        try:
            while True:
                items = self.outgoing.get()
                _send_items(self.conn, items)
                if items is None:
                    return
        except (BrokenPipeError, OSError):
            return  # the child failed; result() reports why

    def result(self) -> tuple[dict[str, np.ndarray], Verdict]:
        """The reference's outputs and the verdict, once the child has finished."""
        self.sender.join()
        try:
            header = json.loads(self.conn.recv_bytes())
        except (EOFError, OSError):
            self.process.join()
            raise RuntimeError(f"the host side died (exit code {self.process.exitcode})"
                               ) from None
        if header["kind"] == "error":
            self.process.join()
            kind = getattr(errors, header["type"], None)
            if isinstance(kind, type) and issubclass(kind, Exception):
                raise kind(header["message"])
            raise RuntimeError(f"host side: {header['type']}: {header['message']}")
        self.peak_bytes = int(header.get("peak_bytes", 0))
        outputs = dict(_receive_array(self.conn) for _ in range(header["outputs"]))
        self.process.join()
        self.conn.close()
        return outputs, _verdict_from(header["verdict"])

    def abandon(self) -> None:
        """The device failed: stop the child at once."""
        if self.process.is_alive():
            self.process.kill()
        self.process.join()
        self.conn.close()


def fork_available() -> bool:
    return "fork" in multiprocessing.get_all_start_methods()
