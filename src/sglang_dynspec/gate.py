"""Whether sglang-dynspec is on: the one boolean parser and the one activation gate.

The startup hook (.pth), the plugin entry point, the settings model and the CLI all use these,
so what ``sglang-dynspec config`` calls enabled is what server start enables.  Standard library
only: on the disabled path this module is all that gets imported.
"""

from __future__ import annotations

import os
from typing import Mapping

ENABLED_VAR = "SGLANG_DYNSPEC_ENABLED"
CONFIG_VAR = "SGLANG_DYNSPEC_CONFIG"

TRUE = frozenset({"1", "true", "t", "yes", "y", "on"})
FALSE = frozenset({"0", "false", "f", "no", "n", "off"})
SPELLINGS = "1/true/t/yes/y/on or 0/false/f/no/n/off"


def parse_bool(raw: str) -> bool | None:
    """True / False for an accepted spelling (any case, surrounding blanks ignored), else None."""
    s = raw.strip().lower()
    if s in TRUE:
        return True
    if s in FALSE:
        return False
    return None


def wanted(environ: Mapping[str, str] | None = None) -> bool:
    """Whether activation must run and read the settings.

    True when SGLANG_DYNSPEC_ENABLED is on, and also when it holds a spelling nobody accepts, so
    that activation refuses it by name instead of the server running without the plugin.  Unset,
    a config file (SGLANG_DYNSPEC_CONFIG) may still enable it.
    """
    env = os.environ if environ is None else environ
    raw = env.get(ENABLED_VAR)
    if raw is not None:
        return parse_bool(raw) is not False
    return bool(env.get(CONFIG_VAR))


def why(environ: Mapping[str, str] | None = None) -> str:
    """What ``wanted`` decided from, for the CLI."""
    env = os.environ if environ is None else environ
    raw = env.get(ENABLED_VAR)
    if raw is not None:
        v = parse_bool(raw)
        state = "on" if v else "off" if v is False else "not a boolean"
        return f"{ENABLED_VAR}={raw!r} ({state})"
    if env.get(CONFIG_VAR):
        return f"{ENABLED_VAR} unset, {CONFIG_VAR} set (the file's `enabled` decides)"
    return f"{ENABLED_VAR} and {CONFIG_VAR} unset"
