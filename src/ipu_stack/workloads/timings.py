"""How long a builtin workload takes on the 2-core development machine, for the listing: the
compile and simulate seconds of ``ipu-stack bench NAME`` at its defaults (with the fewest
chips it needs), as measured in docs/benchmarks.md.  They are measurements of one machine,
shown so that a new user knows whether to wait seconds or minutes; the benchmark scripts
re-measure them."""

from __future__ import annotations

# name -> (the command's extra flags, compile s, simulate s, wall s where the table gives
# it), docs/benchmarks.md
MEASURED: dict[str, tuple[str, float, float, float | None]] = {
    "attention": ("", 2.5, 0.4, None),
    "vit-layer": ("", 4.4, 0.8, None),
    "siglip-mlp": ("", 3.9, 1.4, None),
    "siglip-attention": ("", 10.3, 2.4, None),
    "siglip-layer": ("", 14.8, 4.0, None),
    "pe-block": ("", 8.1, 2.2, None),
    "siglip-vision": ("", 38.0, 80.4, 185),
    "pe-vision": ("", 33.6, 47.6, 98),
    "siglip2-giant": (" --chips 2", 14.0, 315.0, 548),
    "pe-giant": (" --chips 4", 53.9, 150.0, 416),
    "clip-text": (" --batch 4", 8.75, 16.83, 31),
    "bert-base": (" --batch 8", 33.4, 84.18, 131),
    "roberta-base": (" --batch 10 --images 4", 17.46, 141.8, 164),
    "smollm2-135m": ("", 9.32, 12.87, 29),
    "tinyllama-1.1b": (" --chips 2", 19.84, 44.11, 73),
    "qwen3-0.6b": (" --chips 2 --context 160 --tokens 1", 11.67, 28.61, 43),
    "smolvlm-256m": (" --part vision", 14.93, 34.78, 61),
    "swin-l": (" --batch 2", 273.9, 75.6, 399),
}


def _seconds(value: float) -> str:
    return f"{value:.0f} s" if value < 90 else f"{value // 60:.0f} min {value % 60:.0f} s"


def timing_line(name: str) -> str | None:
    """``bench siglip-vision on 2 cores: compile 20 s, simulate 66 s, 2 min 5 s in all``."""
    if name not in MEASURED:
        return None
    flags, compile_s, simulate_s, wall_s = MEASURED[name]
    wall = f", {_seconds(wall_s)} in all" if wall_s is not None else ""
    return (f"bench {name}{flags} on 2 cores: compile {_seconds(compile_s)}, simulate "
            f"{_seconds(simulate_s)}{wall} (docs/benchmarks.md)")
