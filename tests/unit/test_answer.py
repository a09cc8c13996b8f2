"""The few lines a person reads at a terminal (``runtime.answer``): made from the record
alone, at most a dozen, each figure the record's own."""

from __future__ import annotations

import sys

from ipu_stack.generation import generation_answer
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
    # a token model's batch is of sequences
    assert answer_lines({**LAYERS, "vocabulary": 49152}, "bench")[2] == \
        "  17,382 sequences/s (7,339 with host transfers)"
    assert lines[3] == "  88.92 % of the FP16 peak, 44.46 % of the AMP roofline of its precisions"
    # the kinds of work, largest first, as shares of the cycles; totals are not kinds
    assert lines[4] == "  time goes to: GEMM 62 %, exchange 21 %, reduce 8 %, GELU 5 %"
    assert lines[5] == ("  numbers: every stage equals the device-precision reference; error "
                        "against the float64 model 1x what the precisions explain")
    assert lines[6] == "  package: artifacts/x/model.ipuexe"
    # an imported model's fidelity is to its framework's outputs, and says so
    lines = answer_lines({**LAYERS, "referenceSource": "torch", "noiseRatio": 0.98}, "bench")
    assert lines[5].endswith("error against torch's own outputs 0.98x what the precisions "
                             "explain")


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


def test_a_generation_reads_as_tokens_and_their_times() -> None:
    record = {"numericalTest": "PASS", "workload": "smollm2-135m-fp8", "batch": 1, "chips": 1,
              "promptTokens": 128, "prefill": "one pass", "ttftMicroseconds": 1580.1,
              "tpotMicroseconds": 895.4, "tokensPerSecond": 1116.8, "decodeCycles": 1338363,
              "tokensDiffering": 1, "tokensTied": 1, "kvCacheBytes": 3686400,
              "peakTileBytes": 482884, "stageMismatch": 5e-06, "noiseRatio": 0.98}
    lines = generation_answer(record)
    assert lines[0] == "PASS  smollm2-135m-fp8 (batch 1)"
    assert "first token after 1,580 us" in lines[1]
    assert "895 us a token = 1,117 tokens/s (1,338,363 cycles a decode step)" in lines[2]
    assert "1 differ (1 ties)" in lines[3] and "KV cache 3.7 MB" in lines[4]
    assert not any("images/s" in line for line in lines)


def test_a_model_files_generation_says_how_pytorchs_tokens_compare() -> None:
    record = {"numericalTest": "PASS", "workload": "step", "batch": 1, "promptTokens": 8,
              "prefill": "a token a step", "ttftMicroseconds": 10.0, "tokensDiffering": 0,
              "torchTokenMatch": False, "torchFirstDifferingStep": 3,
              "torchMarginThere": 0.0108}
    lines = generation_answer(record)
    assert "  PyTorch's own tokens: differ from step 3 (its logits' margin there 0.0108)" \
        in lines
    lines = generation_answer({**record, "torchTokenMatch": True})
    assert "  PyTorch's own tokens: all equal" in lines
    assert not any("PyTorch" in line for line in generation_answer(
        {k: v for k, v in record.items() if not k.startswith("torch")}))
