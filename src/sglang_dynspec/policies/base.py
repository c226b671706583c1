"""What a policy sees and how one is built from its name and arguments."""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

from pydantic import BaseModel, ConfigDict, ValidationError

from ..errors import ConfigError


@dataclass(frozen=True, slots=True)
class StepInputs:
    """Per decode step; every field is identical on all tensor-parallel ranks.

    ``costs`` holds step-time estimates already agreed across ranks (or None before any).
    """

    step: int  # decode steps seen so far in this process (0-based)
    decode_bs: int  # decode rows in this batch (prefill rows excluded)
    running: int  # requests in the running batch
    waiting: int  # requests waiting for admission
    accept_length: float  # tokens per request per speculative step (incl. bonus), EMA; 0.0 if unknown
    accept_samples: int  # speculative steps behind accept_length
    previous: bool | None  # the decision of the previous decode step (None on the first)
    steps_in_mode: int  # consecutive decode steps in the previous decision's mode
    costs: Any = None  # sglang_dynspec.costs.CostView or None
    new_load: bool = False  # the batch grew by a burst of new requests since the previous decode step (not a refill)
    fresh_batch: bool = False  # every request in this batch was admitted since the previous decode step (it had drained)
    greedy: bool | None = None  # the sampling regime whose acceptance accept_length is (True: greedy; None: unknown)


@runtime_checkable
class Policy(Protocol):
    name: str

    def decide(self, inputs: StepInputs) -> bool:
        """True: run this decode step speculatively; False: plain decode + draft sync."""

    # Optional: ``explain() -> dict`` with the figures behind the last decision (JSON-safe
    # values); the controller shows them in the stats file, the metrics and the trace.


class PolicyArgs(BaseModel):
    """Base of each policy's argument model: unknown arguments are refused."""

    model_config = ConfigDict(extra="forbid", frozen=True)


def parse_args(model: type[PolicyArgs], args: dict[str, Any], policy: str) -> PolicyArgs:
    try:
        return model(**args)
    except ValidationError as e:
        lines = [
            ".".join(["policy_args", *(str(p) for p in err["loc"])])
            + f": {err['msg']} (got {err.get('input')!r})"
            for err in e.errors()
        ]
        raise ConfigError(f"invalid arguments for policy {policy!r}:\n  " + "\n  ".join(lines)) from None


def build_policy(spec: str, args: dict[str, Any]) -> Policy:
    """A registered name, or ``package.module:Class`` (called with the args dict)."""
    from ..plugins import get_policies

    if ":" in spec:
        mod_name, _, attr = spec.partition(":")
        try:
            factory = getattr(importlib.import_module(mod_name), attr)
        except (ImportError, AttributeError) as e:
            raise ConfigError(f"policy ({spec!r}): cannot import: {e}") from None
        name = spec
    else:
        policies = get_policies()
        if spec not in policies:
            raise ConfigError(f"policy ({spec!r}): unknown policy; registered: {', '.join(sorted(policies))}")
        factory, name = policies[spec].factory, spec
    try:
        policy = factory(dict(args))
    except ConfigError:
        raise
    except Exception as e:  # a third-party factory failing is a config problem of that policy
        raise ConfigError(f"policy ({name!r}): could not be created: {type(e).__name__}: {e}") from None
    if not callable(getattr(policy, "decide", None)):
        raise ConfigError(f"policy ({name!r}): object {policy!r} has no decide(inputs) method")
    if not getattr(policy, "name", None):
        try:
            policy.name = name
        except AttributeError:
            pass
    return policy
