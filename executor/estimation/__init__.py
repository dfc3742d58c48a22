"""Will a training step fit, and how fast: every checkpointing strategy side by side
(`estimate`, `StepEstimate`)."""

from executor.estimation.api import STRATEGIES, estimate
from executor.estimation.report import Largest, Replan, StepEstimate, StrategyEstimate

__all__ = ["STRATEGIES", "Largest", "Replan", "StepEstimate", "StrategyEstimate", "estimate"]
