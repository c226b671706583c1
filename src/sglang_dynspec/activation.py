"""Putting the wrappers in place, through SGLang's HookRegistry or (0.5.9/0.5.10) by hand.

SGLang logs and swallows hook errors, so after applying, every wrapper is checked and a
missing one stops the process with one clear error (ActivationError is a SystemExit).
"""

from __future__ import annotations

import functools
import logging
from dataclasses import dataclass
from typing import Callable

from . import compat, runtime
from .config import LoadedSettings, validate
from .errors import ActivationError, ConfigError

logger = logging.getLogger("sglang_dynspec")


@dataclass(frozen=True)
class Hook:
    target: str
    kind: str  # "around" | "after"
    fn: Callable
    why: str


def planned_hooks(version=None) -> list[Hook]:
    """The hooks for the installed (or given) release."""
    hooks = [
        Hook(compat.INIT_MODEL_WORKER, "after", runtime.after_init_model_worker, "find the EAGLE worker"),
        Hook(compat.result_decode_target(version), "after", runtime.after_process_decode, "acceptance stats"),
        Hook(compat.V2_FORWARD, "around", runtime.around_v2_forward, "decide per decode batch (spec_v2)"),
        Hook(compat.HANDLE_GENERATE, "after", runtime.after_handle_generate, "per-request opt-out"),
        Hook(compat.graph_guard_target(version), "around", runtime.around_graph_can_run,
             "no verify-graph replay for an off-step decode"),
    ]
    prefill_graph = compat.prefill_graph_target(version)
    if prefill_graph is not None:
        hooks.append(Hook(prefill_graph, "around", runtime.around_prefill_graph_can_run,
                          "replay the target's prefill graph for EAGLE prefills"))
    if compat.plain_batch_release_problem(version) is None:
        hooks.append(Hook(compat.CHECK_DECODE_MEM, "around", runtime.around_check_decode_mem,
                          "decide a running batch's step and move it to that mode's path (plain off-steps)"))
        hooks.append(Hook(compat.future_store_target(version), "around", runtime.around_future_store,
                          "keep a plain off-step's tokens in the speculative FutureMap"))
    if compat.has_v1_worker(version):
        hooks.append(Hook(compat.V1_FORWARD, "around", runtime.around_v1_forward, "decide per decode batch (v1)"))
    return hooks


def is_wrapped_by(value, fn: Callable) -> bool:
    """Whether ``fn`` sits in the ``__wrapped__`` chain of ``value`` (as hook or wrapper)."""
    seen = 0
    w = getattr(value, "__func__", value)
    while w is not None and seen < 64:
        if w is fn:
            return True
        for cell in getattr(w, "__closure__", None) or ():
            try:
                if cell.cell_contents is fn:
                    return True
            except ValueError:  # empty cell
                pass
        w = getattr(w, "__wrapped__", None)
        seen += 1
    return False


def verify(hooks: list[Hook]) -> list[str]:
    """Problems with the applied hooks (empty when all are in place)."""
    problems = []
    for h in hooks:
        try:
            _, _, value = compat.resolve(h.target)
        except Exception as e:
            problems.append(f"{h.target}: cannot resolve ({type(e).__name__}: {e})")
            continue
        if not is_wrapped_by(value, h.fn):
            problems.append(f"{h.target}: wrapper not in place ({h.why})")
    return problems


def _around(original, hook):
    @functools.wraps(original)
    def wrapper(*args, **kwargs):
        return hook(original, *args, **kwargs)

    wrapper.__wrapped__ = original
    return wrapper


def _after(original, hook):
    @functools.wraps(original)
    def wrapper(*args, **kwargs):
        result = original(*args, **kwargs)
        new = hook(result, *args, **kwargs)
        return result if new is None else new

    wrapper.__wrapped__ = original
    return wrapper


def patch_directly(hook: Hook, owner=None) -> None:
    """Wrap one method by hand (releases without HookRegistry); same semantics as AROUND/AFTER."""
    obj_path, attr = hook.target.rsplit(".", 1)
    if owner is None:
        owner, attr, _ = compat.resolve(hook.target)
    raw = owner.__dict__.get(attr)
    if raw is None:
        raise AttributeError(f"{hook.target} is not defined on {owner!r}")
    if is_wrapped_by(getattr(owner, attr), hook.fn):
        return
    kind = staticmethod if isinstance(raw, staticmethod) else classmethod if isinstance(raw, classmethod) else None
    fn = raw.__func__ if kind else raw
    wrapped = (_around if hook.kind == "around" else _after)(fn, hook.fn)
    setattr(owner, attr, kind(wrapped) if kind else wrapped)


def install_with_registry(hooks: list[Hook]) -> None:
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    types = {"around": HookType.AROUND, "after": HookType.AFTER}
    for h in hooks:
        HookRegistry.register(h.target, h.fn, types[h.kind])
    # load_plugins() applies after all plugins ran; applying now (idempotent) lets us check.
    HookRegistry.apply_hooks()


def activate(environ=None, *, install_hooks: bool = True) -> bool:
    """Validate, configure the runtime and put every hook in place; False when disabled.

    Both routes come here: the plugin entry point (SGLang >= 0.5.11) and the startup hook of
    0.5.9 / 0.5.10, which passes ``install_hooks=False`` because it wraps each target itself
    (``patch_checked``) as SGLang imports its module.  Any problem stops the process with one
    clear error (ActivationError).
    """
    try:
        loaded = validate(environ)
    except ConfigError as e:
        raise ActivationError(str(e)) from None
    settings = loaded.settings
    if not settings.enabled:
        return False
    problem = compat.support_problem()
    if problem:
        raise ActivationError(f"{problem}. Unset SGLANG_DYNSPEC_ENABLED to run without dynspec.")
    configure(loaded)
    hooks = planned_hooks()
    if not install_hooks:
        logger.info("sglang-dynspec: active (policy %s); %d hooks wrap as SGLang imports them",
                    settings.policy, len(hooks))
        return True
    if compat.has_plugin_framework():
        install_with_registry(hooks)
    else:
        for h in hooks:
            patch_checked(h)
    problems = verify(hooks)
    if problems:
        raise ActivationError("hook targets missing on SGLang "
                              f"{compat.sglang_version()}:\n  " + "\n  ".join(problems))
    logger.info("sglang-dynspec: %d hooks in place (policy %s)", len(hooks), settings.policy)
    return True


def configure(loaded: LoadedSettings) -> None:
    """Hand validated settings and their policy to the runtime: log level, decision trace."""
    settings = loaded.settings
    logging.getLogger("sglang_dynspec").setLevel(settings.log_level)
    runtime.SETTINGS = settings
    runtime.POLICY = loaded.policy
    if settings.trace_file is not None:
        from .metrics import TraceObserver
        from .plugins import pm

        if pm.get_plugin("dynspec-trace") is None:
            pm.register(TraceObserver(settings.trace_file, int(settings.trace_max_mb * 1e6)), name="dynspec-trace")


def patch_checked(hook: Hook) -> None:
    """Wrap one target by hand (no HookRegistry) or stop the process."""
    try:
        patch_directly(hook)
    except Exception as e:
        raise ActivationError(f"cannot wrap {hook.target}: {type(e).__name__}: {e}") from None
    problems = verify([hook])
    if problems:
        raise ActivationError("hook target missing on SGLang "
                              f"{compat.sglang_version()}:\n  " + "\n  ".join(problems))
