"""Generators and references shared by the test suite (``tests/``) and the benchmark and
fuzz scripts (``benchmarks/``), so that neither imports the other.

* :mod:`~ipu_stack.testing.reference`: independent float64 references (the tanh GELU,
  rounding to a stored precision) written with numpy and ml_dtypes only, no stack code;
* :mod:`~ipu_stack.testing.runner`: the command line run in this process;
* :mod:`~ipu_stack.testing.graphs`: small random graphs with their float64 expected output;
* :mod:`~ipu_stack.testing.mutations`: damaged and hostile packages made from a real one;
* :mod:`~ipu_stack.testing.steps`: a pipeline's planned step put down to kinds of work;
* :mod:`~ipu_stack.testing.models`: transformers models with no parameter left at a
  constant that would hide a path (a Swin's relative position bias).

The compiler itself imports nothing from here.
"""
