"""Benchmark and fuzz scripts (run from the repository root); ``benchmarks.fuzzing`` holds
the random-graph and hostile-package generators the reliability tests share with them."""
