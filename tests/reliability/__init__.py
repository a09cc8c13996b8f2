"""Reliability checks: determinism, random graphs, hostile packages, the shared cache.  The
generators live in ``ipu_stack.testing`` (shared with ``benchmarks/fuzz.py``)."""
