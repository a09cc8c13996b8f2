"""Strategies beyond one program over the whole chip: the layer pipeline (``compile``: the
grouping, the group programs, the hand-offs and the pipeline package) and the choice
between it and the layers strategy."""

from ipu_stack.strategy.compile import (
    StrategyResult,
    compile_pipeline,
    compile_strategy,
)

__all__ = ["StrategyResult", "compile_pipeline", "compile_strategy"]
