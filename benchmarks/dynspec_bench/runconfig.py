"""What every harness run kind shares: servers, output place, time budget."""

from __future__ import annotations

import time
from dataclasses import dataclass

from .modes import ServerConfig


@dataclass
class RunConfig:
    server: ServerConfig
    variant: str = ""  # e.g. "topk4": applies to every speculative server of the run
    output_len: int = 128
    input_len: int = 256
    out_dir: str = "benchmarks/results"
    name: str = "run"
    log_dir: str | None = None
    base_port: int = 30100
    start_timeout_s: float = 300.0
    deadline: float | None = None  # time.monotonic() value after which no new level starts
    level_margin_s: float = 25.0
    seed: int = 0
    server_factory: object = None

    def remaining_s(self) -> float:
        return float("inf") if self.deadline is None else self.deadline - time.monotonic()
