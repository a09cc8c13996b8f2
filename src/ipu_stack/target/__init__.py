"""Machine descriptions as data: every number the cost model and simulator use, with its source.

A change to any value here changes every benchmark; say so in the commit.
"""

from ipu_stack.target.machine import IPU2, IPU21, Fact, MemoryClass, Target, get_target

__all__ = ["Fact", "IPU2", "IPU21", "MemoryClass", "Target", "get_target"]
