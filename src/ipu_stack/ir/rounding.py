"""Fast, exact conversions between float32 and the stored formats, and the FP16-partial
accumulation of the FP8 AMP.

Why this module exists: a tower's run rounds about ten billion values (every 32-deep AMP pass
adds to an FP16 partial and rounds it, and every stored FP8 value is encoded and decoded).
numpy does each of those roundings as a separate ``astype`` pass over memory, and ml_dtypes'
FP8 casts cost several times what the compiled loops below do (each conversion's time an
element, against ml_dtypes' and numpy's: docs/benchmarks.md, "The simulator and the verdict
at BLAS speed" and "Whole towers at the speed the chip allows").  Here:

* FP8 decoding is a 256-entry table per (format, scale exponent): one gather;
* FP8 encoding is a compiled loop (numba) that rounds to nearest even on the float32 bits
  (add half an ulp minus one plus the kept last bit, clear the dropped bits), and on a
  float64 grid below the normal range, without branches so that it vectorises;
* the FP16 rounding is the hardware's own conversion to half precision and back (LLVM's
  ``fptrunc``; F16C on x86), which vectorises and gives numpy's ``float16`` bits (checked
  on every tie and edge, ``tests/unit/test_fast_numerics.py``);
* :func:`fp16_pass_codes` and :func:`fp16_blocked_matmul` add each AMP pass's product to an
  FP16 partial and round it in one compiled loop, instead of three array passes per pass.

Each result is bit-identical to the numpy/ml_dtypes conversion of the same values
(saturating FP8 encode of the clipped value, round-to-nearest-even, NaN kept):
``tests/unit/test_fast_numerics.py`` checks every float16 value, the midpoints between
neighbouring FP8 values at several scales, and random float32 values against ml_dtypes and
numpy.
"""

from __future__ import annotations

from functools import lru_cache

import ml_dtypes
import numba
import numpy as np
from llvmlite import ir
from numba import types
from numba.extending import intrinsic

# per FP8 format: (mantissa bits, exponent of the smallest quantum, bias, max finite)
_FP8_FORMATS: dict[str, tuple[int, int, int, float]] = {
    "F8F143": (3, -10, 8, 240.0),     # float8_e4m3fnuz: min normal 2^-7, subnormals 2^-10
    "F8F152": (2, -17, 16, 57344.0),  # float8_e5m2fnuz: min normal 2^-15, subnormals 2^-17
}
_FP8_DTYPES = {"F8F143": ml_dtypes.float8_e4m3fnuz, "F8F152": ml_dtypes.float8_e5m2fnuz}
_F16_MIN_NORMAL_BITS = 0x38800000  # 2^-14
_CHUNK = 1 << 22  # elements per compiled call: keeps peak temporaries small


@intrinsic
def _bits(typingctx, value):  # type: ignore[no-untyped-def]
    """The IEEE bits of a float32 (a bit cast, no conversion)."""
    def codegen(context, builder, signature, args):  # type: ignore[no-untyped-def]
        return builder.bitcast(args[0], ir.IntType(32))
    return types.uint32(types.float32), codegen


@intrinsic
def _from_bits(typingctx, bits):  # type: ignore[no-untyped-def]
    """The float32 whose IEEE bits are ``bits``."""
    def codegen(context, builder, signature, args):  # type: ignore[no-untyped-def]
        return builder.bitcast(args[0], ir.FloatType())
    return types.float32(types.uint32), codegen


@intrinsic
def _through_half(typingctx, value):  # type: ignore[no-untyped-def]
    """A float32 converted to IEEE half precision and back (LLVM's ``fptrunc``/``fpext``):
    round to nearest even, FP16 subnormals on their grid of 2^-24, from 65520 on infinity.
    On x86 with F16C it is one vector instruction each way, so the loops using it vectorise."""
    def codegen(context, builder, signature, args):  # type: ignore[no-untyped-def]
        return builder.fpext(builder.fptrunc(args[0], ir.HalfType()), ir.FloatType())
    return types.float32(types.float32), codegen


@numba.njit(cache=True, nogil=True, inline="always")
def _f16(x: np.float32) -> np.float32:
    """A float32 rounded to the nearest FP16 value (ties to even; beyond the range: inf), a
    NaN kept as it is (payload and all).  The same bits as rounding the float32 bits by
    hand (``tests/unit/test_fast_numerics.py`` keeps that form and checks every float32
    whose exponent FP16 can reach, and samples of the rest), at a third of its cost: the
    FP16 partials of every AMP pass go through here, a tower's run about 20 G of them."""
    if x != x:
        return x
    return _through_half(x)


@numba.njit(cache=True, nogil=True)
def _round_f16_flat(values: np.ndarray, out: np.ndarray) -> None:
    for i in range(values.size):
        out[i] = _f16(values[i])


@numba.njit(cache=True, nogil=True)
def _accumulate(dots: np.ndarray, partial: np.ndarray) -> None:
    """``partial[b] = f16(f16(partial[b] + dots[b, 0]) + dots[b, 1]) ...`` over the passes
    (axis 1), each sum in float32 as the stored FP16 partial is widened and added."""
    batch, passes = dots.shape[0], dots.shape[1]
    size = partial.shape[1]
    for b in range(batch):
        for k in range(passes):
            for i in range(size):
                partial[b, i] = _f16(np.float32(partial[b, i] + dots[b, k, i]))


@numba.njit(cache=True, nogil=True)
def _encode_fp8(values: np.ndarray, out: np.ndarray, scale: np.float32, mantissa_bits: int,
                min_quantum: int, bias: int, limit: np.float32) -> None:
    """FP8 codes of ``values * scale``.  Branch-free, so that the loop vectorises (every
    GEMM operand of a tower passes through here, on the device and on the host; a branch
    for NaN and one for the subnormal range stop LLVM vectorising it: the figures are in
    docs/benchmarks.md, "Whole towers at the speed the chip allows").  Both candidates are
    computed for every element and the right one selected: the normal one by
    rounding the float32 bits to the format's mantissa, the subnormal one by adding and
    subtracting a float32 whose unit in the last place is the subnormal grid.  Every
    float32 gives the codes of the form with those two branches (checked over all 2^32 of
    them, both formats, three scales) and ml_dtypes' cast of the clipped value
    (``tests/unit/test_fast_numerics.py``)."""
    one = np.uint32(1)
    min_normal = _bits(np.float32(2.0 ** (min_quantum + mantissa_bits)))
    limit_bits = _bits(limit)
    drop = np.uint32(23 - mantissa_bits) & np.uint32(31)  # a shift LLVM sees is below 32
    half = np.uint32((1 << (22 - mantissa_bits)) - 1)
    rebias = np.uint32((127 - bias) << mantissa_bits)
    magic = np.float32(2.0 ** (min_quantum + 23))  # its float32 ulp is the subnormal grid
    per_quantum = np.float32(2.0 ** -min_quantum)
    for i in range(values.size):
        bits = _bits(np.float32(values[i] * scale))  # exact: a power of two, as np.ldexp
        magnitude = bits & np.uint32(0x7FFFFFFF)
        nan = magnitude > np.uint32(0x7F800000)
        magnitude = magnitude if magnitude < limit_bits else limit_bits  # saturate
        # nearest even: add half an ulp less one, plus the kept lowest bit
        normal = ((magnitude + half + ((magnitude >> drop) & one)) >> drop) - rebias
        small = _from_bits(magnitude if magnitude < min_normal else min_normal)
        grid = (small + magic) - magic  # nearest even on the grid of 2^min_quantum
        code = np.uint32(np.int32(grid * per_quantum)) if magnitude < min_normal else normal
        sign = (bits >> np.uint32(24)) & np.uint32(0x80)
        code = code | (sign if code != np.uint32(0) else np.uint32(0))  # no negative zero
        out[i] = np.uint8(np.uint32(0x80) if nan else code)


@numba.njit(cache=True, nogil=True)
def _half_bits(x: np.float32) -> np.uint32:
    """The FP16 code of a float32 that already is an FP16 value (or inf / NaN)."""
    bits = _bits(x)
    sign = (bits >> np.uint32(16)) & np.uint32(0x8000)
    magnitude = bits & np.uint32(0x7FFFFFFF)
    if magnitude >= np.uint32(0x7F800000):  # inf, or NaN keeping its top payload bits
        half = np.uint32(0x7C00) | ((magnitude & np.uint32(0x7FFFFF)) >> np.uint32(13))
        if magnitude > np.uint32(0x7F800000) and half == np.uint32(0x7C00):
            half += np.uint32(1)  # ... but still a NaN
    elif magnitude < np.uint32(_F16_MIN_NORMAL_BITS):  # subnormal: a multiple of 2^-24
        half = np.uint32(abs(np.float64(x)) * 2.0**24)
    else:
        half = (magnitude - np.uint32(112 << 23)) >> np.uint32(13)
    return sign | half


@numba.njit(cache=True, nogil=True)
def _encode_f16(values: np.ndarray, out: np.ndarray) -> None:
    """FP16 bits of float32 values, rounded to nearest even (numpy's ``astype``)."""
    for i in range(values.size):
        out[i] = _half_bits(_f16(values[i]))


@numba.njit(cache=True, nogil=True)
def _fold_encode(dots: np.ndarray, partial: np.ndarray, out: np.ndarray) -> None:
    """The last pass: ``out = code(f16(partial + dots))``, the fold and the encode in one
    sweep (``partial`` is None-like when empty: the first pass adds to +0)."""
    if partial.size:
        for i in range(out.size):
            out[i] = _half_bits(_f16(np.float32(partial[i] + dots[i])))
    else:
        for i in range(out.size):
            out[i] = _half_bits(_f16(np.float32(np.float32(0.0) + dots[i])))


def encode_f16(values: np.ndarray) -> np.ndarray:
    """float16 storage of ``values`` (``values.astype(np.float16)``, without its slow cast)."""
    flat = np.ascontiguousarray(values, dtype=np.float32).reshape(-1)
    out = np.empty(flat.size, dtype=np.uint16)
    _encode_f16(flat, out)
    return out.view(np.float16).reshape(np.shape(values))


@lru_cache(maxsize=1)
def f16_table() -> np.ndarray:
    """The float32 value of each of the 65536 FP16 codes (256 KiB: stays in cache)."""
    table = np.arange(65536, dtype=np.uint16).view(np.float16).astype(np.float32)
    table.flags.writeable = False
    return table


def decode_f16(stored: np.ndarray) -> np.ndarray:
    """float32 values of FP16 storage: one gather from :func:`f16_table`."""
    codes = np.ascontiguousarray(stored).view(np.uint16).reshape(-1)
    out = np.empty(codes.size, dtype=np.float32)
    _decode(codes, f16_table(), out)
    return out.reshape(np.shape(stored))


def round_f16(values: np.ndarray) -> np.ndarray:
    """float32 values rounded to FP16 precision, still float32 (``x.astype(f16).astype(f32)``)."""
    flat = np.ascontiguousarray(values, dtype=np.float32).reshape(-1)
    out = np.empty_like(flat)
    _round_f16_flat(flat, out)
    return out.reshape(np.shape(values))


def encode_fp8(values: np.ndarray, kind: str, scale_exponent: int) -> np.ndarray:
    """FP8 storage of ``values / 2^scale_exponent``, saturated to the format's largest value
    and rounded to nearest even (ml_dtypes' cast of the clipped value, NaN to 0x80)."""
    mantissa_bits, min_quantum, bias, limit = _FP8_FORMATS[kind]
    flat = np.ascontiguousarray(values, dtype=np.float32).reshape(-1)
    out = np.empty(flat.size, dtype=np.uint8)
    scale = np.float32(2.0 ** -scale_exponent)
    for start in range(0, flat.size, _CHUNK):
        _encode_fp8(flat[start:start + _CHUNK], out[start:start + _CHUNK], scale, mantissa_bits,
                    min_quantum, bias, np.float32(limit))
    return out.view(_FP8_DTYPES[kind]).reshape(np.shape(values))


@lru_cache(maxsize=256)
def fp8_table(kind: str, scale_exponent: int) -> np.ndarray:
    """The float32 value of each of the 256 FP8 codes, times ``2^scale_exponent`` (exact)."""
    codes = np.arange(256, dtype=np.uint8).view(_FP8_DTYPES[kind])
    table = codes.astype(np.float32) * np.float32(2.0**scale_exponent)
    table.flags.writeable = False
    return table


@numba.njit(cache=True, nogil=True)
def _decode(codes: np.ndarray, table: np.ndarray, out: np.ndarray) -> None:
    for i in range(codes.size):
        out[i] = table[codes[i]]


@lru_cache(maxsize=64)
def _wide_table(kind: str, scale_exponent: int) -> np.ndarray:
    narrow = f16_table() if kind == "F16" else fp8_table(kind, scale_exponent)
    with np.errstate(invalid="ignore"):  # FP16's signalling NaN codes: NaN either way
        table = narrow.astype(np.float64)
    table.flags.writeable = False
    return table


def decode_float64(stored: np.ndarray, kind: str, scale_exponent: int) -> np.ndarray:
    """float64 values of F16 or FP8 storage: one gather from the float32 table widened,
    so exactly the decoded float32 values cast up (the float64 model reads every weight so),
    without the float32 array in between."""
    bits = np.uint16 if kind == "F16" else np.uint8
    codes = np.ascontiguousarray(stored).view(bits).reshape(-1)
    out = np.empty(codes.size, dtype=np.float64)
    _decode(codes, _wide_table(kind, scale_exponent), out)
    return out.reshape(np.shape(stored))


def decode_fp8(stored: np.ndarray, kind: str, scale_exponent: int) -> np.ndarray:
    """float32 values of FP8 codes: one gather from the 256-entry table."""
    codes = np.ascontiguousarray(stored).view(np.uint8).reshape(-1)
    out = np.empty(codes.size, dtype=np.float32)
    _decode(codes, fp8_table(kind, scale_exponent), out)
    return out.reshape(np.shape(stored))


PASS_BATCH_BYTES = 256 << 10  # one sub-batch's products and partials: held in L2


def f32_matmul(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """``a @ b`` of float32 operands as float32, summed in float64 and rounded once: BLAS's
    float32 sums run in an order that depends on the product's shape and the CPU's kernel,
    so a row's bits would change with the row block a tile holds it in; a float64 sum of
    F16 or FP8 products rounds to the same float32 whatever its order, unless its products
    span more than float64's 53 bits and cancel (2.5e7 against 1e-11: one FP32 ulp)."""
    return np.matmul(a.astype(np.float64), b.astype(np.float64)).astype(np.float32)


def fp16_pass_codes(a: np.ndarray, b: np.ndarray, pass_depth: int,
                    a_of: np.ndarray | None = None) -> np.ndarray:
    """``a @ b`` as the FP8 AMP computes it: ``a`` ``[batch, rows, depth]``, ``b``
    ``[batch, depth, cols]`` (float32 values of FP8 operands); each ``pass_depth``-deep slice
    is one float32 matrix product, added to an FP16 partial that is rounded after every
    pass.  Returns the partials as float16 ``[batch, rows, cols]``.  With ``a_of`` (each
    item's row of ``a``, non-decreasing: runs of items that share their A operand, as
    ``kernels.base.read_shared_values`` reads them), ``a`` holds one matrix a run and a
    sub-batch never spans two runs: its product takes the run's matrix broadcast, the same
    BLAS call per item on the same values.

    The items go in sub-batches whose products and partials stay in cache.  Each pass is one
    stacked matmul over the sub-batch (numpy makes one BLAS call per item, on views of the
    pass's A columns and B rows, the same call a 2-D product makes, so the same bits), and a
    compiled loop folds it into the partials; the last pass folds and encodes in one sweep.
    One call per pass and sub-batch, not per item: a tower's GEMMs are about a million
    tile-sized passes, and the Python around each call cost more than its product."""
    batch, depth, cols = b.shape
    rows = a.shape[1]
    size = rows * cols
    codes = np.empty((batch, size), dtype=np.uint16)
    starts = list(range(0, depth, pass_depth))
    step = max(1, PASS_BATCH_BYTES // max(1, 8 * size))
    dots = np.empty((min(step, batch), rows, cols), dtype=np.float32)
    partial = np.empty((min(step, batch), size if len(starts) > 1 else 0), dtype=np.float32)
    for first, last in _sub_batches(batch, step, a_of):
        dot, folded = dots[: last - first], partial[: last - first]
        flat = dot.reshape(last - first, 1, size)
        folded.fill(0.0)
        left = a[first:last] if a_of is None else a[a_of[first]]
        for lo in starts:
            hi = min(lo + pass_depth, depth)
            np.matmul(left[..., lo:hi], b[first:last, lo:hi], out=dot)
            if lo != starts[-1]:
                _accumulate(flat, folded)
            else:  # the last pass folds and encodes in one sweep
                _fold_encode_batch(flat, folded, codes[first:last])
    return codes.view(np.float16).reshape(batch, rows, cols)


def _sub_batches(batch: int, step: int, a_of: np.ndarray | None) -> list[tuple[int, int]]:
    """``[first, last)`` item ranges of at most ``step`` items, none spanning two runs of
    ``a_of``."""
    if a_of is None:
        return [(first, min(first + step, batch)) for first in range(0, batch, step)]
    starts = np.flatnonzero(np.diff(a_of, prepend=-1)).tolist() + [batch]
    return [(first, min(first + step, end))
            for start, end in zip(starts[:-1], starts[1:], strict=True)
            for first in range(start, end, step)]


@numba.njit(cache=True, nogil=True)
def _fold_encode_batch(dots: np.ndarray, partial: np.ndarray, out: np.ndarray) -> None:
    """:func:`_fold_encode` for each item of a sub-batch (``dots`` ``[batch, 1, size]``)."""
    for item in range(out.shape[0]):
        _fold_encode(dots[item, 0], partial[item], out[item])


CACHE_BYTES = 1 << 20  # a column strip's partials and products: kept within L2 (1.25-2 MiB)


def fp16_blocked_matmul(a: np.ndarray, b: np.ndarray, depth_block: int,
                        pass_depth: int, owners: np.ndarray | None = None) -> np.ndarray:
    """``a @ b`` (``[rows, depth] @ [depth, cols]``) as a depth-split FP8 GEMM computes it:
    each ``depth_block`` of the depth is summed as :func:`fp16_pass_codes` does (FP16
    partials rounded after every ``pass_depth``-deep pass), and the blocks' partials are
    added in float32, in order; with ``owners`` (each row's depth block that is added
    first, then the others in order: :func:`add_in_owner_order`), in the order the device's
    depth tiles add them.

    Column strip by strip, so that one strip's partial, products and total stay in cache
    while every block and pass runs over it (a whole so400m MLP output is 12.5 MB a pass)."""
    rows, depth = a.shape
    cols = b.shape[1]
    total = np.zeros((rows, cols), dtype=np.float32)
    if rows == 0 or cols == 0:
        return total
    passes = [(lo, min(lo + pass_depth, block + depth_block, depth))
              for block in range(0, depth, depth_block)
              for lo in range(block, min(block + depth_block, depth), pass_depth)]
    a_passes = [np.ascontiguousarray(a[:, lo:hi]) for lo, hi in passes]
    strip = int(min(cols, max(16, CACHE_BYTES // (12 * rows) // 16 * 16)))
    dot = np.empty((rows, strip), dtype=np.float32)
    # each depth block's partial of a strip: one slot (no owners: one slot, added at once)
    count = -(-depth // depth_block) if owners is not None else 1
    if owners is not None:
        _check_owners(owners, count)
        owners = owners.astype(np.int64, copy=False)  # once, not a strip
    partials = np.empty((count, rows * strip), dtype=np.float32)
    for c0 in range(0, cols, strip):
        width = min(strip, cols - c0)
        product = dot[:, :width]
        out = total[:, c0 : c0 + width]
        for index, (lo, hi) in enumerate(passes):
            slot = lo // depth_block if owners is not None else 0
            folded = partials[slot : slot + 1, : rows * width]
            if lo % depth_block == 0:
                folded[:] = 0
            np.matmul(a_passes[index], b[lo:hi, c0 : c0 + width], out=product)
            _accumulate(np.ascontiguousarray(product).reshape(1, 1, -1), folded)
            if owners is None and (hi % depth_block == 0 or hi == depth):
                out += folded.reshape(rows, width)
        if owners is not None:
            _add_owner_first(partials[:, : rows * width].reshape(count, rows, width),
                             owners, out)
    return total


def add_in_owner_order(parts: list[np.ndarray] | np.ndarray, owners: np.ndarray
                       ) -> np.ndarray:
    """``sum(parts)`` row by row in float32, each row starting from ``parts[owners[row]]``
    and adding the others in order: how a depth-split GEMM's reduce adds its partials (the
    depth tile that finishes a row adds its own partial first).  One compiled sweep over the
    rows: the row sets of each owner, gathered part by part, cost more than the adds."""
    stacked = parts if isinstance(parts, np.ndarray) else np.stack(parts)
    _check_owners(owners, len(stacked))
    rows = stacked.shape[1]
    total = np.empty((rows, stacked[0].size // max(rows, 1)), dtype=np.float32)
    _add_owner_first(stacked.astype(np.float32, copy=False).reshape(len(stacked), rows, -1),
                     owners.astype(np.int64, copy=False), total)
    return total.reshape(stacked.shape[1:])


def _check_owners(owners: np.ndarray, blocks: int) -> None:
    """Every row's owner is one of the ``blocks`` depth blocks (the compiled sweep does not
    check its indices)."""
    if owners.size and not 0 <= int(owners.min()) <= int(owners.max()) < blocks:
        raise ValueError(f"rows owned by depth blocks {int(owners.min())}..{int(owners.max())}"
                         f" of {blocks}")


@numba.njit(cache=True, nogil=True)
def _add_owner_first(parts: np.ndarray, owners: np.ndarray, out: np.ndarray) -> None:
    for r in range(out.shape[0]):
        own = owners[r]
        row, first = out[r], parts[own, r]
        for c in range(row.size):
            row[c] = first[c]
        for k in range(parts.shape[0]):
            if k != own:
                part = parts[k, r]
                for c in range(row.size):
                    row[c] += part[c]


@numba.njit(cache=True, nogil=True, inline="always")
def _differ(x: float, y: float) -> bool:
    """Two values differ (``x != y``), where NaN equals NaN: the verdict's notion."""
    return not (x == y or (x != x and y != y))


@numba.njit(cache=True, nogil=True)
def _differing_values(a: np.ndarray, b: np.ndarray, mask: np.ndarray) -> int:
    count = 0
    for i in range(a.size):
        d = _differ(a[i], b[i])
        mask[i] = d
        count += d
    return count


@numba.njit(cache=True, nogil=True)
def _differing_codes(a: np.ndarray, b: np.ndarray, table: np.ndarray, mask: np.ndarray) -> int:
    """As :func:`_differing_values` on the decoded codes: equal codes are equal values, and
    only where the codes differ are the two values looked up (F16 +0 and -0, NaN payloads)."""
    count = 0
    for i in range(a.size):
        d = False
        if a[i] != b[i]:
            d = _differ(table[a[i]], table[b[i]])
        mask[i] = d
        count += d
    return count


@numba.njit(cache=True, nogil=True)
def _differing_rows_values(a: np.ndarray, b: np.ndarray, rows: np.ndarray) -> int:
    count = 0
    for r in range(a.shape[0]):
        d = False
        for c in range(a.shape[1]):
            if _differ(a[r, c], b[r, c]):
                d = True
                break  # the row is rerun: the rest of it need not be read
        rows[r] = d
        count += d
    return count


@numba.njit(cache=True, nogil=True)
def _differing_rows_codes(a: np.ndarray, b: np.ndarray, table: np.ndarray,
                          rows: np.ndarray) -> int:
    count = 0
    for r in range(a.shape[0]):
        d = False
        for c in range(a.shape[1]):
            if a[r, c] != b[r, c] and _differ(table[a[r, c]], table[b[r, c]]):
                d = True
                break
        rows[r] = d
        count += d
    return count


def _code_table(kind: str, scale_exponent: int) -> tuple[np.ndarray, type] | None:
    """The decoding table of a stored format and its codes' integer type (None for F32)."""
    if kind == "F16":
        return f16_table(), np.uint16
    if kind in _FP8_FORMATS:
        return fp8_table(kind, scale_exponent), np.uint8
    return None


def differing(a: np.ndarray, b: np.ndarray) -> tuple[int, np.ndarray]:
    """How many elements of two same-shaped arrays differ as values (NaN equals NaN), and
    where: ``~((a == b) | (isnan(a) & isnan(b)))`` in one compiled pass, without its four
    temporaries (a tower's attention scores are 34 MB a temporary)."""
    x = np.ascontiguousarray(a).reshape(-1)
    y = np.ascontiguousarray(b).reshape(-1)
    mask = np.empty(x.size, dtype=np.bool_)
    count = _differing_values(x, y, mask)
    return int(count), mask.reshape(np.shape(a))


def differing_codes(a: np.ndarray, b: np.ndarray, kind: str,
                    scale_exponent: int) -> tuple[int, np.ndarray]:
    """:func:`differing` of the values two arrays of storage codes of one F16 or FP8
    precision mean, without decoding them."""
    table, bits = _code_table(kind, scale_exponent)  # type: ignore[misc]
    x = np.ascontiguousarray(a).view(bits).reshape(-1)
    y = np.ascontiguousarray(b).view(bits).reshape(-1)
    mask = np.empty(x.size, dtype=np.bool_)
    count = _differing_codes(x, y, table, mask)
    return int(count), mask.reshape(np.shape(a))


def differing_rows(a: np.ndarray, b: np.ndarray, kind: str | None = None,
                   scale_exponent: int = 0) -> np.ndarray:
    """Which rows of two same-shaped matrices differ anywhere (as :func:`differing`); with
    ``kind``, ``a`` and ``b`` are storage codes of that format.  A row stops being read at
    its first difference."""
    rows = np.empty(a.shape[0], dtype=np.bool_)
    if kind is None:
        _differing_rows_values(np.ascontiguousarray(a), np.ascontiguousarray(b), rows)
        return rows
    table, bits = _code_table(kind, scale_exponent)  # type: ignore[misc]
    _differing_rows_codes(np.ascontiguousarray(a).view(bits), np.ascontiguousarray(b).view(bits),
                          table, rows)
    return rows
