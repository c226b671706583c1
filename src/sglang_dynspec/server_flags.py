"""``--dynspec-*`` server flags (SGLang >= 0.5.11), generated from the settings model.

Flags are exported as SGLANG_DYNSPEC_* variables, so they go through the same validation
as the environment and reach every spawned scheduler process.
"""

from __future__ import annotations

import argparse
import json
import os

_registered = False


def flag_name(field: str) -> str:
    return "--dynspec-" + field.replace("_", "-")


def dest_name(field: str) -> str:
    return "dynspec_" + field


def add_flags(parser: argparse.ArgumentParser) -> None:
    from .config import FIELDS, DynspecSettings, env_name

    group = parser.add_argument_group("sglang-dynspec", "Dynamic speculative decoding (sglang-dynspec plugin)")
    for field in FIELDS:
        info = DynspecSettings.model_fields[field]
        kw = dict(dest=dest_name(field), default=None, help=f"{info.description.replace('`', '')} (env {env_name(field)})")
        if info.annotation is bool:
            kw.update(nargs="?", const="true", metavar="BOOL")
        group.add_argument(flag_name(field), **kw)


def export_flags(args: argparse.Namespace, environ=None) -> dict[str, str]:
    """Copy given --dynspec-* values into the environment; returns what was set."""
    from .config import FIELDS, env_name

    environ = os.environ if environ is None else environ
    set_: dict[str, str] = {}
    for field in FIELDS:
        value = getattr(args, dest_name(field), None)
        if value is None:
            continue
        if not isinstance(value, str):
            value = json.dumps(value)
        environ[env_name(field)] = value
        set_[field] = value
    return set_


def _after_add_cli_args(result, parser, *args, **kwargs):
    add_flags(parser)
    return None


def _around_from_cli_args(original, cls, args, *rest, **kwargs):
    from . import gate
    from .config import validate
    from .errors import ActivationError, ConfigError

    given = export_flags(args)
    settings = None
    if given or gate.wanted():
        try:
            # raised in the launcher, before anything is served
            settings = validate().settings
        except ConfigError as e:
            raise ActivationError(str(e).replace(" (env ", " (flag/env ")) from None
    server_args = original(cls, args, *rest, **kwargs)
    if settings is not None and settings.enabled:
        from .compat import server_args_problems

        problems = server_args_problems(server_args)
        if problems:
            raise ActivationError("incompatible server flags:\n  " + "\n  ".join(problems))
    return server_args


def register_flags() -> None:
    global _registered
    if _registered:
        return
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    from . import compat

    HookRegistry.register(compat.SERVER_ARGS_ADD_CLI, _after_add_cli_args, HookType.AFTER)
    HookRegistry.register(compat.SERVER_ARGS_FROM_CLI, _around_from_cli_args, HookType.AROUND)
    _registered = True
