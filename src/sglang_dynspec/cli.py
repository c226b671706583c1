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
        no_cuda = False
        for h in planned_hooks(v):
            try:
                compat.resolve(h.target)
                state = "resolves"
            except Exception as e:
                state = f"MISSING ({type(e).__name__}: {str(e).splitlines()[0][:120]})"
                ok = False
                if "sgl_kernel" in str(e) or "libcuda" in str(e):
                    no_cuda = True
            print(f"  [{h.kind:6}] {h.target}: {state}")
        if no_cuda:
            print("  note: SGLang's kernels (sgl_kernel) need the CUDA driver; on a machine without one its"
                  " workers cannot be imported, so these targets can only resolve on a GPU server")
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


def _replay(args) -> int:
    from .errors import ConfigError

    try:
        policy_args = None
        if args.policy_args:
            try:
                policy_args = json.loads(args.policy_args)
            except json.JSONDecodeError as e:
                raise ConfigError(f"--policy-args: not valid JSON: {e}") from None
            if not isinstance(policy_args, dict):
                raise ConfigError("--policy-args: must be a JSON object")
            if args.policy is None or len(args.policy) != 1:
                raise ConfigError("--policy-args: applies to exactly one --policy "
                                  f"(got {len(args.policy or [])}); replay the others separately")
        if args.check:
            return _replay_check(args)
        if args.profile:
            return _replay_profile(args, policy_args)
        return _replay_traces(args, policy_args)
    except ConfigError as e:
        print(e, file=sys.stderr)
        return 2


def _replay_traces(args, policy_args) -> int:
    from .config import DynspecSettings
    from .tracereplay import load_trace_set, report

    ts = load_trace_set(args.traces)
    default = DynspecSettings.model_fields["policy"].default
    policies = args.policy or [default]
    rows = report(ts, policies, policy_args)
    m = ts.meta
    print(f"trace set: {ts.name} ({ts.source}); SGLang {m.get('sglang_version')}, {m.get('gpu')}, "
          f"commit {str(m.get('git_commit'))[:7]}")
    if ts.incomplete:
        print(f"  left out (trace cut short): {', '.join(ts.incomplete)}")
    print("\noutput tok/s per level: each static mode as measured and as replayed from its own trace;"
          "\neach policy as projected on the two traces (x = ÷ the better replayed static mode,"
          " on = share of decode steps speculating, sw = mode switches)")
    names = [f"dynspec:{p}" for p in policies]
    print(f"{'C':>5} {'off measured':>13} {'replayed':>9} {'on measured':>12} {'replayed':>9} "
          + " ".join(f"{n:>30}" for n in names))
    for c, row in rows.items():
        cells = []
        for n in names:
            r = row.get(n)
            cells.append("-" if r is None else
                         f"{r['projected']:8.0f} ({r['ratio_to_best_static']:4.2f}x) on={r['share_on']:4.0%} sw={r['switches']}")
        off, on = row.get("off"), row.get("on")
        print(f"{c:>5} {off['measured']:13.0f} {off['replayed']:9.0f} {on['measured']:12.0f} {on['replayed']:9.0f} "
              + " ".join(f"{x:>30}" for x in cells))
    errs = [abs(row[m]["error"]) for row in rows.values() for m in ("on", "off") if m in row]
    print(f"\nstatic modes replayed: max |error| {max(errs):.1%} over {len(errs)} levels")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"trace_set": ts.name, "source": ts.source, "levels": rows}, f, indent=1)
        print(f"wrote {args.json}")
    if args.png:
        from .tracereplay import draw

        draw(rows, names, args.png, title=f"{ts.name}: replay vs measurement")
        print(f"wrote {args.png}")
    return 0


def _replay_check(args) -> int:
    from .replay import check_against, profile_from_sweep

    result = json.loads(open(args.check).read())
    prof = profile_from_sweep(result)
    mapping = {"off": "plain", "on": "spec", "dynspec:never": "never"}
    mapping.update({m: m.split(":", 1)[1].split("@")[0] for m in result["modes"]
                    if m.startswith("dynspec:") and "@" not in m and "(" not in m})
    rows = check_against(result, prof, mapping, output_len=args.output_len)
    print(f"projection vs measured: {args.check}")
    print(f"{'mode':<18} {'C':>5} {'measured':>10} {'projected':>10} {'error':>8}")
    for r in rows:
        print(f"{r['mode']:<18} {r['C']:>5} {r['measured']:>10.1f} {r['projected']:>10.1f} {r['error']:>+8.1%}")
    errs = [abs(r["error"]) for r in rows if r["error"] is not None]
    print(f"mean |error| {sum(errs) / len(errs):.1%}, max {max(errs):.1%} over {len(errs)} points")
    return 0


def _replay_profile(args, policy_args) -> int:
    from .errors import ConfigError
    from .replay import Phase, compare, load_profile, phase_trace

    prof = load_profile(args.profile)
    if args.offstep_factor is not None:
        if args.offstep_factor < 1.0:
            raise ConfigError(f"--offstep-factor: must be >= 1.0, got {args.offstep_factor}")
        prof.points["offstep"] = [(b, t * args.offstep_factor) for b, t in prof.points["plain"]]
    policies = args.policy or ["goodput", "threshold"]
    print(f"profile: {prof.name} (accept length {prof.accept_length:g})"
          + (f", off-step = {args.offstep_factor:g} x plain decode" if args.offstep_factor else ""))
    if prof.source:
        print(f"  source: {prof.source}")
    print(f"\nclosed loop, {args.seconds:g} s per level, prefills not modelled; output tok/s "
          "(x = ÷ the better static mode, sw = mode switches)")
    names = ["off", "on"] + [f"dynspec:{p}" for p in policies]
    print(f"{'C':>5} " + " ".join(f"{n:>22}" for n in names))
    for c in args.concurrency:
        runs = compare(prof, policies, [Phase(c, args.seconds)], policy_args, args.output_len)
        best = max(runs[0].tok_per_s, runs[1].tok_per_s)
        cells = [f"{r.tok_per_s:10.0f} ({r.tok_per_s / best:4.2f}x) sw={r.switches:<3}" for r in runs]
        print(f"{c:>5} " + " ".join(f"{x:>22}" for x in cells))
    phases = phase_trace(args.low, args.high, args.phase_seconds, args.cycles)
    runs = compare(prof, policies, phases, policy_args, args.output_len)
    print(f"\nphase trace: C alternating {args.low} / {args.high}, {args.phase_seconds:g} s each, "
          f"{args.cycles} cycles")
    best = max(runs[0].tok_per_s, runs[1].tok_per_s)
    for name, r in zip(names, runs):
        share = r.steps_on / max(r.steps_on + r.steps_off, 1)
        print(f"  {name:<22} {r.tok_per_s:9.0f} tok/s ({r.tok_per_s / best:4.2f}x best static)  "
              f"speculating {share:5.1%} of steps, {r.switches} switches")
    return 0


def _positive_ints(text: str) -> list[int]:
    try:
        vals = [int(x) for x in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None
    if any(v < 1 for v in vals):
        raise argparse.ArgumentTypeError(f"concurrency levels must be >= 1, got {text!r}")
    return vals


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="sglang-dynspec", description=__doc__)
    p.add_argument("--version", action="version", version=__version__)
    sub = p.add_subparsers(dest="cmd", required=True)
    sub.add_parser("doctor", help="check the installed SGLang, hook targets and config").set_defaults(fn=_doctor)
    c = sub.add_parser("config", help="effective settings and where each came from")
    c.add_argument("--json", action="store_true")
    c.set_defaults(fn=_config)
    sub.add_parser("policies", help="registered policies, third-party ones included").set_defaults(fn=_policies)
    r = sub.add_parser(
        "replay", help="project policies on step costs measured on a GPU (CPU only)",
        description="By default: replay decision traces recorded on an H200 (each static mode from its own trace, "
                    "each policy on both), the policy design loop. --profile: the older closed-loop model on "
                    "step-time profiles (no prefills). --check: project a measured sweep from its own costs.")
    r.add_argument("--traces", default="h200-pair-0512",
                   help="trace set: built-in name (h200-pair-0512) or a file from "
                        "`python -m benchmarks.dynspec_bench.traceset` (default: %(default)s)")
    r.add_argument("--policy", action="append",
                   help="policy to project (repeatable; default: the default policy; --profile: goodput, threshold)")
    r.add_argument("--policy-args", help="JSON object of arguments for a single --policy")
    r.add_argument("--json", metavar="PATH", help="also write the per-level figures as JSON")
    r.add_argument("--png", metavar="PATH", help="also draw projection and measurement side by side (needs matplotlib)")
    r.add_argument("--profile", help="instead: a step-time profile, built-in (h200-trained-pair, h200-pair-0512, "
                                     "h200-dummy-0512) or a profile JSON path")
    r.add_argument("-C", "--concurrency", type=_positive_ints, default=[1, 2, 4, 8, 16, 32, 64],
                   help="--profile: closed-loop levels, comma-separated (default: %(default)s)")
    r.add_argument("--seconds", type=float, default=10.0, help="--profile: simulated seconds per level")
    r.add_argument("--low", type=int, default=2, help="--profile phase trace: concurrency of the low phases")
    r.add_argument("--high", type=int, default=64, help="--profile phase trace: concurrency of the high phases")
    r.add_argument("--phase-seconds", type=float, default=5.0, help="--profile phase trace: seconds per phase")
    r.add_argument("--cycles", type=int, default=3, help="--profile phase trace: low/high cycles")
    r.add_argument("--output-len", type=int, default=128, help="--profile / --check: tokens per request")
    r.add_argument("--offstep-factor", type=float,
                   help="--profile what-if: off-step time = this x plain decode (instead of the measured off-step)")
    r.add_argument("--check", metavar="SWEEP_JSON",
                   help="instead: project a measured harness sweep from its own costs and report the error")
    r.set_defaults(fn=_replay)
    args = p.parse_args(argv)
    return args.fn(args)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
