"""What an adapter keeps per worker: one typed object, stored on the worker itself.

Written by the adapter's ``prepare`` (off-step graphs, light draft sync) and read by its
``forward_off`` / ``resume_pending`` / ``describe``.  The worker's own ``__dict__`` holds it
(one EAGLE worker per scheduler process; no class-level lookup is involved).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, TypeVar

from .draft_kv import LightSync

_ATTR = "_dynspec_adapter_state"


@dataclass
class AdapterState:
    prepared: bool = False  # prepare() ran (a failing capture is not retried)
    graphs: dict | None = None  # the off-step DECODE graphs (offstep_graphs.prepare), else eager
    light: LightSync | None = None  # the light draft sync, where the setting and the draft allow
    light_pending: bool = False  # the last off-step used the light sync: a resume step comes next
    logged_first_off: bool = False


S = TypeVar("S", bound=AdapterState)


def of(worker: Any, kind: type[S] = AdapterState) -> S:
    """The worker's adapter state, created (as a ``kind``) on first use."""
    st = vars(worker).get(_ATTR)
    if st is None:
        st = kind()
        vars(worker)[_ATTR] = st
    return st


def peek(worker: Any) -> AdapterState | None:
    """The worker's adapter state if it has one (never creates it)."""
    return vars(worker).get(_ATTR)


def resume_pending(worker: Any) -> bool:
    """Whether the worker's last off-step used the light sync, so the next step must be a resume
    step (both adapters' ``resume_pending``)."""
    st = peek(worker)
    return bool(st and st.light_pending)
