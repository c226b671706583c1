"""Named profiler ranges around the off-step's stages (``dynspec.offstep.*``), so a torch profiler
trace (SGLang's ``/start_profile``) shows where an off-step's time goes; free otherwise."""

from __future__ import annotations

import contextlib

_NULL = contextlib.nullcontext()


def span(name: str):
    """A profiler range while a torch profiler records; otherwise a shared no-op context."""
    import torch

    if torch.autograd._profiler_enabled():
        return torch.profiler.record_function(name)
    return _NULL
