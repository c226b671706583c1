"""Policies without state worth the name: always, never, random."""

from __future__ import annotations

import random as _random

from pydantic import Field

from .base import PolicyArgs, StepInputs, parse_args


class NoArgs(PolicyArgs):
    pass


class Always:
    name = "always"

    def __init__(self, args: dict):
        parse_args(NoArgs, args, self.name)

    def decide(self, inputs: StepInputs) -> bool:
        return True


class Never:
    name = "never"

    def __init__(self, args: dict):
        parse_args(NoArgs, args, self.name)

    def decide(self, inputs: StepInputs) -> bool:
        return False


class RandomArgs(PolicyArgs):
    seed: int = 0
    p_on: float = Field(0.5, ge=0.0, le=1.0)
    period: int = Field(1, ge=1, description="draw a new mode every `period` decode steps")


class Random:
    """Seeded coin per step (for switch fuzzing).

    The draw depends only on the seed and the step index, so every tensor-parallel rank
    draws the same sequence.
    """

    name = "random"

    def __init__(self, args: dict):
        a = parse_args(RandomArgs, args, self.name)
        self.p_on, self.period = a.p_on, a.period
        self._rng = _random.Random(a.seed)
        self._draw_step = -1
        self._current = True

    def decide(self, inputs: StepInputs) -> bool:
        slot = inputs.step // self.period
        while self._draw_step < slot:  # catch up deterministically if steps were skipped
            self._current = self._rng.random() < self.p_on
            self._draw_step += 1
        return self._current
