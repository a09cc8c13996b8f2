"""The few lines a person reads at a terminal (``runtime.answer``): made from the record
alone, at most a dozen, each figure the record's own."""

from __future__ import annotations

import sys

from ipu_stack.runtime.answer import answer_lines

LAYERS = {"numericalTest": "PASS", "workload": "siglip-mlp-fp8-b1", "strategy": "layers",
          "batch": 1, "cycles": 86295, "deviceMicroseconds": 57.53, "estimatedCycles": 86295,
          "imagesPerSecond": 17382.2, "qpsWithHost": 7338.8, "efficiencyPercent": 88.92,
          "rooflinePercent": 44.46, "gemmCycles": 53820, "exchangeCycles": 18048,
          "reduceCycles": 7200, "gelu_tanhCycles": 4635, "syncCycles": 900,
          "hostCycles": 118098, "computeCycles": 67347,
          "stageMismatch": 0.0, "noiseRatio": 1.0, "package": "artifacts/x/model.ipuexe"}


def test_a_layers_run_reads_in_a_few_lines() -> None:
    lines = answer_lines(LAYERS, "bench")
    assert len(lines) <= 12
    assert lines[0] == "PASS  siglip-mlp-fp8-b1 (batch 1)"
    assert lines[1] == "  86,295 cycles = 57.5 us for the run (the compiler estimated 86,295)"
    assert lines[2] == "  17,382 images/s (7,339 with host transfers)"
    assert lines[3] == "  88.92 % of the FP16 peak, 44.46 % of the AMP roofline of its precisions"
    # the kinds of work, largest first, as shares of the cycles; totals are not kinds
    assert lines[4] == "  time goes to: GEMM 62 %, exchange 21 %, reduce 8 %, GELU 5 %"
    assert "every stage equals the device-precision reference" in lines[5]
    assert lines[6] == "  package: artifacts/x/model.ipuexe"


def test_a_failing_stream_says_what_failed_and_its_images() -> None:
    record = {"numericalTest": "FAIL", "workload": "siglip-vision", "strategy": "pipeline",
              "batch": 1, "chips": 2, "images": 5, "imagesPassed": 4, "pipelineGroups": 10,
              "cycles": 4324895, "estimatedCycles": 4324895, "imagesPerSecond": 346.8,
              "latencyMicroseconds": 28380.0, "failedParts": "stages",
              "firstFailingStage": "layer3.fc1", "package": "p/model.ipuexe"}
    lines = answer_lines(record, "bench")
    assert lines[0] == "FAIL  siglip-vision (batch 1, chips 2, images 5)"
    assert lines[1].startswith("  4,324,895 cycles = 2,884 us for a pipeline step")
    assert lines[3] == "  10 groups; latency 28,380 us an image; 4/5 images pass"
    assert any("first failing stage layer3.fc1" in line for line in lines)
    assert not any(line.startswith("  time goes to") for line in lines)  # no breakdown


def test_the_info_log_needs_verbose(tmp_path, capsys) -> None:
    """Without ``-v`` a passing run prints no INFO line (warnings and errors only) and, to a
    pipe, its record as one ``key=value`` line; ``-v`` after the subcommand adds the log."""
    from ipu_stack.cli import main

    argv = ["bench", "siglip-mlp", "--tokens", "16", "--dim", "32", "--hidden", "48",
            "--out", str(tmp_path / "pkg"), "--lock", str(tmp_path / "lock"),
            "--cache-dir", str(tmp_path / "cache")]
    assert main(argv) == 0
    quiet = capsys.readouterr()
    assert " INFO " not in quiet.err
    assert quiet.out.startswith("numericalTest=PASS ") and quiet.out.count("\n") == 1
    assert main([*argv, "-v"]) == 0
    assert " INFO ipu_stack.package.build: package build phase finished" in \
        capsys.readouterr().err


def test_at_a_terminal_compile_and_bench_end_with_the_answer(tmp_path, capsys, monkeypatch
                                                             ) -> None:
    from ipu_stack.cli import main

    small = ["siglip-mlp", "--tokens", "16", "--dim", "32", "--hidden", "48",
             "--cache-dir", str(tmp_path / "cache")]
    monkeypatch.setattr(sys.stdout, "isatty", lambda: True)
    assert main(["compile", *small, "-o", str(tmp_path / "pkg")]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("compiled siglip-mlp-fp8-b1-t16-d32-h48-n1 (layers) in ")
    assert lines[1].startswith("  the compiler estimates ") and lines[1].endswith(" for a run")
    assert lines[-1] == f"  next: `ipu-stack run {tmp_path / 'pkg'}` runs and checks it"
    assert main(["bench", *small, "--out", str(tmp_path / "b"), "--lock",
                 str(tmp_path / "lock")]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0] == "PASS  siglip-mlp-fp8-b1-t16-d32-h48-n1 (batch 1)" and len(out) <= 12
    # --record: the key=value line a script reads, also at a terminal
    assert main(["run", str(tmp_path / "b"), "--record", "--lock", str(tmp_path / "lock")]) == 0
    line = capsys.readouterr().out
    assert line.startswith("numericalTest=PASS ") and line.count("\n") == 1
