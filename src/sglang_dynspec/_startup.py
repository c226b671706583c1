"""Startup hook for SGLang releases without a plugin framework (0.5.9 / 0.5.10).

Installed as ``sglang_dynspec_startup.pth`` at the root of site-packages, so it runs in every
interpreter, spawned scheduler processes included.  The .pth line imports this module only
when SGLANG_DYNSPEC_ENABLED or SGLANG_DYNSPEC_CONFIG is set; ``gate.wanted`` then decides, as
for the plugin entry point.  Nothing is validated or patched until SGLang imports the modules
that hold the hook targets.
"""

from __future__ import annotations

import importlib.abc
import importlib.util
import sys

_installed = False
_held = False  # set by hold(): SGLang may be imported here without activating


class _PatchAfterImport(importlib.abc.MetaPathFinder):
    """Lets the normal finders load a watched module, then runs ``on_loaded`` on it."""

    def __init__(self, watched: set[str], on_loaded):
        self.watched = watched
        self.on_loaded = on_loaded
        self._busy: set[str] = set()

    def find_spec(self, fullname, path=None, target=None):
        if fullname not in self.watched or fullname in self._busy:
            return None
        self._busy.add(fullname)
        try:
            spec = importlib.util.find_spec(fullname)
        finally:
            self._busy.discard(fullname)
        if spec is None or spec.loader is None:
            return None
        loader = spec.loader
        on_loaded = self.on_loaded

        class _Loader(importlib.abc.Loader):
            def create_module(self, spec):
                return loader.create_module(spec)

            def exec_module(self, module):
                loader.exec_module(module)
                on_loaded(module.__name__)

        spec.loader = _Loader()
        return spec


def install() -> None:
    """Arrange the wrapping for releases without HookRegistry; no-op where the entry point works."""
    global _installed
    if _installed:
        return
    _installed = True
    from . import gate

    if not gate.wanted():
        return
    from . import compat

    if compat.sglang_version() is None or compat.has_plugin_framework():
        return  # SGLang >= 0.5.11 loads the sglang.srt.plugins entry point itself
    from .activation import planned_hooks

    pending: dict[str, list] = {}
    for h in planned_hooks():
        module = h.target.rsplit(".", 2)[0]
        pending.setdefault(module, []).append(h)

    state = {"activated": False, "enabled": False}

    def on_loaded(name: str) -> None:
        if _held:
            return
        from . import activation

        if not state["activated"]:
            # Deferred to SGLang's own import, so that other Python programs run in this
            # environment are not stopped by a bad setting.  The same activate() as the
            # plugin entry point: validation, trace file and log level included.
            state["activated"] = True
            state["enabled"] = activation.activate(install_hooks=False)
        if state["enabled"]:
            for h in pending.pop(name, ()):
                activation.patch_checked(h)

    sys.meta_path.insert(0, _PatchAfterImport(set(pending), on_loaded))
    # Modules imported before this hook ran (rare: .pth files run first) are patched now.
    for name in list(pending):
        if name in sys.modules:
            on_loaded(name)


def hold() -> None:
    """Import SGLang in this process without activating (``sglang-dynspec doctor`` inspects it:
    a bad setting must end up in its report, not stop it)."""
    global _held
    _held = True
