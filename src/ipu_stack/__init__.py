"""ipu-stack: a compiler and simulated machine for the Graphcore IPU (target ``ipu21``).

The stages live in sub-packages and import one way (see ``docs/architecture.md``):
``target``/``ir`` -> ``planning`` -> ``lowering`` -> ``memory`` -> ``exchange`` -> ``kernels``
-> ``codegen`` -> ``package`` -> ``device`` -> ``runtime``.  ``pipeline`` chains them and
``cli`` sits on top.
"""

__version__ = "0.1.0"
