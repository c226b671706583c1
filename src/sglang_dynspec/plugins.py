"""The one PluginManager.  Built-in policies register exactly like third-party plugins."""

from __future__ import annotations

import importlib
import threading
from dataclasses import dataclass
from typing import Any, Callable

import pluggy

from . import hookspecs
from .errors import ConfigError

ENTRY_POINT_GROUP = "sglang_dynspec"
BUILTIN_PLUGINS = ("sglang_dynspec.policies.builtin",)

pm = pluggy.PluginManager("sglang_dynspec")
pm.add_hookspecs(hookspecs)

_lock = threading.Lock()
_loaded = False


def load_plugins() -> None:
    """Register built-ins, then every ``sglang_dynspec`` entry point (once per process)."""
    global _loaded
    with _lock:
        if _loaded:
            return
        for name in BUILTIN_PLUGINS:
            mod = importlib.import_module(name)
            if not pm.is_registered(mod):
                pm.register(mod, name=name)
        try:
            pm.load_setuptools_entrypoints(ENTRY_POINT_GROUP)
        except Exception as e:
            raise ConfigError(f"plugins (entry-point group {ENTRY_POINT_GROUP!r}): one cannot be loaded: "
                              f"{type(e).__name__}: {e}") from e
        _loaded = True


@dataclass(frozen=True)
class PolicyInfo:
    name: str
    factory: Callable[[dict[str, Any]], Any]
    summary: str
    plugin: str


def get_policies() -> dict[str, PolicyInfo]:
    """All registered policies by name; a name registered twice is an error, not a silent override."""
    load_plugins()
    found: dict[str, PolicyInfo] = {}
    for impl in pm.hook.register_policies.get_hookimpls():
        plugin_name = impl.plugin_name

        def register(name: str, factory: Callable, summary: str = "", _plugin=plugin_name) -> None:
            if not isinstance(name, str) or not name or ":" in name:
                raise ValueError(f"plugin {_plugin}: invalid policy name {name!r}")
            if name in found:
                raise ValueError(
                    f"policy {name!r} registered twice: by {found[name].plugin} and by {_plugin}"
                )
            found[name] = PolicyInfo(name, factory, summary, _plugin)

        impl.function(register=register)
    return found
