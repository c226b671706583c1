"""Adapters: what "speculation off" means on each SGLang worker path.

One module per worker path (`spec_v2.py` for `EAGLEWorkerV2`, `v1.py` for `EAGLEWorker`); each
module satisfies :class:`Adapter`, which `sglang_dynspec.runtime` drives.  What an adapter keeps
per worker is one :class:`~sglang_dynspec.adapters.state.AdapterState` (``state.py``).  The guard
that keeps a plain decode batch away from verify-only CUDA graphs is shared by both paths and
lives in `runtime.around_graph_can_run`.
"""

from __future__ import annotations

from typing import Any, Protocol

from ..controller import StepMode


class Adapter(Protocol):
    """The contract of an adapter module (checked structurally; the modules are the implementations)."""

    def decode_batch_size(self, worker: Any, batch: Any) -> int | None:
        """Number of decode rows when ``batch`` (exactly what ``forward_batch_generation``
        received) is a decode batch that may run without speculation; ``None`` for extend / idle
        / mixed / anything the adapter cannot turn off.  Cheap: no GPU sync, no tensor reads."""

    def forward_off(self, worker: Any, batch: Any, mode: StepMode, *args: Any, **kwargs: Any) -> Any:
        """Run the step without speculation: plain one-token target decode + draft KV sync,
        returning the result object the installed release's scheduler expects.  ``mode`` is
        ``StepMode.OFF`` (light draft sync where prepared) or ``StepMode.RESUME`` (full draft
        sync); ``args``/``kwargs`` are the rest of ``forward_batch_generation``'s arguments
        (e.g. ``on_publish``)."""

    def forward_prefill_off(self, worker: Any, batch: Any, *args: Any, **kwargs: Any) -> Any | None:
        """Run an extend batch that arrives while speculation is off without the draft's extend
        forward (draft KV written directly; a resume step precedes speculation), returning the
        result the scheduler expects; ``None``, having run nothing, where it must run upstream."""

    def resume_pending(self, worker: Any) -> bool:
        """Whether the last off-step left the draft without outputs to draft from, so a step that
        would speculate must run as a ``StepMode.RESUME`` off-step first."""

    def runs_plain_batches(self, worker: Any) -> bool:
        """Whether this worker's off-steps run as plain decode batches (``plain_batch.py``): the
        runtime then decides before the scheduler prepares a step, converts the running batch, and
        hands plain batches to the adapter's ``forward_plain(worker, batch, future_map)``."""

    def prepare(self, worker: Any, settings: Any) -> None:
        """One-time setup before the worker serves (off-step graphs, light draft sync), following
        ``settings`` (the loaded ``DynspecSettings``)."""

    def describe(self, worker: Any = None) -> dict:
        """What the adapter supports on the installed SGLang (and, given a worker, what it set
        up for it): plain data for the CLI doctor, never raises."""
