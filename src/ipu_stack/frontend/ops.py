"""Every ATen rule the importer knows, gathered from its families into ``HANDLERS``.

The families register into :mod:`ipu_stack.frontend.rules` when imported: layouts and views
(``ops_view``), arithmetic and row operations (``ops_math``), GEMMs and attention
(``ops_gemm``), activations, products and RMS norm (``ops_act``), lookups
(``ops_lookup``), writes into a static KV cache (``ops_cache``), rows moved as an order
(``order``: rolls, window partitions, strided slices).
"""

from __future__ import annotations

from ipu_stack.frontend import (
    ops_act,
    ops_cache,
    ops_gemm,
    ops_lookup,
    ops_math,
    ops_view,
    order,
)
from ipu_stack.frontend.rules import HANDLERS

__all__ = ["HANDLERS", "FAMILIES"]

FAMILIES = (ops_view, ops_math, ops_gemm, ops_act, ops_lookup, ops_cache, order)
