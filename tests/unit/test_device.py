"""The simulated ipu21: package checks before running, host streams, kernels and exchange."""

from __future__ import annotations

import copy

import numpy as np
import pytest

from ipu_stack.device import SimulatedIpu
from ipu_stack.ir.layout import BlockLayout
from ipu_stack.ir.precision import F16, F32, Precision, f143, f152
from ipu_stack.kernels.gemm import gemm_params
from ipu_stack.kernels.rowwise import row_params
from ipu_stack.package import Package
from ipu_stack.target import IPU21
from ipu_stack.util.errors import DeviceFault, PackageError

BASE, END = 0x4C000, 949168
ROWS, DEPTH, COLS = 12, 32, 16
PA, PB = f143(-2), f152(-12)  # products stay inside the FP16 partial range
A_ADDR, B_ADDR, MOVED_ADDR = BASE + 0x1000, BASE + 0x2000, BASE + 0x8000
OUT_ADDR = 0x80000 + 0x4000  # AMP partials: interleaved memory only
OUT_WORDS = ROWS * COLS * 2 // 4  # FP16 partials of the native FP8 AMP


@pytest.fixture(scope="module")
def ipu() -> SimulatedIpu:
    return SimulatedIpu(IPU21)  # 1472 x 637872 bytes, zero pages mapped lazily


def host_step(kind: str, tensor: str, layout: BlockLayout, addresses, arrays: dict) -> dict:
    arrays[f"{tensor}/{kind}/tiles"] = layout.tiles.astype(np.int32)
    arrays[f"{tensor}/{kind}/addresses"] = np.asarray(addresses, dtype=np.int64).reshape(
        layout.tiles.shape
    )
    return {
        "kind": kind,
        "tensor": tensor,
        "layout": layout.to_json(),
        "tiles": f"{tensor}/{kind}/tiles",
        "addresses": f"{tensor}/{kind}/addresses",
    }


def tensor_entry(role: str, shape: list[int], precision: Precision) -> dict:
    return {"role": role, "shape": shape, "precision": precision.to_json()}


def gemm_package(b_addr: int = B_ADDR) -> tuple[dict, dict]:
    """Write A and B to tiles 10 and 11, GEMM on both, move tile 11's result to 20, read it."""
    arrays: dict[str, np.ndarray] = {}
    a_layout = BlockLayout(ROWS, DEPTH, PA, ROWS, DEPTH, np.array([[[10, 11]]], dtype=np.int32))
    b_layout = BlockLayout(DEPTH, COLS, PB, DEPTH, COLS, np.array([[[10, 11]]], dtype=np.int32))
    out_layout = BlockLayout(ROWS, COLS, F16, ROWS, COLS, np.array([[[20]]], dtype=np.int32))
    params = gemm_params(PA, PB, ROWS, DEPTH, COLS, a_layout.pitch, b_layout.pitch, COLS * 2,
                         "fp8")
    arrays["gemm/tiles"] = np.array([10, 11], dtype=np.int32)
    arrays["gemm/addresses"] = np.array([[A_ADDR, b_addr, OUT_ADDR, 0]] * 2, dtype=np.int64)
    exchange = {"kind": "exchange", "name": "move", "phase": 0, "kind_selected": "test",
                "lower_bound": OUT_WORDS}
    for key, value, dtype in (
        ("src_tile", [11], np.int32), ("src_addr", [OUT_ADDR], np.int64),
        ("words", [OUT_WORDS], np.int64), ("dst_offsets", [0, 1], np.int64),
        ("dst_tile", [20], np.int32), ("dst_addr", [MOVED_ADDR], np.int64),
        ("chunk_transfer", [0], np.int64), ("chunk_start", [0], np.int64),
        ("chunk_words", [OUT_WORDS], np.int64),
    ):
        arrays[f"move/{key}"] = np.array(value, dtype=dtype)
        exchange[key] = f"move/{key}"
    run = [
        host_step("host_write", "a", a_layout, [A_ADDR, A_ADDR], arrays),
        host_step("host_write", "b", b_layout, [b_addr, b_addr], arrays),
        {"kind": "compute", "name": "gemm",
         "calls": [{"kernel": 0, "tiles": "gemm/tiles", "addresses": "gemm/addresses"}]},
        exchange,
        host_step("host_read", "out", out_layout, [MOVED_ADDR], arrays),
    ]
    manifest = {
        "kernels": [{"family": "gemm", "params": params}],
        "programs": {"initialize": [], "run": run},
        "tensors": {
            "a": tensor_entry("input", [ROWS, DEPTH], PA),
            "b": tensor_entry("input", [DEPTH, COLS], PB),
            "out": tensor_entry("output", [ROWS, COLS], F16),
        },
    }
    return manifest, arrays


def package(manifest: dict, arrays: dict) -> Package:
    return Package(manifest=manifest, arrays=arrays, sha256="x", target="ipu21",
                   compiler_version="0")


def representable(fp8, p: Precision, shape, rng) -> np.ndarray:
    table = fp8.decode(p.kind) * 2.0**p.scale_exponent
    codes = np.flatnonzero(np.isfinite(table))
    return table[rng.choice(codes, size=shape)]


@pytest.mark.parametrize(("b_addr", "weight_load"), [(B_ADDR, 266), (0x80000 + 0x2000, 160)],
                         ids=["standard-weights", "interleaved-weights"])
def test_gemm_program_runs_with_exchange_and_counts_cycles(
    ipu: SimulatedIpu, fp8, b_addr: int, weight_load: int
) -> None:
    rng = np.random.default_rng(21)
    a = representable(fp8, PA, (ROWS, DEPTH), rng)
    b = representable(fp8, PB, (DEPTH, COLS), rng)
    manifest, arrays = gemm_package(b_addr)
    ipu.load(package(manifest, arrays))
    report = ipu.call("run", {"a": a.astype(np.float32), "b": b.astype(np.float32)})
    got = report.outputs["out"].astype(np.float64)
    want = (a @ b).astype(np.float16).astype(np.float64)  # one 32-deep pass, FP16 partial
    np.testing.assert_allclose(got, want, rtol=2.0**-10, atol=2.0**-24)
    # A landed on both replicas, row by row at A_ADDR with a 32-byte pitch
    for tile in (10, 11):
        raw = ipu.memory[tile, A_ADDR - BASE : A_ADDR - BASE + ROWS * DEPTH].reshape(ROWS, DEPTH)
        np.testing.assert_array_equal(fp8.decode(PA.kind)[raw] * 2.0**PA.scale_exponent, a)
    # cycles, recounted by hand: one pass over 12 rows, weights where the package put them
    # (the reference's 294 + passes x (4 x rows + 160 interleaved / 266 standard)); the
    # exchange is 96 words from event 0 + the measured 237 per phase, after a 90-cycle sync
    # (the compute set has none of its own)
    gemm = 294 + 4 * ROWS + weight_load
    assert report.compute_cycles == gemm
    assert report.exchange_cycles == OUT_WORDS + 237
    assert report.sync_cycles == 90
    assert report.cycles == gemm + OUT_WORDS + 237 + 90
    assert (report.supersteps, report.phases) == (2, 1)
    written = 2 * ROWS * DEPTH + 2 * DEPTH * COLS
    assert report.host_bytes == written + ROWS * COLS * 2  # and the F16 result read back
    assert report.host_cycles == -(-report.host_bytes * 1500 // 32000)  # 32 GB/s at 1.5 GHz
    assert report.breakdown == {"gemm": gemm}
    assert report.tile_busy[10] == gemm + 90
    assert report.tile_busy[11] == gemm + OUT_WORDS + 90  # its send port was busy too
    assert report.tile_busy[20] == OUT_WORDS + 90


def test_host_write_read_round_trip_with_replicas_and_ragged_blocks(ipu: SimulatedIpu) -> None:
    rng = np.random.default_rng(5)
    rows, cols = 7, 10
    tiles = np.array([[[100, 200], [101, 201], [102, 202]],
                      [[103, 203], [104, 204], [105, 205]]], dtype=np.int32)
    layout = BlockLayout(rows, cols, F16, 4, 4, tiles)
    arrays: dict[str, np.ndarray] = {}
    addr = BASE + 0x100 + 8 * np.arange(tiles.size)  # every block at its own address
    write = host_step("host_write", "x", layout, addr, arrays)
    read = host_step("host_read", "x", layout, addr, arrays)
    manifest = {
        "kernels": [],
        "programs": {"initialize": [write], "run": [read]},
        "tensors": {"x": tensor_entry("output", [rows, cols], F16)},
    }
    ipu.load(package(manifest, arrays))
    x = rng.standard_normal((rows, cols)).astype(np.float32) * 3
    init = ipu.call("initialize", {"x": x})
    assert init.host_bytes == tiles.size * layout.block_bytes
    assert init.cycles == 0
    out = ipu.call("run", {}).outputs["x"]
    np.testing.assert_array_equal(out, x.astype(np.float16).astype(np.float32))
    # element (r, c) is at tile tiles[r // 4, c // 4, k], byte (r % 4) * 8 + (c % 4) * 2
    addresses = addr.reshape(tiles.shape)
    for r, c, k in [(0, 0, 0), (6, 9, 1), (5, 3, 0), (3, 8, 1)]:
        i, j = r // 4, c // 4
        at = int(addresses[i, j, k]) - BASE + (r % 4) * 8 + (c % 4) * 2
        value = ipu.memory[tiles[i, j, k], at : at + 2].view(np.float16)[0]
        assert value == np.float16(x[r, c])


def _expect_rejected(ipu: SimulatedIpu, manifest: dict, arrays: dict, message: str) -> None:
    with pytest.raises(PackageError, match=message):
        ipu.load(package(manifest, arrays))


def test_kernel_call_on_a_tile_that_does_not_exist(ipu: SimulatedIpu) -> None:
    manifest, arrays = gemm_package()
    arrays["gemm/tiles"] = np.array([10, 5000], dtype=np.int32)
    _expect_rejected(ipu, manifest, arrays,
                     r"run step 2 \(compute\) names tile 5000, which does not exist on ipu21")


@pytest.mark.parametrize(
    ("operand", "address"),
    [(0, BASE - 8), (2, END - 100), (1, END), (2, 0)],
)
def test_kernel_access_outside_tile_memory(ipu: SimulatedIpu, operand: int, address: int) -> None:
    manifest, arrays = gemm_package()
    arrays["gemm/addresses"] = arrays["gemm/addresses"].copy()
    arrays["gemm/addresses"][1, operand] = address
    _expect_rejected(
        ipu, manifest, arrays,
        rf"run step 2 \(compute\) gemm_f8_interleaved_k32_c16_r2_r2 accesses address "
        rf"{address} outside tile memory \[{BASE}, {END}\)",
    )


def test_amp_partials_outside_interleaved_memory_are_refused(ipu: SimulatedIpu) -> None:
    """poplibs' ConvPartial1x1Out takes its partials only in interleaved memory."""
    manifest, arrays = gemm_package()
    arrays["gemm/addresses"] = arrays["gemm/addresses"].copy()
    arrays["gemm/addresses"][1, 2] = BASE + 0x3000
    _expect_rejected(
        ipu, manifest, arrays,
        rf"run step 2 \(compute\) gemm_f8_interleaved_k32_c16_r2_r2: operand 2 at address "
        rf"{BASE + 0x3000} must be in interleaved memory \(>= 524288\)",
    )


def test_host_stream_and_exchange_checks(ipu: SimulatedIpu) -> None:
    manifest, arrays = gemm_package()
    bad = dict(arrays)
    bad["a/host_write/tiles"] = np.array([[[10, 5000]]], dtype=np.int32)
    _expect_rejected(ipu, manifest, bad, r"run step 0 \(host_write\) names tile 5000")
    bad = dict(arrays)
    bad["out/host_read/addresses"] = np.array([[[END - 16]]], dtype=np.int64)
    _expect_rejected(ipu, manifest, bad,
                     rf"run step 4 \(host_read\) accesses address {END - 16} outside")
    bad = dict(arrays)
    bad["move/dst_tile"] = np.array([1472], dtype=np.int32)
    _expect_rejected(ipu, manifest, bad, r"run step 3 \(exchange\) names tile 1472")
    bad = dict(arrays)
    bad["move/src_addr"] = np.array([END - 4], dtype=np.int64)
    _expect_rejected(ipu, manifest, bad, rf"run step 3 \(exchange\) accesses address {END - 4}")


def test_bad_schedule_is_a_device_fault(ipu: SimulatedIpu) -> None:
    manifest, arrays = gemm_package()
    arrays = dict(arrays)
    arrays["move/chunk_words"] = np.array([OUT_WORDS - 1], dtype=np.int64)
    with pytest.raises(DeviceFault, match=r"run step 3 \(exchange\): exchange schedule fault: "
                       r"uncovered word: transfer 0"):
        ipu.load(package(manifest, arrays))


def test_colliding_chunks_are_refused_at_load_as_a_port_overlap(ipu: SimulatedIpu) -> None:
    """Two transfers from tile 11 scheduled in the same cycles: its one send port cannot."""
    manifest, arrays = gemm_package()
    arrays = dict(arrays)
    for key, value in (("src_tile", [11, 11]), ("src_addr", [OUT_ADDR, OUT_ADDR]),
                       ("words", [OUT_WORDS, OUT_WORDS]), ("dst_offsets", [0, 1, 2]),
                       ("dst_tile", [20, 21]), ("dst_addr", [MOVED_ADDR, MOVED_ADDR]),
                       ("chunk_transfer", [0, 1]), ("chunk_start", [0, 0]),
                       ("chunk_words", [OUT_WORDS, OUT_WORDS])):
        arrays[f"move/{key}"] = np.array(value, dtype=arrays[f"move/{key}"].dtype)
    manifest["programs"]["run"][3]["lower_bound"] = 2 * OUT_WORDS  # tile 11 sends both
    with pytest.raises(DeviceFault, match=r"run step 3 \(exchange\): exchange schedule fault: "
                       r"send port overlap: tile 11 cycle 0 used by transfer 0"):
        ipu.load(package(manifest, arrays))
    arrays["move/chunk_start"] = np.array([0, OUT_WORDS], dtype=np.int64)  # one after the other
    ipu.load(package(manifest, arrays))


def test_malformed_packages(ipu: SimulatedIpu) -> None:
    manifest, arrays = gemm_package()
    unknown = copy.deepcopy(manifest)
    unknown["kernels"][0]["family"] = "fft"
    _expect_rejected(ipu, unknown, arrays, "unknown kernel family 'fft'")
    missing = dict(arrays)
    del missing["gemm/addresses"]
    _expect_rejected(ipu, manifest, missing, "names a missing array 'gemm/addresses'")
    no_programs = {"kernels": []}
    _expect_rejected(ipu, no_programs, arrays, "package program is invalid: manifest: has no 'programs'")
    odd = copy.deepcopy(manifest)
    odd["programs"]["run"][2]["kind"] = "teleport"
    _expect_rejected(ipu, odd, arrays, r"run step 2: unknown step kind .teleport.")
    # a split RMS norm's sums over 100 columns of a 2,048-wide row: not whole 128-column blocks
    ragged = copy.deepcopy(manifest)
    ragged["kernels"][0] = {"family": "row", "params": row_params(
        "rms_sums", 1, 100, F16, 200, F32, 4, width=2048)}
    _expect_rejected(ipu, ragged, arrays, r"kernel 0: parameters describe no call \(rms_sums "
                     r"of 100 columns is not whole blocks of a 2048-wide row's 16\)")
    # a norm without its scale's precision
    scaleless = copy.deepcopy(manifest)
    scaleless["kernels"][0] = {"family": "row", "params": row_params(
        "rms_norm", 1, 64, F16, 128, F16, 128, None, 0, eps=1e-5)}
    _expect_rejected(ipu, scaleless, arrays, r"kernel 0: parameters describe no call "
                     r"\(rms_norm has no aux operand's precision\)")


def test_call_errors() -> None:
    fresh = SimulatedIpu(IPU21)
    with pytest.raises(DeviceFault, match="no application loaded"):
        fresh.call("run", {})
    manifest, arrays = gemm_package()
    fresh.load(package(manifest, arrays))
    with pytest.raises(DeviceFault, match="host call is missing tensor 'b'"):
        fresh.call("run", {"a": np.zeros((ROWS, DEPTH), dtype=np.float32)})
    del fresh
