"""The answer a person reads at a terminal: a run's record said in a few lines.

The benchmark record has about sixty fields, which scripts want (``--json``, or the
``key=value`` line when the output is not a terminal); a person wants the verdict, the time,
the throughput, what limits the run and where to look next.  These lines are made from the
record alone, so they say nothing the record does not.
"""

from __future__ import annotations

from typing import Any

# the record's ``*Cycles`` fields that are kinds of work (the rest are totals or figures)
_KINDS = {"gemm": "GEMM", "exchange": "exchange", "reduce": "reduce", "softmax": "softmax",
          "layerNorm": "layer norm", "gelu_tanh": "GELU", "gelu": "GELU", "cast": "casts",
          "copy": "on-tile copies", "elementwise": "bias passes", "add": "residual adds",
          "rope": "RoPE", "sync": "syncs", "rmsNorm": "RMS norm", "swiglu": "SwiGLU",
          "bias_gelu": "bias + GELU"}


def figure(value: float) -> str:
    return f"{value:,.0f}" if value >= 100 else f"{value:,.1f}"


def _limits(record: dict[str, Any]) -> str | None:
    """The largest kinds of work, each as a share of the run's cycles (the busiest tile of
    each superstep, as the record counts them)."""
    cycles = record.get("cycles") or 0
    shares: dict[str, int] = {}
    for key, value in record.items():
        kind = key.removesuffix("Cycles")
        if key.endswith("Cycles") and kind in _KINDS and isinstance(value, int):
            shares[_KINDS[kind]] = shares.get(_KINDS[kind], 0) + value
    if not cycles or not shares:
        return None
    top = sorted(shares.items(), key=lambda item: -item[1])[:4]
    return ", ".join(f"{name} {100 * value / cycles:.0f} %" for name, value in top)


def verdict_words(record: dict[str, Any]) -> str:
    """What the verdict found, in words."""
    if record.get("numericalTest") != "PASS":
        failed = record.get("failedParts")
        first = record.get("firstFailingStage")
        where = f"; first failing stage {first}" if first and first != "none" else ""
        return f"the numbers are wrong: {failed}{where} (the record names each part)"
    mismatch = record.get("stageMismatch") or 0
    stages = ("every stage equals the device-precision reference" if not mismatch else
              f"every stage within the tolerance ({mismatch:g} of one stage's elements a "
              "ulp off)")
    noise = record.get("noiseRatio")
    source = record.get("referenceSource") or "float64"
    against = "the float64 model" if source == "float64" else f"{source}'s own outputs"
    ideal = "" if noise is None else (f"; error against {against} {noise:g}x what the "
                                      "precisions explain")
    return stages + ideal


def answer_lines(record: dict[str, Any], command: str) -> list[str]:
    """At most a dozen lines: verdict, cycles and time, throughput, share of peak, what
    limits the run, the numbers, the package and the next command."""
    verdict = record.get("numericalTest", "?")
    stream = record.get("strategy") == "pipeline"
    size = ", ".join(f"{key} {record[key]}" for key in ("batch", "chips", "images")
                     if key in record and (key != "chips" or record[key] > 1))
    lines = [f"{verdict}  {record.get('workload')}" + (f" ({size})" if size else "")]
    cycles = record.get("cycles", 0)
    rate = record.get("imagesPerSecond", 0.0)
    batch = record.get("batch", 1)
    microseconds = record.get("deviceMicroseconds") or (1e6 * batch / rate if rate else 0.0)
    what = "a pipeline step" if stream else "the run"
    estimate = record.get("estimatedCycles")
    lines.append(f"  {figure(cycles)} cycles = {figure(microseconds)} us for {what} "
                 f"(the compiler estimated {figure(estimate or 0)})")
    with_host = record.get("qpsWithHost")
    host = f" ({figure(with_host)} with host transfers)" if with_host else ""
    # a token model's run takes a batch of sequences (its record counts their vocabulary)
    item, one = ("sequence", "a sequence") if "vocabulary" in record else ("image", "an image")
    lines.append(f"  {figure(rate)} {item}s/s{host}")
    if stream:
        lines.append(f"  {record.get('pipelineGroups')} groups; latency "
                     f"{figure(record.get('latencyMicroseconds', 0.0))} us {one}; "
                     f"{record.get('imagesPassed')}/{record.get('images')} {item}s pass")
    peak = [f"{record['efficiencyPercent']} % of the FP16 peak"] \
        if "efficiencyPercent" in record else []
    if record.get("rooflinePercent"):
        peak.append(f"{record['rooflinePercent']} % of the AMP roofline of its precisions")
    if peak:
        lines.append("  " + ", ".join(peak))
    limits = _limits(record)
    if limits:
        lines.append(f"  time goes to: {limits}")
    lines.append(f"  numbers: {verdict_words(record)}")
    lines.append(f"  package: {record.get('package')}")
    lines.append(f"  more: `ipu-stack {command} ... --json` (the whole record), "
                 "`--profile DIR` (report.html, then `ipu-stack profile DIR`)")
    return lines


__all__ = ["answer_lines", "figure", "verdict_words"]
