"""The pluggy hooks of sglang-dynspec: policies and observers.

Third-party packages implement these in a module listed under the entry-point group
``sglang_dynspec``; the built-in policies use the very same hook.
"""

import pluggy

hookspec = pluggy.HookspecMarker("sglang_dynspec")
hookimpl = pluggy.HookimplMarker("sglang_dynspec")


@hookspec
def register_policies(register):
    """Add policies: call ``register(name, factory, summary)``; ``factory(args: dict)`` returns a Policy."""


@hookspec
def dynspec_decision(record):
    """Observe one decode step's decision (a :class:`~sglang_dynspec.controller.StepRecord`)."""


@hookspec
def dynspec_switch(record):
    """Observe a change of mode (the StepRecord of the first step in the new mode)."""


@hookspec
def dynspec_policy_failed(policy_name, reason):
    """Observe a policy being replaced by the safe mode (after it raised, hung or returned junk)."""
