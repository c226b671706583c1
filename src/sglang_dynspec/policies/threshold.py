"""Speculate while the decode batch is small, with a hysteresis band and a minimum dwell."""

from __future__ import annotations

from pydantic import Field, model_validator

from .base import PolicyArgs, StepInputs, parse_args


class ThresholdArgs(PolicyArgs):
    n: int = Field(8, ge=0, description="speculate while decode batch size <= n")
    band: int = Field(0, ge=0, description="once off, turn back on only at batch size <= n - band")
    min_dwell: int = Field(0, ge=0, description="decode steps to stay in a mode before switching")

    @model_validator(mode="after")
    def _band_fits(self):
        if self.band > self.n:
            raise ValueError(f"band ({self.band}) must not exceed n ({self.n})")
        return self


class Threshold:
    name = "threshold"

    def __init__(self, args: dict):
        a = parse_args(ThresholdArgs, args, self.name)
        self.n, self.band, self.min_dwell = a.n, a.band, a.min_dwell

    def decide(self, x: StepInputs) -> bool:
        prev = x.previous
        if prev is None:
            return x.decode_bs <= self.n
        if x.steps_in_mode < self.min_dwell:
            return prev
        if prev:
            return x.decode_bs <= self.n
        return x.decode_bs <= self.n - self.band
