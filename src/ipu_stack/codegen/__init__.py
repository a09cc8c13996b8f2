"""Code generation: resolve addresses and emit the package's manifest and arrays."""
