"""The host reference: the graph interpreter of ``ir.interpret`` at device precision."""

from ipu_stack.ir.interpret import (
    drain,
    evaluate,
    evaluate_float64,
    evaluate_float64_steps,
    evaluate_steps,
)

__all__ = ["drain", "evaluate", "evaluate_float64", "evaluate_float64_steps", "evaluate_steps"]
