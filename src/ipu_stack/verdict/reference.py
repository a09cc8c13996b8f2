"""The host reference: the graph interpreter of ``ir.interpret`` at device precision."""

from ipu_stack.ir.interpret import (
    evaluate,
    evaluate_float64,
    evaluate_float64_steps,
    evaluate_steps,
)

__all__ = ["evaluate", "evaluate_float64", "evaluate_float64_steps", "evaluate_steps"]
