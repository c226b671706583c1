"""Policies: given rank-identical step inputs, speculate (True) or not (False)."""

from .base import Policy, StepInputs, build_policy

__all__ = ["Policy", "StepInputs", "build_policy"]
