"""Memory reports: the planner memory profile (JSON) and the exact tile placement page (HTML).

The reference build ends with two reports (its build log's phase 12): a JSON profile with the
chip-wide peak (``peak_step``, ``effective_peak_bytes``) and an HTML page of the exact tile
placement.  Both are derived from the placed program alone, so they explain a placement
failure or a tight tile without re-running the compiler.

Live bytes are computed as two small matrix products, ``[steps, buffers] @ [buffers, tiles]``
per memory class, instead of a loop over tiles: a 1472-tile program with ~60 buffers and ~30
steps takes milliseconds.  The HTML page embeds its data once per distinct placement
*signature* (tiles that hold the same buffers at the same addresses), because replicated
layouts make most of the 1472 tiles identical and the page must stay small enough to mail;
its HTML, CSS and script are in ``memory.page``.
"""

from __future__ import annotations

import html
import json
import logging
import math
import os
from typing import Any

import numpy as np

from ipu_stack.ir.names import Part, step_label
from ipu_stack.lowering.program import ComputeSet, Exchange, Loop, Program, Step
from ipu_stack.memory.page import PAGE_BODY, PAGE_CSS, PAGE_JS
from ipu_stack.memory.placement import Placement, distinct_rows
from ipu_stack.target import MemoryClass, Target
from ipu_stack.util.files import write_text_atomic
from ipu_stack.util.html import inert_json, standalone_page
from ipu_stack.util.log import event

LOG = logging.getLogger("ipu_stack.memory")
PROFILE_BUSIEST = 16
BUSIEST_GROUPS = 16  # rows of the placement page's busiest list, each a group of tiles
CLASSES = (MemoryClass.STANDARD, MemoryClass.INTERLEAVED)


def _step_name(step: Step) -> str:
    return step.name if isinstance(step, ComputeSet | Exchange | Loop) else step.tensor


def step_names(program: Program) -> list[str]:
    """``"<program>/<global step> <kind> <name>"``, indexed like buffer lifetimes."""
    return [f"{prog}/{index} {type(step).__name__} {_step_name(step)}"
            for prog, index, step in program.steps()]


def step_parts(program: Program, parts: dict[int, Part]) -> list[str]:
    """Each step's model part (``stage4.gemm`` -> ``layer 0 attn scores gemm``), indexed like
    :func:`step_names`: a person reads "step 37" on the page as the part it computes."""
    return [step_label(_step_name(step), parts) for _, _, step in program.steps()]


def live_bytes(program: Program, placement: Placement) -> dict[MemoryClass, np.ndarray]:
    """Bytes live per class as ``int64[steps, tiles]`` (at least one row, like placement).

    Membership comes from ``placement.addresses`` so the report shows what was placed; a
    buffer's bytes count on every step of its inclusive lifetime ``[first, last]``.
    """
    buffers = program.buffers
    steps = max(len(program.initialize) + len(program.run), 1)
    tiles = placement.addresses.shape[1]
    member = (placement.addresses >= 0).astype(np.int64)  # [buffers, tiles]
    first = np.array([b.first for b in buffers], dtype=np.int64)
    last = np.array([b.last for b in buffers], dtype=np.int64)
    nbytes = np.array([b.nbytes for b in buffers], dtype=np.int64)
    index = np.arange(steps)
    alive = (first[:, None] <= index[None, :]) & (index[None, :] <= last[:, None])
    weight = alive * nbytes[:, None]  # [buffers, steps]
    out = {}
    for memory_class in CLASSES:
        chosen = np.array([b.memory_class is memory_class for b in buffers], dtype=bool)
        if chosen.any():
            # in float64 (BLAS; numpy's int64 matmul has none): every sum is a whole number
            # of bytes far below 2^53, so the result is exact
            product = weight[chosen].T.astype(np.float64) @ member[chosen].astype(np.float64)
            out[memory_class] = np.rint(product).astype(np.int64)
        else:
            out[memory_class] = np.zeros((steps, tiles), dtype=np.int64)
    return out


def _busiest(peaks: np.ndarray, steps: np.ndarray, count: int) -> list[dict[str, int]]:
    """The ``count`` highest peaks, ties broken by tile number so reports are deterministic."""
    order = np.lexsort((np.arange(len(peaks)), -peaks))[:count]
    return [
        {"tile": int(t), "peak_bytes": int(peaks[t]), "peak_step": int(steps[t])} for t in order
    ]


def memory_profile(
    program: Program, placement: Placement, target: Target, scope: str
) -> dict[str, Any]:
    """The planner memory profile: chip-wide peak, the peak tile per step, the busiest tiles.

    ``effective_peak_bytes`` counts support memory, because support is what placement must
    fit around; ``peak_step``/``peak_tile`` are the first step and lowest tile reaching it.
    """
    live = live_bytes(program, placement)
    support = placement.support_bytes.astype(np.int64)
    total = support[None, :] + live[MemoryClass.STANDARD] + live[MemoryClass.INTERLEAVED]
    peak_step, peak_tile = np.unravel_index(int(np.argmax(total)), total.shape)
    peaks = total.max(axis=0)
    steps = len(program.initialize) + len(program.run)
    ordered = np.sort(peaks)
    return {
        "scope": scope,
        "target": target.name,
        "tiles": int(total.shape[1]),
        "memory_base": target.memory_base,
        "memory_end": target.memory_end,
        "steps": step_names(program),
        "peak_step": int(peak_step),
        "peak_tile": int(peak_tile),
        "effective_peak_bytes": int(total[peak_step, peak_tile]),
        "support_bytes": int(support[peak_tile]),
        "by_class": {c.value: live[c][:steps, peak_tile].tolist() for c in CLASSES},
        "tile_peaks": {
            "min": int(ordered[0]),
            "median": int(ordered[(len(ordered) - 1) // 2]),  # lower median: a real tile's
            "max": int(ordered[-1]),
        },
        "busiest_tiles": _busiest(peaks, total.argmax(axis=0), PROFILE_BUSIEST),
    }


def write_memory_profile(
    path: str | os.PathLike[str],
    program: Program,
    placement: Placement,
    target: Target,
    scope: str = "final",
    filled: tuple[int, dict[str, int]] | None = None,
    tables: tuple[int, list[list]] | None = None,
) -> dict[str, Any]:
    """Write :func:`memory_profile` atomically as sorted, indented JSON and return it;
    ``filled``: a tile and its bytes by category (``memory.categories``), recorded as
    ``tile_by_category``; ``tables``: a tile and the exchange phases whose tables take the
    most of it, ``[name, bytes]``, recorded as ``exchange_tables_by_phase``."""
    profile = memory_profile(program, placement, target, scope)
    if filled is not None:
        profile["tile_by_category"] = {"tile": filled[0], **filled[1]}
    if tables is not None:
        profile["exchange_tables_by_phase"] = {"tile": tables[0], "phases": tables[1]}
    write_text_atomic(path, json.dumps(profile, sort_keys=True, indent=1) + "\n")
    event(LOG, "wrote planner memory profile", path=str(path), scope=scope,
          peak_step=profile["peak_step"], effective_peak_bytes=profile["effective_peak_bytes"])
    return profile


def busiest_groups(peaks: np.ndarray, steps: np.ndarray, count: int) -> list[dict[str, Any]]:
    """The ``count`` highest ``(peak bytes, peak step)`` pairs, each with every tile that has it.

    Replicated layouts give dozens of tiles the very same peak at the same step; listed one
    tile a row, the busiest list repeats one fact until it scrolls off.  Tiles are increasing
    within a group; groups go highest peak first, ties by their lowest tile (deterministic).
    """
    peaks, steps = np.asarray(peaks, dtype=np.int64), np.asarray(steps, dtype=np.int64)
    if len(peaks) == 0:
        return []
    unique, inverse = np.unique(np.stack([peaks, steps], axis=1), axis=0, return_inverse=True)
    inverse = inverse.ravel()
    lowest = np.full(len(unique), len(peaks), dtype=np.int64)
    np.minimum.at(lowest, inverse, np.arange(len(peaks)))
    order = np.lexsort((lowest, -unique[:, 0]))[:count]
    return [{"tiles": np.flatnonzero(inverse == g).tolist(), "peak_bytes": int(unique[g, 0]),
             "peak_step": int(unique[g, 1])} for g in order]


def kib_ticks(span: int, count: int) -> list[int]:
    """Byte offsets of the ticks of an axis over ``[0, span]``: multiples of a power-of-two
    number of KiB (128 KiB steps add up at a glance, 125,000-byte ones do not) giving at most
    about ``count`` intervals, then ``span`` itself, so the axis ends on the memory size (a
    regular tick under 0.8 of a step before it is dropped: at the page's scales its label
    would touch the end's)."""
    if span <= 0:
        return [0]
    step = 1024
    while span / step > count:
        step *= 2
    ticks = list(range(0, span, step))
    if len(ticks) > 1 and span - ticks[-1] < 0.8 * step:
        ticks.pop()
    return [*ticks, span]


def unplaced(program: Program, placement: Placement) -> dict[str, int]:
    """How many buffers, and buffer-tile pairs, placement left without an address: what a
    failed placement's page must say before anything else ("does it fit")."""
    missing = [int((placement.addresses[b.id, b.tiles] < 0).sum()) for b in program.buffers]
    return {"buffers": sum(1 for m in missing if m), "pairs": sum(missing)}


def buffer_rows(program: Program, parts: dict[int, Part]) -> list[dict[str, Any]]:
    """The page's buffer records: internal name and its model part; ``type`` in words from
    the buffer's layout where it has one (``description`` keeps the reference's log text,
    which is no reading for a person), else the description, already in words."""
    return [
        {"name": b.name, "part": step_label(b.name, parts), "bytes": b.nbytes,
         "class": b.memory_class.value, "first": b.first, "last": b.last,
         "description": b.description,
         "type": b.layout.human() if b.layout is not None else b.description}
        for b in program.buffers
    ]


def _distinct_rows(rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Distinct rows of ``rows`` (tiles first) and each tile's index into them."""
    if rows.shape[1] == 0:
        return rows[:1], np.zeros(len(rows), dtype=np.int64)
    first, inverse = distinct_rows(rows)
    return rows[first], inverse


def placement_data(
    program: Program,
    placement: Placement,
    support: dict[str, np.ndarray],
    target: Target,
    title: str,
    busiest: int = 32,
    parts: dict[int, Part] | None = None,
) -> dict[str, Any]:
    """The JSON the placement page embeds; a tile's peak is its support plus its signature's.

    Support sizes differ per tile (code, exchange tables) while buffer addresses repeat, so
    support rows and address signatures are deduplicated separately.
    """
    live = live_bytes(program, placement)
    live_total = live[MemoryClass.STANDARD] + live[MemoryClass.INTERLEAVED]
    tiles = placement.addresses.shape[1]
    signatures, tile_signature = _distinct_rows(placement.addresses.T)
    representative = np.full(len(signatures), tiles, dtype=np.int64)
    np.minimum.at(representative, tile_signature, np.arange(tiles))  # first tile of each
    kinds = [k for k in support if k != "total"]
    support_rows = np.stack(
        [placement.support_bytes.astype(np.int64)]
        + [np.asarray(support[k], dtype=np.int64) for k in kinds],
        axis=1,
    )
    supports, tile_support = _distinct_rows(support_rows)
    peaks = placement.support_bytes.astype(np.int64) + live_total.max(axis=0)
    sig_data = []
    for row, tile in zip(signatures, representative, strict=True):
        column = live_total[:, tile]
        sig_data.append({
            "buffers": [[int(b), int(a)] for b, a in enumerate(row) if a >= 0],
            "live_peak": int(column.max()),
            "live_peak_step": int(column.argmax()),
        })
    span = target.memory_end - target.memory_base
    peak_steps = live_total.argmax(axis=0)
    return {
        "title": title,
        "target": target.name,
        "tiles": tiles,
        "cols": max(1, math.ceil(math.sqrt(tiles * 46 / 32))),
        "memory_base": target.memory_base,
        "memory_end": target.memory_end,
        "interleaved_base": target.interleaved_base,
        "steps": step_names(program),
        "step_parts": step_parts(program, parts or {}),
        "buffers": buffer_rows(program, parts or {}),
        "support_kinds": ["total", *kinds],
        "supports": supports.tolist(),
        "signatures": sig_data,
        "tile_signature": tile_signature.tolist(),
        "tile_support": tile_support.tolist(),
        "busiest": _busiest(peaks, peak_steps, busiest),
        "busiest_groups": busiest_groups(peaks, peak_steps, BUSIEST_GROUPS),
        "scale_ticks": kib_ticks(span, 5),
        "address_ticks": kib_ticks(span, 10),
        "unplaced": unplaced(program, placement),
    }


def placement_html(
    program: Program,
    placement: Placement,
    support: dict[str, np.ndarray],
    target: Target,
    title: str,
    busiest: int = 32,
    parts: dict[int, Part] | None = None,
) -> str:
    """One self-contained page (inline CSS and JS, no network) of the exact tile placement;
    ``parts`` (each stage's model part) name the buffers for a person."""
    data = placement_data(program, placement, support, target, title, busiest, parts)
    body = (PAGE_BODY.replace("@TITLE@", html.escape(title)).replace("@JS@", PAGE_JS)
            .replace("@DATA@", inert_json(data)))
    return standalone_page(title, PAGE_CSS, body)


def write_placement_html(
    path: str | os.PathLike[str],
    program: Program,
    placement: Placement,
    support: dict[str, np.ndarray],
    target: Target,
    title: str,
    parts: dict[int, Part] | None = None,
) -> None:
    """Write :func:`placement_html` atomically."""
    page = placement_html(program, placement, support, target, title, parts=parts)
    write_text_atomic(path, page)
    event(LOG, "wrote exact tile placement profile", path=str(path), bytes=len(page))
