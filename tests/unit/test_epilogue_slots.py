"""Regression: the reduce kernel strides received slices by the full sub-block, not by the
valid rows (a ragged last row block has fewer valid rows than its slices hold)."""

from __future__ import annotations

import numpy as np

from ipu_stack.ir.precision import F32
from ipu_stack.kernels.base import KernelInstance
from ipu_stack.kernels.epilogue import epilogue_params


def test_received_slices_use_slot_stride_when_rows_are_ragged() -> None:
    rng = np.random.default_rng(7)
    parts, rows, slot_rows, cols = 3, 2, 5, 4
    pitch = cols * 4
    own = rng.standard_normal((slot_rows, cols)).astype(np.float32)
    received = rng.standard_normal((parts - 1, slot_rows, cols)).astype(np.float32)
    mem = np.zeros((1, 4096), dtype=np.uint8)
    mem[0, 0 : own.nbytes] = own.view(np.uint8).ravel()
    mem[0, 1024 : 1024 + received.nbytes] = received.view(np.uint8).ravel()
    params = epilogue_params(parts, rows, cols, pitch, slot_rows, [["round", F32.to_json()]],
                             None, F32, pitch)
    kernel = KernelInstance("reduce", params)
    kernel.impl.run(params, mem, np.array([0]), [0, 1024, 0, 2048])
    out = mem[0, 2048 : 2048 + rows * pitch].view(np.float32).reshape(rows, cols)
    expected = own[:rows].astype(np.float64) + received[:, :rows].astype(np.float64).sum(axis=0)
    np.testing.assert_allclose(out, expected, rtol=1e-6)
