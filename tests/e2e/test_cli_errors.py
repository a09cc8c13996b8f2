"""Bad input: one line naming the problem, a non-zero exit, no traceback, nothing half-written."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest

from ipu_stack.cli import main

SMALL = ["--tokens", "16", "--dim", "64", "--hidden", "64"]


def _error(capsys, argv: list[str]) -> tuple[int, str]:
    code = main(argv)
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.startswith("error:")]
    assert len(lines) == 1, err
    assert "Traceback" not in err
    return code, lines[0]


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["compile", "no-such-model", "-o", "X"], "unknown workload 'no-such-model'"),
        (["compile", "siglip-mlp", "--tokens", "0", "-o", "X"], "--tokens must be at least 1"),
        (["compile", "siglip-mlp", "--dim", "-3", "-o", "X"], "--dim must be at least 1"),
        (["compile", "siglip-mlp", "--finalists", "0", "-o", "X"], "--finalists must be"),
        (["compile", "siglip-mlp", "--target", "ipu9", "-o", "X"], "unknown --target 'ipu9'"),
        (["ops", "missing.onnx", "--tokens", "2000000"], "--tokens must be at most 1048576"),
    ],
)
def test_usage_errors(tmp_path, capsys, argv, message):
    argv = [a if a != "X" else str(tmp_path / "out") for a in argv]
    code, line = _error(capsys, argv)
    assert code == 2
    assert message in line
    assert not (tmp_path / "out").exists()


def test_workload_that_does_not_fit(tmp_path, capsys, cache_dir):
    code, line = _error(capsys, [
        "compile", "siglip-mlp", "--batch", "64", "-o", str(tmp_path / "out"),
        "--cache-dir", str(cache_dir),
    ])
    assert code == 2
    assert "stage 0 does not fit: its smallest tiling needs" in line
    assert not (tmp_path / "out" / "model.ipuexe").exists()


def test_missing_package(tmp_path, capsys):
    code, line = _error(capsys, ["run", str(tmp_path / "nothing.ipuexe")])
    assert code == 2 and "nothing.ipuexe" in line


def test_corrupted_package(tmp_path, capsys, cache_dir, lock_path):
    assert main(["compile", "siglip-mlp", *SMALL, "-o", str(tmp_path),
                 "--cache-dir", str(cache_dir)]) == 0
    capsys.readouterr()
    path = tmp_path / "model.ipuexe"
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))
    code, line = _error(capsys, ["run", str(path), "--lock", str(lock_path)])
    assert code == 2 and "corrupt" in line


def _compile_small(tmp_path, cache_dir, capsys) -> None:
    assert main(["compile", "siglip-mlp", *SMALL, "-o", str(tmp_path),
                 "--cache-dir", str(cache_dir)]) == 0
    capsys.readouterr()


def _hold_locks(*paths) -> subprocess.Popen:
    """Another process holding these device locks (it prints 'held' once it does)."""
    held = ", ".join(f"HardwareLock(Path({str(path)!r}))" for path in paths)
    return subprocess.Popen([
        sys.executable, "-c",
        "import sys, time; from pathlib import Path;"
        "from ipu_stack.device import HardwareLock\n"
        f"with {held}:\n"
        "    print('held', flush=True); time.sleep(60)",
    ], stdout=subprocess.PIPE, text=True)


def test_device_owned_by_another_process(tmp_path, capsys, cache_dir, lock_path):
    _compile_small(tmp_path, cache_dir, capsys)
    holder = _hold_locks(lock_path)
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        code, line = _error(capsys, ["run", str(tmp_path / "model.ipuexe"), "--no-wait",
                                     "--lock", str(lock_path)])
        assert code == 2
        assert f"pid {holder.pid}" in line
    finally:
        holder.kill()
        holder.wait()
    time.sleep(0.1)
    # the dead owner's lock is recovered
    assert main(["run", str(tmp_path / "model.ipuexe"), "--no-wait", "--lock",
                 str(lock_path)]) == 0


def test_private_devices_never_wait_and_named_devices_are_shared(tmp_path, capsys, cache_dir,
                                                                 monkeypatch):
    """Without --device a run has a device of its own: a process holding a named device
    (or the old machine-wide lock) does not hold it up.  Naming that device waits, and with
    --no-wait fails at once naming the owner."""
    from ipu_stack.device import lock as lock_module
    monkeypatch.setattr(lock_module, "LOCK_FOLDER", tmp_path)
    named = lock_module.device_lock("lab-card")
    assert named == tmp_path / "ipu-stack-device-lab-card.lock"
    _compile_small(tmp_path, cache_dir, capsys)
    holder = _hold_locks(named, lock_module.DEFAULT_LOCK)  # and the old machine-wide lock
    package = str(tmp_path / "model.ipuexe")
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        started = time.monotonic()
        assert main(["-v", "run", package, "--no-wait"]) == 0
        assert time.monotonic() - started < 60
        assert "path=sim://private-" in capsys.readouterr().err
        code, line = _error(capsys, ["run", package, "--device", "lab-card", "--no-wait"])
        assert code == 2 and f"pid {holder.pid}" in line and "lab-card" in line
    finally:
        holder.kill()
        holder.wait()
    code, line = _error(capsys, ["run", package, "--device", "../etc/passwd"])
    assert code == 2 and "a device name is 1-64 letters" in line


def test_interrupted_compile_leaves_no_package(tmp_path, cache_dir, monkeypatch):
    """Ctrl-C half way through writing the package: no file under the final name, no temp."""
    from ipu_stack.package import writer
    from ipu_stack.util.files import write_atomic

    def half_then_interrupt(path, write):
        def partial(handle):
            handle.write(b"PK\x03\x04 half a package")
            raise KeyboardInterrupt

        write_atomic(path, partial)

    monkeypatch.setattr(writer, "write_atomic", half_then_interrupt)
    code = main(["compile", "siglip-mlp", *SMALL, "-o", str(tmp_path), "--cache-dir",
                 str(cache_dir)])
    assert code == 130
    names = [p.name for p in tmp_path.rglob("*")]
    assert "model.ipuexe" not in names
    assert not [n for n in names if n.endswith(".tmp")]


def test_profile_folder_that_is_a_file_is_refused_before_work(tmp_path, capsys):
    taken = tmp_path / "taken"
    taken.write_text("not a folder")
    code = main(["--quiet", "bench", "siglip-mlp", "--tokens", "16", "--dim", "64", "--hidden",
                 "64", "--out", str(tmp_path / "pkg"), "--profile", str(taken)])
    assert code == 2
    assert capsys.readouterr().err.strip() == f"error: --profile {taken}: exists and is not a folder"
    assert not (tmp_path / "pkg").exists()  # refused before compiling


def test_sigterm_unwinds_and_leaves_no_temporary_folder(tmp_path):
    """``timeout`` or ``kill`` during a capacity search: the command says so in one line,
    exits 143, and its folder of trial packages goes with it (Python's default for SIGTERM
    ends the process without leaving a ``with`` block)."""
    import os
    import signal

    env = {**os.environ, "TMPDIR": str(tmp_path)}
    command = subprocess.Popen(
        [sys.executable, "-m", "ipu_stack.cli", "capacity", "smollm2-135m", "--layers", "2",
         "--max-context", "1000000", "--cache-dir", str(tmp_path / "cache")],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 120
        while not list(tmp_path.glob("ipu-stack-capacity-*")):
            assert command.poll() is None and time.monotonic() < deadline, \
                "the search ended or never made its folder"
            time.sleep(0.05)
        command.send_signal(signal.SIGTERM)
        _, err = command.communicate(timeout=120)
    finally:
        command.kill()
    assert command.returncode == 143, err
    assert err.strip().splitlines()[-1] == "error: terminated"
    assert not list(tmp_path.glob("ipu-stack-capacity-*"))
