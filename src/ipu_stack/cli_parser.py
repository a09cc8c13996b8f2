"""The ``ipu-stack`` command line's arguments: every command, its options, and the workload
parameters they take (``cli`` runs the commands)."""

from __future__ import annotations

import argparse
import os
from functools import lru_cache
from typing import Any

from ipu_stack import __version__
from ipu_stack.phases.state import GEMM_MODES, STRATEGIES
from ipu_stack.runtime.engines import ENGINES
from ipu_stack.util.arguments import OneLineParser
from ipu_stack.workloads import REGISTRY


def _add_workload_options(parser: argparse.ArgumentParser, first: str | None = None) -> None:
    """The workload and the compile's options; ``first``: the workload whose meaning of a
    shared parameter its help gives."""
    parser.add_argument("workload", help="builtin workload (see `ipu-stack workloads`) or a "
                        "torch.export program MODEL.pt2 (docs/frontend.md) or an ONNX file MODEL.onnx "
                        "(docs/onnx.md)")
    _add_parameters(parser, first)
    parser.add_argument("--inputs", default=None, metavar="FILE.npz",
                        help="MODEL.pt2 or MODEL.onnx only: the program's inputs (default: random "
                        "from --seed)")
    parser.add_argument("--target", default="ipu21", choices=("ipu21",),
                        help="the IPU to compile for: ipu21, the C600's (the device the "
                        "simulator is; a package names its target and runs only there)")
    parser.add_argument("--finalists", type=int, default=3,
                        help="operator-plan sets the planner keeps; each is lowered and "
                        "scheduled, the fastest kept (default 3)")
    parser.add_argument("--memory-proportion", type=float, default=1.0,
                        help="share of tile memory the planner may plan for (0-1]")
    parser.add_argument("--diagnostics", action="store_true",
                        help="log every stage's agreement with the host's rerun of it on the "
                        "device's inputs, by layer")
    parser.add_argument("--cache-dir", default=None,
                        help="cache of tower calibrations and (with --exchange-cache) exchange "
                        "schedules (default ~/.cache/ipu-stack)")
    parser.add_argument("--paired-exchange", action=argparse.BooleanOptionalAction,
                        default=True,
                        help="target option: paired tiles share an exchange bus (two-lane "
                        "transfers to whole tile pairs; default on, --no-paired-exchange "
                        "sends every word on one lane)")
    parser.add_argument("--fuse-supersteps", action=argparse.BooleanOptionalAction,
                        default=True,
                        help="a decode step runs its independent stages side by side, their "
                        "compute sets and exchange phases fused, and any other program fuses "
                        "a step with the 8 supersteps before it (default on; "
                        "--no-fuse-supersteps runs one stage after another)")
    parser.add_argument("--gemm-mode", choices=GEMM_MODES, default="auto",
                        help="GEMM mode: native FP8 with FP16 partials, F16 with F32 partials "
                        "(FP8 data cast first), or auto (the planner picks per stage)")
    parser.add_argument("--exchange-cache", action="store_true",
                        help="also keep verified exchange schedules on disk under the cache dir")
    parser.add_argument("--dump-stages", metavar="DIR", default=None,
                        help="write each compile stage's artifact into DIR (graph text, plans, "
                        "program, kernels, placement summary, device program)")
    parser.add_argument("--strategy", choices=STRATEGIES, default=None,
                        help="layers (the default on one chip): every layer over the whole "
                        "chip, one after another (the batch-1 latency answer); pipeline (the "
                        "default over several chips): consecutive layers on tile groups, "
                        "images streamed through them; auto: the higher images/s that fits")
    parser.add_argument("--chips", type=int, default=1,
                        help="C600 cards joined by IPU-Links in a line (1-8): the model's "
                        "layers are pipelined over all of them")
    parser.add_argument("--groups", type=int, default=None,
                        help="pipeline strategy: this many tile groups on each chip (with "
                        "--chips N, N times as many in all; default: the planner chooses)")
    parser.add_argument("--verify-stages", action="store_true",
                        help="run the verifiers of the lowered program and the placement "
                        "between the compile's stages")
    parser.add_argument("--unroll-layers", action="store_true",
                        help="plan and lower every layer on its own instead of running "
                        "identical layers as one loop body")


def _add_parameters(parser: argparse.ArgumentParser, first: str | None = None) -> None:
    """``--batch``, ``--keep-f16``, ...: every workload parameter, dashed as a flag, helped
    as workload ``first`` means it where it takes it."""
    for name, (kind, help_text) in sorted(workload_parameters(first).items()):
        flag = f"--{name.replace('_', '-')}"
        if kind is bool:
            parser.add_argument(flag, dest=name, action="store_true", default=None,
                                help=help_text)
        else:
            parser.add_argument(flag, dest=name, type=kind, default=None, help=help_text)


def _add_run_options(parser: argparse.ArgumentParser, outputs: bool = True) -> None:
    """The run's options; ``outputs``: whether its run writes a profile and tensors (generate
    and fp8-recipe run many programs and write neither, so they do not offer them)."""
    parser.add_argument("--json", action="store_true", help="print the record as one JSON object")
    parser.add_argument("--record", action="store_true",
                        help="print the record as one key=value line, also at a terminal")
    if outputs:
        parser.add_argument("--save-tensors", metavar="DIR",
                            help="write inputs, weights, outputs .npz")
    else:
        parser.set_defaults(save_tensors=None, profile=None)
    parser.add_argument("--device", metavar="NAME",
                        help="run on the shared simulated device NAME, waiting while another "
                        "run owns it (default: a private device; nothing waits)")
    parser.add_argument("--no-wait", action="store_true",
                        help="with --device: fail at once if another process owns it")
    if outputs:
        parser.add_argument("--profile", metavar="DIR",
                            help="record the run: DIR/profile.json, trace.json (Perfetto), "
                            "report.html")
    parser.add_argument("--poison", action="store_true",
                        help="fault on any read of memory that was never written")
    parser.add_argument("--engine", choices=ENGINES, default=None,
                        help="where a pipeline's chips are simulated: in this process (the "
                        "default on one chip), a forked process a chip (local, the default "
                        "over several) or a Ray actor a chip (pip install 'ipu-stack[ray]')")
    parser.add_argument("--lock", default=None, help=argparse.SUPPRESS)


GLOBAL_FLAGS = ((("--debug",), "tracebacks and debug logs"),
                (("-v", "--verbose"), "the INFO log of every phase (default: warnings and "
                 "errors)"),
                (("--quiet",), "warnings and errors only (the default)"))


@lru_cache(maxsize=1)
def build_parser() -> OneLineParser:
    """The command line's parser, built once a process: it is the same for every call (its
    hundreds of options take ~30 ms to add, which every in-process ``main`` paid again);
    parsing leaves it as it was."""
    parser = OneLineParser(prog="ipu-stack", description=(
        "Compile transformers for the Graphcore C600 (ipu21), run them on a simulated IPU "
        "that counts cycles, and check every output against a host reference. "
        "`ipu-stack COMMAND --help` for a command's options."))
    parser.add_argument("--version", action="version", version=f"ipu-stack {__version__}")
    for flag, help_text in GLOBAL_FLAGS:
        parser.add_argument(*flag, action="store_true", help=help_text)
    sub = parser.add_subparsers(dest="command", required=True)
    _add_model_commands(sub)
    _add_sweep_command(sub)
    _add_package_commands(sub)
    _add_profile_commands(sub)
    parser.commands = sub.choices
    parser.add_global_flags(*GLOBAL_FLAGS)
    return parser


def _add_model_commands(sub: Any) -> None:
    """``compile``, ``bench`` and ``capacity``: the commands that take a workload."""
    p = sub.add_parser("compile", help="compile a workload into DIR/model.ipuexe")
    _add_workload_options(p)
    p.add_argument("-o", "--out", required=True)

    p = sub.add_parser("bench", help="compile, run, check and print the benchmark line")
    _add_workload_options(p)
    p.add_argument("--out", help="package and reports folder (default artifacts/<workload>/)")
    p.add_argument("--images", type=int, default=None,
                   help="batches of --batch images streamed through the groups, each "
                   "checked (default: as many as there are groups, the fewest that fill a "
                   "step); the layers strategy runs them one after another on its loaded "
                   "chip: a larger batch as micro-batches")
    _add_run_options(p)

    p = sub.add_parser("generate", help="greedy generation with a decoder's KV cache on the "
                       "device (a builtin decoder or VLM, or MODEL.pt2: a step exported with a "
                       "static cache): the prompt's pass, then NEW tokens, every call checked")
    _add_workload_options(p, first="smollm2-135m")
    p.add_argument("--prompt-tokens", type=int, default=16, help="prompt tokens a sequence "
                   "(random ids, seeded; default 16)")
    p.add_argument("--new-tokens", type=int, default=8, help="tokens to generate (default 8)")
    p.add_argument("--prompt-by-steps", action="store_true", help="feed the prompt a token a "
                   "step through the decode program (default: the prompt's pass, a program "
                   "of its own, fills the cache)")
    p.add_argument("--image-program", metavar="IMAGE.pt2", help="with MODEL.pt2 (a step exported with "
                   "inputs_embeds): a VLM's image program, run first; its rows open the "
                   "prompt (benchmarks/export_smolvlm.py); --inputs are its pixels")
    p.add_argument("--micro-batches", type=int, metavar="M", help="the batch as M micro-batches in "
                   "flight, one a step of the chips' pipeline, each in its own range of the "
                   "caches (default: one a chip with --chips, where the batch divides)")
    p.add_argument("--out", help="package folder (default artifacts/<workload>/)")
    _add_run_options(p, outputs=False)

    p = sub.add_parser("fp8-recipe", help="the fewest layers to keep F16 for an FP8 model "
                       "to stay within --max-error of the float64 model; measured beside "
                       "all-F16 and all-FP8")
    _add_workload_options(p)
    p.add_argument("--max-error", type=float, default=0.1,
                   help="bound on the outputs' relative RMS error against the float64 model")
    p.add_argument("--out", help="the three packages' folder (default artifacts/<workload>-"
                   "recipe/)")
    _add_run_options(p, outputs=False)

    p = sub.add_parser("capacity", help="largest batch, layer count or KV cache that compiles")
    _add_workload_options(p)
    group = p.add_mutually_exclusive_group(required=True)
    group.add_argument("--max-batch", type=int, help="search batch sizes up to N")
    group.add_argument("--max-blocks", type=int, help="search stacked-layer counts up to N")
    group.add_argument("--max-layers", type=int, help="search a tower's layer counts up to N")
    group.add_argument("--max-context", type=int, help="a decoder's longest KV cache (decode "
                       "step positions) up to N")
    group.add_argument("--max-chips", type=int,
                       help="the fewest C600 cards (up to N) the workload fits, pipelined")
    p.add_argument("--json", action="store_true")


def _add_package_commands(sub: Any) -> None:
    """The commands that take a package, a profile, a torch program or nothing."""
    p = sub.add_parser("run", help="run a package on the simulated ipu21 and check it")
    p.add_argument("package")
    _add_run_options(p)

    p = sub.add_parser("inspect", help="summarise a package")
    p.add_argument("package")
    p.add_argument("--json", action="store_true")
    sub.add_parser("workloads", help="list builtin workloads with parameters and defaults")


def _add_sweep_command(sub: Any) -> None:
    p = sub.add_parser("sweep", help="compile and run a grid of points; results.jsonl, "
                       "results.csv, sweep.html in DIR (resumes where it stopped)")
    p.add_argument("workload", nargs="?", help="builtin workload (see `ipu-stack workloads`)")
    _add_parameters(p)
    p.add_argument("--grid", action="append", default=[], metavar="NAME=V1,V2,...",
                   help="a workload parameter or compile option and its values (repeatable)")
    p.add_argument("-o", "--out", help="the sweep's folder")
    p.add_argument("--engine", choices=("local", "ray"), default="local")
    p.add_argument("--workers", type=int, default=os.cpu_count() or 1,
                   help="local engine: worker processes (default: the number of cores)")
    p.add_argument("--address", help="ray engine: the cluster (default: a local Ray)")
    p.add_argument("--summary", metavar="DIR", help="print the table of a sweep and stop")
    p.add_argument("--finalists", type=int, default=3)
    p.add_argument("--memory-proportion", type=float, default=1.0)
    p.add_argument("--cache-dir", default=None)


def _add_profile_commands(sub: Any) -> None:
    p = sub.add_parser("profile", help="summarise an execution profile, or compare two "
                       "(PROFILE.json, its folder, or a package to run)")
    p.add_argument("paths", nargs="+", metavar="PROFILE_OR_PACKAGE")
    p.add_argument("--device", metavar="NAME",
                   help="run a package on the shared simulated device NAME (default: private)")
    p.add_argument("--lock", default=None, help=argparse.SUPPRESS)
    p = sub.add_parser("ops", help="list every operation of a model file (MODEL.pt2 or "
                       "MODEL.onnx), supported or not")
    p.add_argument("model", metavar="MODEL", help="a torch.export program (MODEL.pt2) or an "
                   "ONNX model (MODEL.onnx)")
    p.add_argument("--json", action="store_true", help="one JSON object per line")
    p.add_argument("--tokens", type=int, default=0, metavar="N",
                   help="an ONNX model's symbolic sequence length, to trace it at")

    p = sub.add_parser("exchange", help="schedule or verify exchange instances")
    esub = p.add_subparsers(dest="exchange_command", required=True)
    p.commands = esub.choices
    q = esub.add_parser("schedule")
    q.add_argument("instance")
    q.add_argument("-o", "--out", required=True)
    q.add_argument("--paired", action="store_true",
                   help="paired-tiles option: transfers to whole tile pairs may use two lanes")
    q = esub.add_parser("verify")
    q.add_argument("instance")
    q.add_argument("schedule")


def workload_parameters(first: str | None = None) -> dict[str, tuple[type, str]]:
    """Every parameter any builtin workload takes: name -> (type, help), the help of
    workload ``first`` where it takes the parameter (``generate``'s ``--batch`` counts
    sequences, not a tower's images)."""
    found: dict[str, tuple[type, str]] = {}
    ordered = sorted(REGISTRY.values(), key=lambda workload: workload.name != first)
    for workload in ordered:
        for p in workload.parameters:
            found.setdefault(p.name, (p.kind, p.help))
    return found
