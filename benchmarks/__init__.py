"""Benchmark and fuzz scripts, each run as ``python benchmarks/NAME.py``; the generators they
share with the test suite live in ``ipu_stack.testing``."""
