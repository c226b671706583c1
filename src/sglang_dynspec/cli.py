"""``sglang-dynspec``: doctor, config, policies."""

from __future__ import annotations

import argparse
import json
import sys

from . import __version__


def _doctor(args) -> int:
    from . import compat
    from .config import load_settings
    from .errors import ConfigError

    v = compat.sglang_version()
    ok = True
    print(f"sglang-dynspec {__version__}")
    print(f"Python {sys.version.split()[0]}")
    print(f"SGLang: {v if v else 'not installed'}")
    problem = compat.support_problem(v)
    if problem:
        print(f"  UNSUPPORTED: {problem}")
        ok = False
    if v is not None:
        fw = compat.has_plugin_framework(v)
        print(f"  activation: {'plugin entry point (sglang.srt.plugins)' if fw else 'startup hook (.pth, no plugin framework)'}")
        if fw:
            try:
                from importlib.metadata import entry_points

                eps = [e for e in entry_points(group="sglang.srt.plugins") if e.value.startswith("sglang_dynspec")]
                print(f"  entry point: {'found: ' + eps[0].value if eps else 'MISSING (reinstall sglang-dynspec)'}")
                ok &= bool(eps)
            except Exception as e:  # pragma: no cover
                print(f"  entry point: error {e}")
        else:
            import site
            import os

            dirs = site.getsitepackages() + [site.getusersitepackages()]
            pth = [d for d in dirs if os.path.exists(os.path.join(d, "sglang_dynspec_startup.pth"))]
            print(f"  startup hook: {'found in ' + pth[0] if pth else 'MISSING (reinstall sglang-dynspec)'}")
            ok &= bool(pth)
        print(f"  worker paths: v1 EAGLEWorker {'present' if compat.has_v1_worker(v) else 'absent'}; "
              f"spec_v2 EAGLEWorkerV2 takes {'ScheduleBatch' if compat.v2_takes_schedule_batch(v) else 'ModelWorkerBatch'}")
    if v is not None and not problem:
        from .activation import planned_hooks

        print("hook targets:")
        for h in planned_hooks(v):
            try:
                compat.resolve(h.target)
                state = "resolves"
            except Exception as e:
                state = f"MISSING ({type(e).__name__}: {str(e).splitlines()[0][:120]})"
                ok = False
            print(f"  [{h.kind:6}] {h.target}: {state}")
        for path in ("v1", "spec_v2"):
            if path == "v1" and not compat.has_v1_worker(v):
                continue
            try:
                import importlib

                mod = importlib.import_module(f"sglang_dynspec.adapters.{path}")
                desc = mod.describe() if hasattr(mod, "describe") else {"forward_off": hasattr(mod, "forward_off")}
            except ImportError as e:
                desc = f"adapter not available ({e})"
            print(f"  adapter {path}: {desc}")
    try:
        loaded = load_settings()
        print("effective config:")
        for name, value, src in loaded.rows():
            print(f"  {name} = {value!r}  [{src}]")
    except ConfigError as e:
        print(f"config: INVALID\n  {e}")
        ok = False
    print("status:", "OK" if ok else "PROBLEMS FOUND")
    return 0 if ok else 1


def _config(args) -> int:
    from .config import load_settings
    from .errors import ConfigError

    try:
        loaded = load_settings()
    except ConfigError as e:
        print(e, file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps({n: {"value": str(v) if v is not None and not isinstance(v, (bool, int, float, dict, str)) else v,
                              "source": s} for n, v, s in loaded.rows()}, indent=2))
    else:
        width = max(len(n) for n, _, _ in loaded.rows())
        for name, value, src in loaded.rows():
            print(f"{name:<{width}}  {value!r:<30}  {src}")
    return 0


def _policies(args) -> int:
    from .plugins import get_policies

    for name, info in sorted(get_policies().items()):
        origin = "built-in" if info.plugin.startswith("sglang_dynspec.") else f"plugin {info.plugin}"
        print(f"{name:<12} {info.summary}  [{origin}]")
    return 0


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="sglang-dynspec", description=__doc__)
    p.add_argument("--version", action="version", version=__version__)
    sub = p.add_subparsers(dest="cmd", required=True)
    sub.add_parser("doctor", help="check the installed SGLang, hook targets and config").set_defaults(fn=_doctor)
    c = sub.add_parser("config", help="effective settings and where each came from")
    c.add_argument("--json", action="store_true")
    c.set_defaults(fn=_config)
    sub.add_parser("policies", help="registered policies, third-party ones included").set_defaults(fn=_policies)
    args = p.parse_args(argv)
    return args.fn(args)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
