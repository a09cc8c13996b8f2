"""The ``ipu-stack`` command line: compile, run, bench, inspect, workloads, exchange.

Errors the user can fix print one line (``error: ...``) and exit non-zero: 2 for usage and
compile errors, 1 for a numerical FAIL.  ``--debug`` shows tracebacks and debug logs.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from pathlib import Path
from typing import Any

from ipu_stack import __version__
from ipu_stack.capacity import capacity_options, probe_capacity, probe_chips
from ipu_stack.device import device_lock
from ipu_stack.frontend import is_onnx_path, is_program_path
from ipu_stack.pipeline import CompileOptions
from ipu_stack.profile import Profile, format_compare, format_summary, load_profile
from ipu_stack.profile.capture import profile_of_outcome, write_run_profile
from ipu_stack.runtime.answer import answer_lines
from ipu_stack.runtime.engines import ENGINES
from ipu_stack.runtime.execute import (
    RunSettings,
    inspect_package,
    rebuild_workload,
    run_any,
    save_tensors,
)
from ipu_stack.runtime.session import load_package, refuse_group_program
from ipu_stack.strategy import compile_strategy
from ipu_stack.sweep import expand, format_table, parse_grid, read_results, run_sweep
from ipu_stack.target.links import get_system
from ipu_stack.util import log
from ipu_stack.util.arguments import OneLineParser
from ipu_stack.util.errors import IpuStackError, PlacementError, UsageError
from ipu_stack.util.files import check_output_file, check_output_folder
from ipu_stack.workloads import REGISTRY, get_workload
from ipu_stack.workloads.footprint import footprint_line
from ipu_stack.workloads.timings import timing_line

LOG = logging.getLogger("ipu_stack.cli")


def _add_workload_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("workload", help="builtin workload (see `ipu-stack workloads`) or a "
                        "torch.export program MODEL.pt2 (docs/frontend.md)")
    for name, (kind, help_text) in sorted(workload_parameters().items()):
        if kind is bool:
            parser.add_argument(f"--{name}", action="store_true", default=None, help=help_text)
        else:
            parser.add_argument(f"--{name}", type=kind, default=None, help=help_text)
    parser.add_argument("--inputs", default=None, metavar="FILE.npz",
                        help="MODEL.pt2 only: the program's inputs (default: random from --seed)")
    parser.add_argument("--target", default="ipu21")
    parser.add_argument("--finalists", type=int, default=3)
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
    parser.add_argument("--gemm-mode", choices=("auto", "fp8", "f16"), default="auto",
                        help="GEMM mode: native FP8 with FP16 partials, F16 with F32 partials "
                        "(FP8 data cast first), or auto (the planner picks per stage)")
    parser.add_argument("--exchange-cache", action="store_true",
                        help="also keep verified exchange schedules on disk under the cache dir")
    parser.add_argument("--dump-stages", metavar="DIR", default=None,
                        help="write each compile stage's artifact into DIR (graph text, plans, "
                        "program, kernels, placement summary, device program)")
    parser.add_argument("--strategy", choices=("layers", "pipeline", "auto"), default=None,
                        help="layers (the default on one chip): every layer over the whole "
                        "chip, one after another (the batch-1 latency answer); pipeline (the "
                        "default over several chips): consecutive layers on tile groups, "
                        "images streamed through them; auto: the higher images/s that fits")
    parser.add_argument("--chips", type=int, default=1,
                        help="C600 cards joined by IPU-Links in a line (1-8): the tower's "
                        "layers are pipelined over all of them")
    parser.add_argument("--groups", type=int, default=None,
                        help="pipeline strategy: this many tile groups (default: the planner "
                        "chooses)")
    parser.add_argument("--verify-stages", action="store_true",
                        help="run the verifiers of the lowered program and the placement "
                        "between the compile's stages")
    parser.add_argument("--unroll-layers", action="store_true",
                        help="plan and lower every layer on its own instead of running "
                        "identical layers as one loop body")


def _add_run_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true", help="print the record as one JSON object")
    parser.add_argument("--record", action="store_true",
                        help="print the record as one key=value line, also at a terminal")
    parser.add_argument("--save-tensors", metavar="DIR", help="write inputs, weights, outputs .npz")
    parser.add_argument("--device", metavar="NAME",
                        help="run on the shared simulated device NAME, waiting while another "
                        "run owns it (default: a private device; nothing waits)")
    parser.add_argument("--no-wait", action="store_true",
                        help="with --device: fail at once if another process owns it")
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


def build_parser() -> OneLineParser:
    parser = OneLineParser(prog="ipu-stack", description=__doc__)
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
                   help="pipeline strategy: images streamed through the groups, each checked "
                   "(default: as many as there are groups, the fewest that fill a step)")
    _add_run_options(p)

    p = sub.add_parser("capacity", help="largest batch or number of layers that compiles")
    _add_workload_options(p)
    group = p.add_mutually_exclusive_group(required=True)
    group.add_argument("--max-batch", type=int, help="search batch sizes up to N")
    group.add_argument("--max-blocks", type=int, help="search stacked-layer counts up to N")
    group.add_argument("--max-layers", type=int, help="search a tower's layer counts up to N")
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
    for name, (kind, help_text) in sorted(workload_parameters().items()):
        if kind is bool:
            p.add_argument(f"--{name}", action="store_true", default=None, help=help_text)
        else:
            p.add_argument(f"--{name}", type=kind, default=None, help=help_text)
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
    p = sub.add_parser("ops", help="list every operation of a torch program (MODEL.pt2), "
                       "supported or not")
    p.add_argument("model")
    p.add_argument("--json", action="store_true", help="one JSON object per line")

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


def workload_parameters() -> dict[str, tuple[type, str]]:
    """Every parameter any builtin workload takes: name -> (type, help)."""
    found: dict[str, tuple[type, str]] = {}
    for workload in REGISTRY.values():
        for p in workload.parameters:
            found.setdefault(p.name, (p.kind, p.help))
    return found


def _params(args: argparse.Namespace) -> tuple[Any, dict[str, Any]]:
    if is_program_path(args.workload):
        return _program_params(args)
    if getattr(args, "inputs", None) is not None:
        raise UsageError("--inputs is for torch programs (MODEL.pt2), not builtin workloads")
    workload = get_workload(args.workload)
    overrides = {k: getattr(args, k) for k in workload_parameters()}
    known = {p.name for p in workload.parameters}
    for key, value in overrides.items():
        if value is not None and key not in known:
            raise UsageError(f"workload {workload.name} has no parameter --{key}")
    return workload, workload.resolve({k: v for k, v in overrides.items() if k in known})


def _program_params(args: argparse.Namespace) -> tuple[Any, dict[str, Any]]:
    """An imported torch program (``MODEL.pt2``) and its parameters from the options."""
    from ipu_stack.frontend import imported_workload

    workload, base = imported_workload(args.workload)
    known = {p.name for p in workload.parameters}
    overrides = {k: getattr(args, k, None) for k in workload_parameters()}
    for key, value in overrides.items():
        if value is not None and key not in known:
            raise UsageError(f"a torch program takes no --{key} (its sizes are the export's)")
    overrides = {k: v for k, v in overrides.items() if k in known}
    if getattr(args, "inputs", None):
        overrides["inputs"] = str(Path(args.inputs).resolve())
    return workload, workload.resolve({**base, **overrides})


def parse_workload(name: str, argv: list[str]) -> tuple[Any, dict[str, Any]]:
    """A workload and its resolved parameters from command-line options (``--tokens 64``),
    as ``compile`` would take them; for scripts (benchmarks) that drive the stages."""
    return _params(build_parser().parse_args(["compile", name, "-o", "-", *argv]))


def _options(args: argparse.Namespace) -> CompileOptions:
    if args.finalists < 1:
        raise UsageError("--finalists must be at least 1")
    if not 0 < args.memory_proportion <= 1:
        raise UsageError("--memory-proportion must be in (0, 1]")
    defaults = CompileOptions()
    return CompileOptions(
        target=args.target, finalists=args.finalists, diagnostics=args.diagnostics,
        memory_proportion=args.memory_proportion,
        cache_dir=args.cache_dir if args.cache_dir else defaults.cache_dir,
        paired_exchange=args.paired_exchange, exchange_cache=args.exchange_cache,
        gemm_mode=args.gemm_mode, share_layers=not args.unroll_layers,
        dump_stages=args.dump_stages, strategy=_strategy(args), groups=args.groups or 0,
        chips=args.chips, verify_stages=args.verify_stages,
    )


def _strategy(args: argparse.Namespace) -> str:
    """The strategy asked for, or the default: layers on one chip, pipeline over several
    (one program cannot span chips)."""
    get_system(args.target, args.chips)  # --chips in range, or one line why not
    return args.strategy or ("pipeline" if args.chips > 1 else "layers")


def _print_record(record: dict[str, Any], as_json: bool, command: str = "bench",
                  as_line: bool = False) -> None:
    """The record as JSON (``--json``), a few lines for a person at a terminal, or one
    ``key=value`` line for a script reading a pipe (or asking with ``--record``)."""
    if as_json:
        print(json.dumps(record))
    elif sys.stdout.isatty() and not as_line:
        print("\n".join(answer_lines(record, command)))
    else:
        print(" ".join(f"{k}={log.format_value(v)}" for k, v in record.items()))


_FOLDER_OPTIONS = (("out", "-o"), ("profile", "--profile"), ("save_tensors", "--save-tensors"),
                   ("cache_dir", "--cache-dir"), ("dump_stages", "--dump-stages"))


def _check_outputs(args: argparse.Namespace) -> None:
    """Refuse every output path the command was given that it could not write (a file or a
    device where a folder goes, a folder that cannot be created or written) before any work:
    one line, not a compile followed by a traceback."""
    if args.command == "exchange":
        if args.exchange_command == "schedule":
            check_output_file("-o", args.out)
        return
    for attr, option in _FOLDER_OPTIONS:
        value = getattr(args, attr, None)
        if value:
            check_output_folder("--out" if attr == "out" and args.command == "bench" else option,
                                value)


def _settings(args: argparse.Namespace) -> RunSettings:
    """The run options of ``bench`` and ``run``, the same for every strategy and chip count."""
    images = getattr(args, "images", None)
    if images is not None and images < 1:
        raise UsageError("--images must be at least 1")
    return RunSettings(images=images, engine=args.engine, record=bool(args.profile),
                       poison=args.poison, lock_path=_lock(args), wait=not args.no_wait,
                       send_package=args.engine == "ray")


def _run_and_report(args: argparse.Namespace, package_path: Path, graph, tensors, workload,
                    params, compile_seconds: float | None) -> int:
    outcome = run_any(package_path, graph, tensors, workload, params, compile_seconds,
                      _settings(args))
    if args.profile:
        write_run_profile(Path(args.profile), outcome)
    if args.save_tensors:
        save_tensors(args.save_tensors, graph, tensors, outcome)
    _print_record(outcome.record, args.json, args.command, args.record)
    return 0 if outcome.passed else 1


def cmd_compile(args: argparse.Namespace) -> int:
    workload, params = _params(args)
    result = compile_strategy(workload, params, Path(args.out), _options(args))
    cycles = int(result.estimate["cycles"])
    if sys.stdout.isatty():
        what = "a pipeline step" if result.strategy == "pipeline" else "a run"
        print(f"compiled {workload.identifier(params)} ({result.strategy}) in "
              f"{result.timings['compile']:.1f} s\n"
              f"  the compiler estimates {cycles:,} cycles for {what}\n"
              f"  package: {result.package}\n"
              f"  next: `ipu-stack run {Path(args.out)}` runs and checks it")
    else:
        print(f"package={result.package} strategy={result.strategy} estimatedCycles={cycles} "
              f"compileSeconds={result.timings['compile']:.2f}")
    return 0


def cmd_bench(args: argparse.Namespace) -> int:
    workload, params = _params(args)
    out = Path(args.out) if args.out else check_output_folder(
        "--out (default)", Path("artifacts") / workload.identifier(params))
    _settings(args)  # every run option checked before the compile
    options = _options(args)
    if options.strategy == "layers" and args.images not in (None, 1):
        raise UsageError("--images streams images through a pipeline; the layers strategy "
                         "runs one batch (use --batch, or --strategy pipeline)")
    if options.groups and args.images is not None and args.images < options.groups:
        raise UsageError(f"--images {args.images} is fewer than the pipeline's "
                         f"{options.groups} groups" + (" a chip" if options.chips > 1 else "")
                         + ": a steady step needs one image in each group")
    # a steady step needs an image in each group: --images N plans at most N groups a chip
    result = compile_strategy(workload, params, out, options, args.images)
    return _run_and_report(args, result.package, result.graph, result.tensors, workload,
                           params, result.timings["compile"])


def cmd_capacity(args: argparse.Namespace) -> int:
    workload, params = _params(args)
    options = capacity_options(_options(args))
    if args.max_chips is not None:
        if args.max_chips < 1:
            raise UsageError("--max-chips must be at least 1")
        result, key = probe_chips(workload, params, args.max_chips, options), "minimumChips"
    else:
        parameter, limit = next((name, value) for name, value in (
            ("batch", args.max_batch), ("blocks", args.max_blocks),
            ("layers", args.max_layers)) if value is not None)
        result = probe_capacity(workload, params, parameter, limit, options)
        key = {"batch": "maximumBatch", "blocks": "maximumBlocks",
               "layers": "maximumLayers"}[parameter]
    record = {key: result.maximum, "workload": workload.name, "reason": result.reason,
              "compiles": len(result.tried), "seconds": round(result.seconds, 1),
              "tried": {str(k): v for k, v in sorted(result.tried.items())}}
    if args.json:
        print(json.dumps(record))
    else:
        print(f"{key}={result.maximum} reason={log.format_value(result.reason)} "
              f"compiles={len(result.tried)} seconds={record['seconds']}")
    return 0 if result.maximum or args.max_chips is None else 1  # no card count fits: 1


def package_file(argument: str) -> Path:
    """The package a command names: the file, or ``model.ipuexe`` in the folder ``compile
    -o`` wrote."""
    path = Path(argument)
    if not path.is_dir():
        return path
    inside = path / "model.ipuexe"
    if not inside.exists():
        raise UsageError(f"{path} is a folder with no model.ipuexe in it (the package "
                         "`ipu-stack compile -o DIR` writes)")
    return inside


def cmd_run(args: argparse.Namespace) -> int:
    path = package_file(args.package)
    package = load_package(path)
    refuse_group_program(package, path)
    workload, params, graph, tensors = rebuild_workload(package)
    return _run_and_report(args, path, graph, tensors, workload, params, None)


def _lock(args: argparse.Namespace) -> Path | None:
    """The lock of the shared device the run names (``--device``), or none: a private one."""
    return Path(args.lock) if args.lock else device_lock(args.device)


def _load_profile_or_run(path: Path, lock: Path | None) -> Profile:
    """A saved profile (``profile.json`` or its folder), or a package run here to get one
    (a stream's: the step of the chip that sets its period)."""
    if path.is_dir():
        path = path / "profile.json"
    if path.suffix == ".json":
        return load_profile(path)
    package = load_package(path)
    refuse_group_program(package, path)
    workload, params, graph, tensors = rebuild_workload(package)
    outcome = run_any(path, graph, tensors, workload, params, None,
                      RunSettings(record=True, lock_path=lock))
    return profile_of_outcome(outcome)


def cmd_sweep(args: argparse.Namespace) -> int:
    if args.summary:
        records = read_results(Path(args.summary) / "results.jsonl")
        if not records:
            raise UsageError(f"{args.summary}: no sweep results there")
        print(format_table(records))
        return 0 if all(r["status"] == "ok" for r in records) else 1
    if not args.workload or not args.out:
        raise UsageError("sweep needs a WORKLOAD and -o DIR (or --summary DIR)")
    if args.workers < 1:
        raise UsageError("--workers must be at least 1")
    if is_program_path(args.workload):
        raise UsageError("sweep takes a builtin workload; run `bench MODEL.pt2` per point for "
                         "a torch program (its workers rebuild workloads by name)")
    workload, params = _params(args)
    options = CompileOptions(finalists=args.finalists, memory_proportion=args.memory_proportion,
                             cache_dir=args.cache_dir or CompileOptions().cache_dir)
    points = expand(workload.name, parse_grid(args.grid), params, options)
    result = run_sweep(points, Path(args.out), args.engine, args.workers, args.address,
                       title=f"sweep of {workload.name}")
    print(format_table(read_results(Path(args.out) / "results.jsonl")))
    print(f"points={result.points} ran={result.ran} skipped={result.skipped} "
          f"failed={result.failed} seconds={result.seconds:.1f}")
    return 0 if result.failed == 0 else 1


def cmd_profile(args: argparse.Namespace) -> int:
    if len(args.paths) > 2:
        raise UsageError("profile takes one profile (a summary) or two (a comparison)")
    profiles = [_load_profile_or_run(Path(p), _lock(args)) for p in args.paths]
    if len(profiles) == 1:
        print(format_summary(profiles[0]))
    else:
        print(format_compare(profiles[0], profiles[1]))
    return 0


def cmd_inspect(args: argparse.Namespace) -> int:
    summary = inspect_package(load_package(package_file(args.package)))
    if args.json:
        print(json.dumps(summary, indent=1))
    else:
        for key, value in summary.items():
            print(f"{key}: {value}")
    return 0


def cmd_ops(args: argparse.Namespace) -> int:
    """Every operation of a torch program, each marked supported or unsupported."""
    from ipu_stack.frontend.listing import format_operations, list_operations
    from ipu_stack.frontend.loader import load_program

    if not is_program_path(args.model):
        raise UsageError(f"{args.model}: ops takes a torch.export program (MODEL.pt2) or an "
                         "ONNX model (MODEL.onnx)")
    if is_onnx_path(args.model):
        from ipu_stack.frontend.onnx_workload import list_onnx_operations

        rows = list_onnx_operations(args.model)
    else:
        rows = list_operations(load_program(args.model))
    print(format_operations(rows, as_json=args.json))
    return 0


def cmd_workloads(args: argparse.Namespace) -> int:
    for name in sorted(REGISTRY):
        w = REGISTRY[name]
        print(f"{name}: {w.description}")
        for line in (footprint_line(w), timing_line(name)):
            if line:
                print(f"  {line}")
        for p in w.parameters:
            choices = f" (one of {', '.join(p.choices)})" if p.choices else ""
            print(f"  --{p.name:<10} default {p.default!s:<6} {p.help}{choices}")
    return 0


def cmd_exchange(args: argparse.Namespace) -> int:
    from ipu_stack.exchange import schedule_command, verify_command

    if args.exchange_command == "schedule":
        return schedule_command(args.instance, args.out, paired=args.paired)
    return verify_command(args.instance, args.schedule)


COMMANDS = {
    "compile": cmd_compile,
    "bench": cmd_bench,
    "run": cmd_run,
    "capacity": cmd_capacity,
    "inspect": cmd_inspect,
    "profile": cmd_profile,
    "sweep": cmd_sweep,
    "workloads": cmd_workloads,
    "ops": cmd_ops,
    "exchange": cmd_exchange,
}


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except UsageError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return exc.exit_code
    shown = logging.DEBUG if args.debug else (
        logging.INFO if args.verbose and not args.quiet else logging.WARNING)
    log.configure(min(shown, logging.INFO), shown)
    log.note_first_compile()
    try:
        _check_outputs(args)
        return COMMANDS[args.command](args)
    except IpuStackError as exc:
        if isinstance(exc, PlacementError) and exc.details:
            LOG.debug("placement failure details: %s", exc.details)
        if args.debug:
            raise
        print(f"error: {exc}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        print("error: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # `ipu-stack workloads | head`: the reader left, nothing to say
        sys.stderr.close()
        return 0


if __name__ == "__main__":
    sys.exit(main())
