"""Reliability checks (issue 6): determinism, random graphs, hostile packages, the shared
cache.  The generators live in ``benchmarks/fuzzing.py`` (shared with ``benchmarks/fuzz.py``)."""
