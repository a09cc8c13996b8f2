"""The ``ipu-stack`` command line: compile, run, bench, inspect, workloads, exchange.

Errors the user can fix print one line (``error: ...``) and exit non-zero: 2 for usage and
compile errors, 1 for a numerical FAIL.  ``--debug`` shows tracebacks and debug logs.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import logging
import sys
from pathlib import Path
from typing import Any

import numpy as np

from ipu_stack.capacity import RECORD_KEYS, capacity_record
from ipu_stack.cli_parser import build_parser, workload_parameters
from ipu_stack.device import device_lock
from ipu_stack.frontend import is_onnx_path, is_program_path
from ipu_stack.generation import GenerateRequest, decode_plan, generate, generation_answer
from ipu_stack.pipeline import CompileOptions
from ipu_stack.planning.groups import refuse_one_group
from ipu_stack.profile import Profile, format_compare, format_summary, load_profile
from ipu_stack.profile.capture import profile_of_outcome, write_run_profile
from ipu_stack.runtime.answer import answer_lines
from ipu_stack.runtime.execute import (
    RunSettings,
    check_images,
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
from ipu_stack.util.errors import IpuStackError, PlacementError, UsageError
from ipu_stack.util.files import check_output_file, check_output_folder
from ipu_stack.util.termination import Terminated, terminate_unwinds
from ipu_stack.verdict.judge import DIAGNOSTICS_LOG
from ipu_stack.workloads import REGISTRY, get_workload
from ipu_stack.workloads.base import LARGEST_SIZE
from ipu_stack.workloads.footprint import footprint_line
from ipu_stack.workloads.timings import timing_line

LOG = logging.getLogger("ipu_stack.cli")



def _params(args: argparse.Namespace) -> tuple[Any, dict[str, Any]]:
    """The workload the command names (a builtin, or an imported model file) and its
    parameters from the options; a parameter it does not take is refused in one line."""
    program = is_program_path(args.workload)
    inputs = getattr(args, "inputs", None)
    if inputs is not None and not program:
        raise UsageError("--inputs is for torch programs (MODEL.pt2), not builtin workloads")
    if program:
        from ipu_stack.frontend import imported_workload

        workload, base = imported_workload(args.workload)
    else:
        workload, base = get_workload(args.workload), {}
    known = {p.name for p in workload.parameters}
    overrides = {k: getattr(args, k, None) for k in workload_parameters()}
    for key, value in overrides.items():
        if value is not None and key not in known:
            raise UsageError(f"a model file takes no --{key.replace('_', '-')} (its sizes and "
                             "operations are the export's)" if program else f"workload "
                             f"{workload.name} has "
                             f"no parameter --{key.replace('_', '-')}")
    overrides = {k: v for k, v in overrides.items() if k in known}
    for key in ("batch", "tokens"):  # a model file's 0 means "as exported": never given
        if program and overrides.get(key) is not None and overrides[key] < 1:
            raise UsageError(f"--{key} must be at least 1, got {overrides[key]}")
    if inputs:
        overrides["inputs"] = str(Path(inputs).resolve())
    return workload, workload.resolve({**base, **overrides})


def parse_workload(name: str, argv: list[str]) -> tuple[Any, dict[str, Any]]:
    """A workload and its resolved parameters from command-line options (``--tokens 64``),
    as ``compile`` would take them; for scripts (benchmarks) that drive the stages."""
    return _params(build_parser().parse_args(["compile", name, "-o", "-", *argv]))


def _check_search(args: argparse.Namespace) -> None:
    """The planner's search options, as compile and sweep take them."""
    if args.finalists < 1:
        raise UsageError("--finalists must be at least 1")
    if not 0 < args.memory_proportion <= 1:
        raise UsageError("--memory-proportion must be in (0, 1]")


def _options(args: argparse.Namespace) -> CompileOptions:
    _check_search(args)
    defaults = CompileOptions()
    return CompileOptions(
        target=args.target, finalists=args.finalists, diagnostics=args.diagnostics,
        memory_proportion=args.memory_proportion,
        cache_dir=args.cache_dir if args.cache_dir else defaults.cache_dir,
        paired_exchange=args.paired_exchange, exchange_cache=args.exchange_cache,
        fuse_supersteps=args.fuse_supersteps,
        gemm_mode=args.gemm_mode, share_layers=not args.unroll_layers,
        dump_stages=args.dump_stages, strategy=_strategy(args), groups=args.groups or 0,
        chips=args.chips, verify_stages=args.verify_stages,
    )


def _strategy(args: argparse.Namespace) -> str:
    """The strategy asked for, or the default: layers on one chip, pipeline over several
    (one program cannot span chips)."""
    get_system(args.target, args.chips)  # --chips in range, or one line why not
    return args.strategy or ("pipeline" if args.chips > 1 else "layers")


def _refuse_conflicts(args: argparse.Namespace) -> None:
    """One line for options that contradict each other, where one would otherwise be
    dropped without a word."""
    if getattr(args, "verbose", False) and getattr(args, "quiet", False):
        raise UsageError("give -v or --quiet, not both")
    if getattr(args, "json", False) and getattr(args, "record", False):
        raise UsageError("give --json or --record, not both")
    if getattr(args, "attention", None) == "fp8" and getattr(args, "precision", None) == "f16":
        raise UsageError("--attention fp8 runs attention's products in FP8 beside FP8 GEMMs: "
                         "it takes --precision fp8")
    if args.command == "generate" and args.inputs and not args.image_program:
        raise UsageError("generate's --inputs are an image program's pixels (with "
                         "--image-program); a decoder's ids are the prompt's (--prompt-tokens, "
                         "random from --seed)")
    if args.command == "generate" and args.diagnostics:
        raise UsageError("--diagnostics logs one program's stages: bench the decode step "
                         "with it (bench WORKLOAD --context N --tokens 1 --diagnostics)")
    groups = getattr(args, "groups", None)
    if groups is not None:
        if groups < 1:
            raise UsageError(f"--groups must be at least 1, got {groups} (leave it out for "
                             "the planner to choose)")
        if _strategy(args) != "pipeline":
            raise UsageError(f"--groups {groups} is the pipeline strategy's: give --strategy "
                             "pipeline (or --chips above 1)")
        refuse_one_group(groups, args.chips)


def _print_record(record: dict[str, Any], as_json: bool, command: str = "bench",
                  as_line: bool = False) -> None:
    """The record as JSON (``--json``), a few lines for a person at a terminal, or one
    ``key=value`` line for a script reading a pipe (or asking with ``--record``)."""
    if as_json:
        print(json.dumps(record))
    elif sys.stdout.isatty() and not as_line:
        print("\n".join(generation_answer(record) if command == "generate"
                        else answer_lines(record, command)))
    else:
        print(log.format_fields(record))


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


def _out_folder(args: argparse.Namespace, name: str) -> Path:
    """``--out``, or ``artifacts/NAME`` checked as a folder the command may write; NAME
    with the chip count and a strategy other than the default, so packages of the same
    workload built another way do not overwrite each other."""
    if args.out:
        return Path(args.out)
    chips = getattr(args, "chips", 1) or 1
    strategy = getattr(args, "strategy", None)
    name += f"-c{chips}" if chips > 1 else ""
    name += f"-{strategy}" if strategy and strategy != ("pipeline" if chips > 1 else
                                                          "layers") else ""
    return check_output_folder("--out (default)", Path("artifacts") / name)


def _settings(args: argparse.Namespace) -> RunSettings:
    """The run options of ``bench`` and ``run``, the same for every strategy and chip count."""
    images = getattr(args, "images", None)
    if images is not None and images < 1:
        raise UsageError("--images must be at least 1")
    if args.engine == "ray" and importlib.util.find_spec("ray") is None:  # before any compile
        raise UsageError("--engine ray needs Ray: pip install 'ipu-stack[ray]'")
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
    out = _out_folder(args, workload.identifier(params))
    _settings(args)  # every run option checked before the compile
    options = _options(args)
    if options.groups:
        check_images(options.groups, options.chips, args.images)
    # a steady step needs an image in each group: --images N plans at most N groups a chip
    result = compile_strategy(workload, params, out, options, args.images)
    return _run_and_report(args, result.package, result.graph, result.tensors, workload,
                           params, result.timings["compile"])


def cmd_generate(args: argparse.Namespace) -> int:
    """Greedy generation: the prompt's pass, then decode steps (``generation``)."""
    request = GenerateRequest(args.workload, args.prompt_tokens, args.new_tokens, args.chips,
                              args.context, args.batch, args.tokens, args.micro_batches,
                              args.groups, args.prompt_by_steps, args.image_program,
                              args.choose)
    plan = decode_plan(request, lambda changed: _params(
        argparse.Namespace(**{**vars(args), **changed})))
    args.groups = plan.groups
    settings, options = _settings(args), _options(args)
    out = _out_folder(args, plan.workload.identifier(plan.params))
    # tokens stream to a person at a terminal; --json and --record print the record alone
    streamed = _stream_tokens() if sys.stdout.isatty() and not (args.json or args.record) \
        else None
    record = generate(plan, request, options, settings, out, streamed)
    if streamed is not None:
        print()  # the streamed tokens' line
    _print_record(record, args.json, "generate", args.record)
    return 0 if record["numericalTest"] == "PASS" else 1


def _stream_tokens() -> Any:
    """At a terminal: each new token of the first sequence as the device chooses it (the
    line starts with the first, after the prefill's progress line)."""
    shown: list[int] = []

    def show(tokens: np.ndarray) -> None:
        print(f"{'' if shown else 'tokens:'} {int(tokens[0])}", end="", flush=True)
        shown.append(int(tokens[0]))
    return show


def cmd_fp8_recipe(args: argparse.Namespace) -> int:
    """The fewest layers to keep F16 in an FP8 model, measured beside all-F16 and all-FP8."""
    from ipu_stack.recipe.measure import format_recipe, run_recipe

    given = [option for option, value in (
        ("--keep-f16", getattr(args, "keep_f16", None)),
        ("--precision", getattr(args, "precision", None) not in (None, "fp8")),
        ("--chips", args.chips if args.chips != 1 else None)) if value]
    if given:  # the recipe measures its own three runs, on one chip, at its own precisions
        raise UsageError(f"fp8-recipe takes no {given[0]}: it chooses the kept layers and "
                         "measures all-F16, all-FP8 and the recipe on one chip itself")
    workload, params = _params(args)
    out = _out_folder(args, f"{workload.identifier(params)}-recipe")
    record = run_recipe(workload, params, args.max_error, out, _options(args), _settings(args))
    print(json.dumps(record) if args.json else format_recipe(record))
    runs = (record["allF16"], record["allFp8"], record["recipe"])  # all-F16 may not fit
    return 0 if record["found"] and all(r["numericalTest"] in ("PASS", "NOT RUN")
                                        for r in runs) and record["recipe"]["numericalTest"] \
        == "PASS" and record["deviceWithinBound"] is not False else 1


def cmd_capacity(args: argparse.Namespace) -> int:
    if args.max_chips is not None and args.chips != 1:
        raise UsageError("give --max-chips or --chips, not both (--max-chips searches the "
                         "chip count)")
    if args.max_context is not None:  # the decode step's cache: one token a sequence
        if is_program_path(args.workload):
            raise UsageError(f"--max-context searches a builtin decoder's KV cache; "
                             f"{args.workload}'s cache is the length it was exported with "
                             "(export it again with another max_cache_len)")
        if "context" not in {p.name for p in get_workload(args.workload).parameters}:
            raise UsageError(f"--max-context searches a builtin decoder's KV cache; "
                             f"{args.workload} has none to search")
        if args.tokens not in (None, 1):
            raise UsageError("--max-context searches a decode step: one token a sequence, "
                             "not --tokens")
        if args.context is not None:
            raise UsageError("--max-context searches the cache's positions: give no "
                             "--context")
        args.tokens, args.context = 1, 1
    workload, params = _params(args)
    parameter, limit = next((name, value) for name, value in (
        ("batch", args.max_batch), ("blocks", args.max_blocks), ("layers", args.max_layers),
        ("context", args.max_context), ("chips", args.max_chips)) if value is not None)
    record = capacity_record(workload, params, _options(args), parameter, limit)
    key = RECORD_KEYS[parameter]
    if args.json:
        print(json.dumps(record))
    elif not record[key]:  # not even the least size compiles: a compile error, said as one
        print(f"error: {one_line(record['reason'])}", file=sys.stderr)
    else:
        print(log.format_fields({key: record[key], "reason": record["reason"],
                                 "fullestTile": record["fullestTile"] or None,
                                 "compiles": record["compiles"], "seconds": record["seconds"]}))
    return 0 if record[key] else 2  # not even the least size compiles: a compile error


def package_file(argument: str) -> Path:
    """The package a command names: the file, or ``model.ipuexe`` in the folder ``compile
    -o`` wrote."""
    path = Path(argument)
    if is_program_path(argument):
        raise UsageError(f"{path} is a model file, not a package: `ipu-stack bench {path}` "
                         "compiles and runs it (`ipu-stack compile` writes a package)")
    if not path.is_dir():
        return path
    inside = path / "model.ipuexe"
    if not inside.exists():
        raise UsageError(f"{path} is a folder with no model.ipuexe in it (the package "
                         "`ipu-stack compile -o DIR` writes)")
    return inside


def _rebuilt(path: Path) -> tuple[Any, dict[str, Any], Any, Any]:
    """The workload, parameters, graph and tensors of the package at ``path`` (a whole
    program or a system; one group's program alone is refused)."""
    package = load_package(path)
    refuse_group_program(package, path)
    return rebuild_workload(package)


def cmd_run(args: argparse.Namespace) -> int:
    path = package_file(args.package)
    workload, params, graph, tensors = _rebuilt(path)
    return _run_and_report(args, path, graph, tensors, workload, params, None)


def _lock(args: argparse.Namespace) -> Path | None:
    """The lock of the shared device the run names (``--device``), or none: a private one."""
    return Path(args.lock) if args.lock else device_lock(args.device)


def _load_profile_or_run(path: Path, lock: Path | None) -> Profile:
    """A saved profile (``profile.json`` or its folder), or a package run here to get one
    (a stream's: the step of the chip that sets its period)."""
    if not path.exists():
        raise UsageError(f"{path} not found (profile takes a profile's folder, its "
                         "profile.json, or a package to run)")
    if path.is_dir():  # a profile's folder, or the folder `compile -o` wrote
        held = [f for f in (path / "profile.json", path / "model.ipuexe") if f.exists()]
        if not held:
            raise UsageError(f"{path} is a folder with neither a profile.json (`bench "
                             "--profile DIR` writes one) nor a package (model.ipuexe)")
        path = held[0]
    if path.suffix == ".json":
        return load_profile(path)
    workload, params, graph, tensors = _rebuilt(path)
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
    if args.address and args.engine != "ray":
        raise UsageError("--address names a Ray cluster: give it with --engine ray")
    if is_program_path(args.workload):
        raise UsageError("sweep takes a builtin workload; run `bench MODEL.pt2` per point for "
                         "a torch program (its workers rebuild workloads by name)")
    workload, params = _params(args)
    _check_search(args)
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

        if args.tokens < 0:
            raise UsageError(f"--tokens must be at least 1, got {args.tokens}")
        if args.tokens > LARGEST_SIZE:  # as bench and compile bound it
            raise UsageError(f"--tokens must be at most {LARGEST_SIZE} (no size on a tile of "
                             f"624 KiB can be larger), got {args.tokens}")
        rows = list_onnx_operations(args.model, args.tokens)
    elif args.tokens:
        raise UsageError("--tokens sizes an ONNX model's symbolic sequence length; a .pt2 "
                         "program is listed at its export's shapes")
    else:
        rows = list_operations(load_program(args.model), Path(args.model).name)
    print(format_operations(rows, as_json=args.json))
    # a script checking a model before it compiles reads the answer from the exit status
    return 1 if any(not row["supported"] for row in rows) else 0


def cmd_workloads(args: argparse.Namespace) -> int:
    for name in sorted(REGISTRY):
        w = REGISTRY[name]
        print(f"{name}: {w.description}")
        for line in (footprint_line(w), timing_line(name)):
            if line:
                print(f"  {line}")
        for p in w.parameters:
            choices = f" (one of {', '.join(p.choices)})" if p.choices else ""
            print(f"  {p.flag:<12} default {p.default!s:<6} {p.help}{choices}")
    return 0


def cmd_exchange(args: argparse.Namespace) -> int:
    from ipu_stack.exchange import schedule_command, verify_command

    if args.exchange_command == "schedule":
        return schedule_command(args.instance, args.out, paired=args.paired)
    return verify_command(args.instance, args.schedule)


COMMANDS = {
    "compile": cmd_compile,
    "bench": cmd_bench,
    "generate": cmd_generate,
    "run": cmd_run,
    "capacity": cmd_capacity,
    "fp8-recipe": cmd_fp8_recipe,
    "inspect": cmd_inspect,
    "profile": cmd_profile,
    "sweep": cmd_sweep,
    "workloads": cmd_workloads,
    "ops": cmd_ops,
    "exchange": cmd_exchange,
}


def one_line(message: str) -> str:
    """The message with its control characters escaped: a name read from a hostile file
    (a newline in an ONNX node's name) must not break the one error line."""
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in message)


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except UsageError as exc:
        print(f"error: {one_line(str(exc))}", file=sys.stderr)
        return exc.exit_code
    shown = logging.DEBUG if args.debug else (
        logging.INFO if args.verbose and not args.quiet else logging.WARNING)
    log.configure(min(shown, logging.INFO), shown,
                  (DIAGNOSTICS_LOG,) if getattr(args, "diagnostics", False) else ())
    # out-of-range values overflow to infinity (and then NaN) as the device's F16 does; the
    # verdict judges them, numpy's warnings would only be stray lines on stderr
    np.seterr(over="ignore", invalid="ignore")
    log.note_first_compile()
    try:
        with terminate_unwinds():
            _refuse_conflicts(args)
            _check_outputs(args)
            return COMMANDS[args.command](args)
    except IpuStackError as exc:
        if isinstance(exc, PlacementError) and exc.details:
            LOG.debug("placement failure details: %s", exc.details)
        if args.debug:
            raise
        print(f"error: {one_line(str(exc))}", file=sys.stderr)
        return exc.exit_code
    except Terminated:
        print("error: terminated", file=sys.stderr)
        return 143
    except KeyboardInterrupt:
        print("error: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # `ipu-stack workloads | head`: the reader left, nothing to say
        sys.stderr.close()
        return 0


if __name__ == "__main__":
    sys.exit(main())
