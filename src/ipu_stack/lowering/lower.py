"""Lower planned stages into buffers, compute sets, exchange phases and host streams.

:class:`Lowering` is one object with the shared state and helpers of ``lowering.base`` and
the two kinds of stage: ``lowering.gemm_stage`` (a GEMM stage: operands gathered onto a tile
grid, AMP calls into partials, the reduce-scatter of depth partials, the reduce with its
fused chain) and ``lowering.row_stage`` (a row stage: inputs gathered into whole rows, one
row kernel), ``lowering.lookup`` (a table's rows picked by runtime ids), ``lowering.permute`` (rows
moved in an order known when compiling) and
``lowering.cache`` (a KV cache's rows written at runtime positions) and ``lowering.argmax``
(each row's largest value's column, where the rows lie).
``lowering.driver`` walks the stages on it; ``lowering.loop`` lowers a layer
loop's body on it once.

The public names of those modules that importers read from here are re-exported.
"""

from __future__ import annotations

from ipu_stack.lowering.argmax import ArgmaxLowering
from ipu_stack.lowering.base import FRAGMENT_LIMIT, PARAM_BLOCK, BodyState, Piece, landing_layout
from ipu_stack.lowering.cache import CacheLowering
from ipu_stack.lowering.gemm_stage import GemmLowering, Group, stage_groups
from ipu_stack.lowering.lookup import LookupLowering
from ipu_stack.lowering.permute import PermuteLowering
from ipu_stack.lowering.row_stage import RowLowering

__all__ = ["FRAGMENT_LIMIT", "PARAM_BLOCK", "BodyState", "Group", "Lowering", "Piece",
           "landing_layout", "stage_groups"]


class Lowering(GemmLowering, RowLowering, LookupLowering, PermuteLowering, CacheLowering,
               ArgmaxLowering):
    """Builds a :class:`~ipu_stack.lowering.program.Program` stage by stage."""
