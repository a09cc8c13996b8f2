"""A generation's record: the verdict over every call, the tokens against the reference's,
the time to the first token and a decode step's, and what the cache holds."""

from __future__ import annotations

import logging
from typing import Any

import numpy as np

from ipu_stack.device.pricing import host_cycles
from ipu_stack.generation.run import GenerationRun
from ipu_stack.ir.graph import state_writes
from ipu_stack.runtime.answer import figure, verdict_words
from ipu_stack.runtime.record import verdict_fields
from ipu_stack.runtime.stream import StreamRun
from ipu_stack.target import get_target
from ipu_stack.util.log import event

LOG = logging.getLogger("ipu_stack.generation")


def _calls(run: StreamRun, calls: int, clock: float) -> tuple[list[int], list[int], int]:
    """Each call's device cycles (its groups in order, and every hand-off: each link, each
    on-chip hand-off phase), each call's host transfer cycles, and the hand-offs."""
    per_chip = run.groups // run.chips
    handoffs = sum(run.link_cycles) + sum(h * (per_chip - 1) for h in run.chip_handoffs)
    cycles = [sum(r.cycles for (_, n), r in run.runs.items() if n == number) + handoffs
              for number in range(calls)]
    host = [host_cycles(sum(r.host_bytes for (_, n), r in run.runs.items() if n == number),
                        clock) for number in range(calls)]
    return cycles, host, handoffs


def pipeline_step(run: StreamRun, clock: float) -> int:
    """A step of the chips' pipeline with micro-batches in flight: each chip's full step
    and its own host transfers (its card's PCIe link, not overlapped with its step), the
    slowest chip's, then the link phase."""
    moved = [run.chip_host_bytes(number) for number in {number for _, number in run.runs}]
    own = [host_cycles(max(call[chip] for call in moved), clock) for chip in range(run.chips)]
    return max(full + host for full, host in zip(run.chip_full_cycles, own, strict=True)) \
        + max(run.link_cycles, default=0)


def _timing(gen: GenerationRun, clock: float, cache_bytes: int) -> dict[str, Any]:
    """The time to the first token and a decode step's: from the prompt's pass (and the
    prompt's rows of the caches, ``cache_bytes`` in all, handed to the decode program at the
    host link's rate), or from the prompt's steps; a decode step's cycles with its host
    transfers.  With micro-batches in flight a step of the pipeline
    (:func:`pipeline_step`) advances one micro-batch, so a sequence's next token comes
    ``M`` such steps later."""
    batch, prompt = gen.feed.prompt.shape
    micro = gen.feed.micro_batches
    cycles, host, handoffs = _calls(gen.decode, len(gen.feed), clock) if gen.decode \
        else ([], [], 0)
    image = 0 if gen.image_run is None else (gen.image_run.run.cycles
                                             + gen.image_run.run.host_cycles)
    period = pipeline_step(gen.decode, clock) if gen.decode and micro > 1 else None
    if gen.prompt_run is not None:
        first, first_host, _ = _calls(gen.prompt_run, micro, clock)
        state = next(iter(state_writes(gen.graph)))
        positions = gen.graph.value(state).type.rows // (batch // micro) // micro
        filled = cache_bytes * prompt // positions
        prefill = sum(first)  # the micro-batches' passes one after another
        ttft = image + prefill + sum(first_host) + host_cycles(filled, clock)
        decode, decode_host = cycles, host
    else:
        steps = prompt * micro
        decode, decode_host = cycles[steps:], host[steps:]
        prefill = sum(cycles[:steps]) if period is None else \
            prompt * micro * gen.decode.steady_cycles
        ttft = image + (prefill + sum(host[:steps]) if period is None
                        else prompt * micro * period)
        filled = 0
    step = None if not decode else (max(decode) + max(decode_host) if period is None
                                    else micro * period) / clock
    return {"ttftMicroseconds": round(ttft / clock * 1e6, 3),
            "tpotMicroseconds": None if step is None else round(step * 1e6, 3),
            "tokensPerSecond": None if step is None else round(batch / step, 1),
            "prefillCycles": prefill, "decodeCycles": max(decode, default=None),
            "decodeCyclesMin": min(decode, default=None), "handoffCycles": handoffs,
            "microBatches": micro, "periodCycles": period,
            "cacheHandoffBytes": filled,
            **({} if gen.image_run is None else {"imageCycles": gen.image_run.run.cycles})}


def generation_fields(gen: GenerationRun, fields: dict[str, Any]) -> dict[str, Any]:
    """The record: the verdict over every call, the tokens against the reference's, the time
    to the first token, a decode step's time and the tokens a second it gives, and what the
    cache holds."""
    clock = get_target(gen.package.target).clock_hz
    feed, batch = gen.feed, gen.feed.prompt.shape[0]
    runs = [r for r in (gen.prompt_run, gen.decode) if r is not None]
    verdicts = [v for r in runs for v in r.verdicts] + (
        [] if gen.image_run is None else [gen.image_run.verdict])
    chosen, expected = np.array(feed.chosen), np.array(feed.expected)
    ties = int(np.array(feed.tied).sum())
    differ = np.argwhere(chosen != expected)
    cache_bytes = sum(gen.graph.value(s).type.nbytes for s in state_writes(gen.graph))
    worst = max(verdicts, key=lambda v: (not v.passed, getattr(v.worst, "max_ulps", 0)))
    record = {
        "numericalTest": "PASS" if all(v.passed for v in verdicts) else "FAIL",
        **fields,
        "batch": batch,
        "chips": runs[-1].chips,
        "promptTokens": feed.prompt.shape[1],
        "newTokens": feed.new_tokens,
        "prefill": "one pass" if gen.prompt_run is not None else "a token a step",
        # where each next token is chosen: an argmax on the device, or the host's of the logits
        "tokensChosenOn": "device" if feed.on_device else "host",
        "tokensMatch": len(differ) == ties,
        "tokensDiffering": int(len(differ)),
        "tokensTied": ties,
        "firstDifferingMargin": round(float(feed.margins[differ[0][0]][differ[0][1]]), 6)
        if len(differ) else None,
        **_timing(gen, clock, cache_bytes),
        "kvCacheBytes": cache_bytes,
        "peakTileBytes": int(gen.package.manifest["memory"]["peak_bytes"]),
        **verdict_fields(worst),
        # the image program's run counts too
        "verdictSeconds": round(sum(r.verdict_seconds for r in runs) + (
            0.0 if gen.image_run is None else gen.image_run.verdict.seconds), 2),
        "simulateSeconds": round(sum(r.simulate_seconds for r in runs) + (
            0.0 if gen.image_run is None else gen.image_run.simulate_seconds), 2),
        "hostPeakBytes": max(r.host_peak_bytes for r in runs),
        "generated": chosen[:, 0].tolist() if len(chosen) else [],
    }
    event(LOG, "generated", tokens=feed.new_tokens, batch=batch,
          tokensMatch=record["tokensMatch"], tpotMicroseconds=record["tpotMicroseconds"])
    return record
def generation_answer(record: dict[str, Any]) -> list[str]:
    """A generation said in a few lines: the time to the first token, a token's time and
    the tokens a second, the tokens against the reference's, the cache, the numbers."""
    lines = [f"{record.get('numericalTest', '?')}  {record.get('workload')} (batch "
             f"{record.get('batch')}" + (f", chips {record['chips']}" if record.get("chips", 1)
                                          > 1 else "") + ")"]
    lines.append(f"  prompt of {record.get('promptTokens')} tokens ({record.get('prefill')}): "
                 f"first token after {figure(record.get('ttftMicroseconds') or 0.0)} us")
    if record.get("tpotMicroseconds"):
        lines.append(f"  then {figure(record['tpotMicroseconds'])} us a token = "
                     f"{figure(record.get('tokensPerSecond') or 0.0)} tokens/s "
                     f"({figure(record.get('decodeCycles') or 0)} cycles a decode step)")
    differ, ties = record.get("tokensDiffering", 0), record.get("tokensTied", 0)
    lines.append(f"  tokens: {'all equal' if not differ else f'{differ} differ ({ties} ties)'}"
                 " against the device-precision reference's choices")
    if record.get("torchTokenMatch") is not None:  # a model file: PyTorch's own greedy run
        lines.append("  PyTorch's own tokens: " + (
            "all equal" if record["torchTokenMatch"] else
            f"differ from step {record.get('torchFirstDifferingStep')} (its logits' margin "
            f"there {record.get('torchMarginThere') or 0.0:.3g})"))
    cache = record.get("kvCacheBytes", 0)
    size = f"{cache / 1e6:.1f} MB" if cache >= 100_000 else f"{cache / 1e3:.1f} KB"
    lines.append(f"  KV cache {size}; the fullest tile holds "
                 f"{figure(record.get('peakTileBytes') or 0)} bytes")
    lines.append(f"  numbers: {verdict_words(record)}")
    lines.append("  more: `ipu-stack generate ... --json` (the whole record)")
    return lines


__all__ = ["generation_answer", "generation_fields", "pipeline_step"]
