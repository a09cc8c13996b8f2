"""Tests of storage placement and memory reports (a package, so module names stay unique)."""
