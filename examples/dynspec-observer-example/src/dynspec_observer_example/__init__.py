"""An observer-only sglang-dynspec plugin: told when a policy is replaced by the safe mode."""

import logging

from sglang_dynspec.hookspecs import hookimpl

logger = logging.getLogger("dynspec_observer_example")

# (policy name, reason) of every failure seen in this process; where an alert would be sent.
FAILURES = []


@hookimpl
def dynspec_policy_failed(policy_name, reason):
    FAILURES.append((policy_name, reason))
    logger.error("policy %s failed: %s", policy_name, reason)
