"""popops MultiSlice on fake tile memory: each id's row of the tile's column block copied to
the output, an id outside the table skipped and its row left as it was; the price the device
gives what ran and the planner's closed form against the vendor's formula by hand; the table
split by columns over the tiles; MultiUpdate's rows written at their slots."""

from __future__ import annotations

import json

import numpy as np
import pytest
from tests.helpers import cli

from ipu_stack.device.pricing import price_work
from ipu_stack.kernels.base import KernelInstance
from ipu_stack.kernels.slice import FEW_TILES, MULTIUPDATE, multislice_params, multiupdate_params
from ipu_stack.lowering.lookup import lookup_block, lookup_groups, lookup_holders
from ipu_stack.planning.costs import estimate_multislice, kernel_cost
from ipu_stack.target.timing import Work


def test_each_id_copies_its_row_and_an_id_outside_the_table_is_skipped() -> None:
    rng = np.random.default_rng(0)
    vocab, width, count = 50, 6, 9  # 6 halves a row: 12 bytes, a 16-byte pitch
    table = rng.standard_normal((vocab, width)).astype(np.float16)
    ids = rng.integers(0, vocab, count).astype(np.uint32)
    ids[4] = vocab + 3  # not on the tile
    ids[7] = np.uint32(2**32 - 1)  # a negative id as the vertex sees it
    mem = np.zeros((3, 4096), dtype=np.uint8)
    ids_at, table_at, out_at = 0, 64, 2048
    for tile in (0, 2):  # two tiles run the call; tile 1 is left alone
        mem[tile, ids_at: ids_at + 4 * count] = ids.view(np.uint8)
        padded = np.zeros((vocab, 8), dtype=np.float16)
        padded[:, :width] = table
        mem[tile, table_at: table_at + 16 * vocab] = padded.view(np.uint8).ravel()
        mem[tile, out_at: out_at + 16 * count] = 0xEE  # what the skipped rows keep
    params = multislice_params(count, vocab, 2 * width, 2, 16, 16)
    instance = KernelInstance("multislice", params)
    work = instance.impl.run(params, mem, np.array([0, 2]), [ids_at, table_at, out_at])
    for tile in (0, 2):
        rows = mem[tile, out_at: out_at + 16 * count].reshape(count, 16)
        for k, index in enumerate(ids):
            if index < vocab:
                assert rows[k, :12].tobytes() == table[index].tobytes()
            else:
                assert (rows[k] == 0xEE).all()
            assert (rows[k, 12:] == 0xEE).all()  # the pitch's padding is not written
    assert not mem[1].any()
    assert work[0].counts == {"offsets": 9, "in_range": 7, "elements": 6, "itemsize": 2}


@pytest.mark.parametrize(("offsets", "elements", "expected"), [
    (308, 2, 6 * (30 + 52 * (19 + 2 * 1))),  # clip-text at batch 4: 308 ids, 2 columns
    (77, 768, 6 * (30 + 13 * (19 + 2 * 384))),
    (1, 7, 6 * (30 + 1 * (19 + 2 * 4))),
])
def test_the_price_is_the_vendors_model_of_the_split_vertex(offsets, elements, expected) -> None:
    assert estimate_multislice(offsets, elements, 2) == expected
    ran = Work("multislice", {"offsets": offsets, "in_range": offsets, "elements": elements,
                              "itemsize": 2})
    assert price_work(ran) == expected
    params = multislice_params(offsets, 1000, 2 * elements, 2, 4 * elements, 4 * elements)
    assert kernel_cost(KernelInstance("multislice", params)) == expected
    # every id is charged as in range, as the vendor's vertex estimator does: a tile of a
    # row group that holds none of the ids costs the same, so cycles do not depend on ids
    missed = Work("multislice", {"offsets": offsets, "in_range": 0, "elements": elements,
                                 "itemsize": 2})
    assert price_work(missed) == expected


def test_the_table_is_split_by_whole_words_of_columns_then_by_rows() -> None:
    assert lookup_block(768, 2, 1472) == 2  # 384 column blocks of 2 halves (one word)
    assert lookup_block(2048, 2, 1472) == 2 and lookup_block(4000, 2, 1472) == 4
    assert lookup_block(100, 4, 1472) == 1 and lookup_block(64, 1, 1472) == 4
    # CLIP's 49,408 rows: three row groups of 16,470 fill 1,152 of the 1,472 tiles
    assert lookup_groups(49408, 308, 384, 1472) == (3, 16470)
    holders = lookup_holders(3, 384, np.arange(1472))
    assert holders.shape == (3, 384) and len(set(holders.ravel().tolist())) == 1152
    # a decode step's holders stay off the 16 tiles its row lands on next
    spared = lookup_holders(1, 1024, np.arange(1456))
    assert len(set(spared.ravel().tolist())) == 1024 and spared.max() < 1456
    assert lookup_groups(130, 40, 35, 1472) == (33, 4)  # the last group holds 2 rows
    assert lookup_groups(49408, 2, 384, 1472) == (2, 24704)  # no more groups than ids
    assert lookup_groups(5000, 77, 1024, 1472) == (1, 5000)
    # one id (a decode step at batch 1): SmolLM2's 49,152 rows stay one group (196,608 bytes
    # a holder), a 262,144-row vocabulary takes four so no holder keeps over 256 KB
    assert lookup_groups(49152, 1, 144, 1472, 4) == (1, 49152)
    assert lookup_groups(262144, 1, 32, 1472, 4) == (4, 65536)
    assert lookup_groups(262144, 1, 1472, 1472, 4) == (1, 262144)  # no tiles to spare


def test_a_decode_step_with_a_gemma_sized_vocabulary_compiles_and_passes(tmp_path) -> None:
    """A 262,144-token table 64 wide held by one row group at one id a step needed 1 MB on
    each of its 32 holders and did not place; in row groups it does, and the step passes."""
    code, out, err = cli(["bench", "smollm2-135m", "--layers", "2", "--dim", "64", "--hidden",
                          "128", "--heads", "4", "--kv-heads", "2", "--vocab", "262144",
                          "--context", "16", "--tokens", "1", "--out", str(tmp_path), "--json"])
    record = json.loads(out.strip().splitlines()[-1])
    assert code == 0 and record["numericalTest"] == "PASS", err
    assert record["cycles"] == record["estimatedCycles"] and record["peakTileBytes"] < 638976


def test_a_row_group_zeroes_the_ids_it_does_not_hold() -> None:
    table = np.arange(4 * 2, dtype=np.float16).reshape(4, 2) + 1  # rows 10-13 of a table
    ids = np.array([11, 3, 13, 10, 12], dtype=np.uint32)  # 3: another group's
    mem = np.full((1, 256), 0xAB, dtype=np.uint8)
    mem[0, 0:20] = ids.view(np.uint8)
    mem[0, 32:48] = table.view(np.uint8).ravel()
    params = multislice_params(5, 4, 4, 2, 4, 4, first_row=10, fill=True)
    work = KernelInstance("multislice", params).impl.run(params, mem, np.array([0]),
                                                          [0, 32, 64])
    out = mem[0, 64:84].view(np.float16).reshape(5, 2)
    assert np.array_equal(out, np.stack([table[1], [0, 0], table[3], table[0], table[2]]))
    assert [w.kind for w in work] == ["fill", "multislice"]
    assert work[0].counts == {"elements": 10, "itemsize": 2}
    assert price_work(work[0]) == 6 * (26 + 0)  # two halves a worker: 26 + 4 // 8 bytes
    assert kernel_cost(KernelInstance("multislice", params)) == 6 * 26 + 6 * (
        30 + 1 * (19 + 2))
    # the vendor's Fill of 600 floats, bytes and halves a worker's share: 16 + n/2 + 7,
    # 39 + n/8, 26 + n/4
    assert price_work(Work("fill", {"elements": 3600, "itemsize": 4})) == 6 * (23 + 300)
    assert price_work(Work("fill", {"elements": 3600, "itemsize": 1})) == 6 * (39 + 75)
    assert price_work(Work("fill", {"elements": 3600, "itemsize": 2})) == 6 * (26 + 150)


def test_a_cache_write_on_few_tiles_writes_what_the_batched_call_does() -> None:
    """MultiUpdate a tile at a time (a call on ``FEW_TILES`` tiles or fewer) and batched over
    twelve tiles write the same bytes as a numpy model: each source row at its slot less
    the tile's first row, where the tile holds that row, a slot outside skipped."""
    tiles, offsets, held, first = 12, 3, 5, 10
    params = multiupdate_params(offsets, held, 12, 2, 16, 16, first_row=first)
    rng = np.random.default_rng(5)
    mem = rng.integers(0, 256, (tiles, 512), dtype=np.uint8)
    slots = rng.integers(first - 2, first + held + 2, (tiles, offsets)).astype(np.uint32)
    mem[:, 0:4 * offsets] = slots.view(np.uint8)
    expected = mem.copy()
    for tile in range(tiles):
        for k, slot in enumerate(slots[tile].tolist()):
            if 0 <= slot - first < held:
                at = 256 + (slot - first) * 16
                expected[tile, at:at + 12] = mem[tile, 64 + 16 * k:64 + 16 * k + 12]
    batched, few = mem.copy(), mem.copy()
    everything = np.arange(tiles)
    (work,) = MULTIUPDATE.run(params, batched, everything, [0, 64, 256])
    assert len(everything) > FEW_TILES
    mosts = [MULTIUPDATE.run(params, few, everything[i:i + 4], [0, 64, 256])[0]
             for i in range(0, tiles, 4)]
    assert np.array_equal(batched, expected) and np.array_equal(few, expected)
    in_range = ((slots.astype(np.int64) - first >= 0) & (slots - first < held)).sum(axis=1)
    assert work.counts["in_range"] == in_range.max()
    assert [w.counts["in_range"] for w in mosts] == [in_range[i:i + 4].max()
                                                     for i in range(0, tiles, 4)]
