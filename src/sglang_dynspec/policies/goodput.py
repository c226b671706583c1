"""Pick the mode with more expected output tokens per second.

Per request and step, speculation yields ``accept_length`` tokens in ``t_on(bs)`` seconds;
a plain step yields 1 token in ``t_off(bs)``.  Costs come from the rank-agreed CostView,
the acceptance from the scheduler's own (rank-identical) accepted-draft counts.  Unknown
costs are learnt by running the unknown mode; a long stretch off is interrupted by a short
probe so that the acceptance estimate does not go stale.
"""

from __future__ import annotations

from pydantic import Field

from .base import PolicyArgs, StepInputs, parse_args


class GoodputArgs(PolicyArgs):
    margin: float = Field(0.04, ge=0.0, lt=1.0, description="relative gain needed to switch mode")
    min_dwell: int = Field(8, ge=0, description="decode steps to stay in a mode before switching")
    min_accept_samples: int = Field(8, ge=1, description="speculative steps before acceptance is trusted")
    reprobe_every: int = Field(2000, ge=1, description="off-steps after which speculation is retried")
    prior_speedup: float | None = Field(
        None, gt=0, description="assumed accept_length*t_off/t_on before anything is measured (None: measure)"
    )


class Goodput:
    name = "goodput"

    def __init__(self, args: dict):
        a = parse_args(GoodputArgs, args, self.name)
        self.margin = a.margin
        self.min_dwell = a.min_dwell
        self.min_accept = a.min_accept_samples
        self.reprobe = a.reprobe_every
        self.prior = a.prior_speedup

    def gain(self, x: StepInputs) -> float | None:
        """Speculative over plain throughput at this step's batch size, or None if unknown."""
        v = x.costs
        if v is None or x.accept_samples < self.min_accept:
            return None
        t_on = v.estimate(True, x.decode_bs)
        t_off = v.estimate(False, x.decode_bs)
        if t_on is None or t_off is None:
            return None
        return x.accept_length * t_off / t_on

    def decide(self, x: StepInputs) -> bool:
        prev = x.previous
        if prev is not None and x.steps_in_mode < self.min_dwell:
            return prev
        v = x.costs
        if v is None or x.accept_samples < self.min_accept or v.estimate(True, x.decode_bs) is None:
            if self.prior is not None and v is None:
                return self.prior >= 1.0
            return True  # learn acceptance and the speculative cost first
        if v.estimate(False, x.decode_bs) is None:
            return False  # then the plain cost
        g = self.gain(x)
        if prev is None or prev:
            return g >= 1.0 - self.margin
        if g > 1.0 + self.margin:
            return True
        return x.steps_in_mode >= self.reprobe  # short probe; dwell holds it min_dwell steps
