"""sglang-dynspec: check an installation (doctor), show the settings (config), list the
policies, and replay policies on recorded step costs (CPU only)."""

from __future__ import annotations

import argparse
import json
import sys

from . import __version__


def _kernel_note(errors: list[BaseException], v) -> str | None:
    """Why SGLang's workers cannot be imported here, when its kernel package is the cause."""
    for e in errors:
        if isinstance(e, ModuleNotFoundError) and (e.name or "").split(".")[0] == "sgl_kernel":
            req = _sglang_requirement("sgl-kernel", "sglang-kernel")
            return (f"SGLang's kernel package (sgl_kernel{', ' + req if req else ''}) is not installed; "
                    f"`pip install sglang=={v}` with its dependencies brings it (it then needs a CUDA driver)")
        if "libcuda" in str(e):
            return ("sgl_kernel is installed but needs the CUDA driver (libcuda.so.1), absent here: "
                    "these targets can only resolve on a GPU server")
    return None


def _sglang_requirement(*names: str) -> str | None:
    from importlib.metadata import PackageNotFoundError, requires

    try:
        reqs = requires("sglang") or []
    except PackageNotFoundError:
        return None
    for r in reqs:
        if r.split(";")[0].strip().lower().startswith(names) and "extra" not in r:
            return r.split(";")[0].strip()
    return None


class _Captured:
    """Collects what importing SGLang prints (warnings, log lines, C-level output), so that
    doctor's report stays readable; ``--verbose`` shows it."""

    def __init__(self):
        self.lines: list[str] = []

    def __enter__(self):
        import io
        import os
        import tempfile
        import warnings

        sys.stdout.flush()
        sys.stderr.flush()
        self._warn = warnings.catch_warnings(record=True)
        self._records = self._warn.__enter__()
        warnings.simplefilter("always")
        self._py = io.StringIO()
        self._saved_py = sys.stdout, sys.stderr
        sys.stdout = sys.stderr = self._py
        self._tmp = tempfile.TemporaryFile(mode="w+b")
        self._saved_fd = []
        for fd in (1, 2):
            try:
                self._saved_fd.append((fd, os.dup(fd)))
                os.dup2(self._tmp.fileno(), fd)
            except OSError:  # no such descriptor (embedded interpreters)
                pass
        return self

    def __exit__(self, *exc):
        import os

        for fd, saved in self._saved_fd:
            os.dup2(saved, fd)
            os.close(saved)
        sys.stdout, sys.stderr = self._saved_py
        self._warn.__exit__(*exc)
        self._tmp.seek(0)
        text = self._tmp.read().decode(errors="replace") + self._py.getvalue()
        self._tmp.close()
        self.lines = [f"{w.category.__name__}: {w.message} ({w.filename}:{w.lineno})" for w in self._records]
        self.lines += [line for line in text.splitlines() if line.strip()]
        return False


def _describe_adapter(path: str, verbose: bool) -> str:
    import importlib

    try:
        desc = importlib.import_module(f"sglang_dynspec.adapters.{path}").describe()
    except ImportError as e:
        return f"not available ({e})"
    if verbose:
        return repr(desc)
    problem = desc.get("reason") or desc.get("error")
    if problem or desc.get("available") is False:
        return f"not available ({problem})"
    if path == "spec_v2":
        graphs = desc.get("offstep_graphs")
        return (f"ready: input {desc.get('input')}, topk > 1 {'yes' if desc.get('topk_gt_1') else 'no (v1 worker)'}, "
                f"off-step graphs {'yes' if str(graphs).startswith('capture') else 'no: ' + str(graphs)}, "
                f"off-step batches {str(desc.get('offstep_batch')).split(' ', 1)[0]}")
    return f"ready: draft-extend layout {desc.get('draft_extend_layout')}"


def _support_matrix() -> list[dict]:
    """The README's support matrix, packaged with the wheel (benchmarks/support_matrix.py)."""
    from importlib.resources import files

    return json.loads(files("sglang_dynspec.data").joinpath("support-matrix.json").read_text())


def _matrix_rows(v) -> list[str]:
    """The support-matrix rows of the installed release."""
    rows = _support_matrix()
    tested = sorted({r["sglang"] for r in rows}, key=lambda x: tuple(int(p) for p in x.split(".")))
    mine = [r for r in rows if r["sglang"] == v.base_version]
    if not mine:
        return [f"tested: SGLang {v.base_version} is not a row of the support matrix "
                f"(releases tested: {', '.join(tested)})"]
    return [f"tested: {r['path']} topk {r['topk']}: CPU {r['cpu']}, GPU (H200) "
            f"{'yes (' + ', '.join(r['gpu']) + ')' if r['gpu'] else 'no'}" for r in mine]


def _server_start(loaded) -> str:
    from . import gate

    if not gate.wanted():
        return f"server start: plugin off ({gate.why()})"
    s = loaded.settings
    if not s.enabled:
        return f"server start: plugin off (enabled = False, {loaded.sources['enabled']})"
    return f"server start: plugin on, policy {s.policy!r} ({gate.why()})"


def _doctor(args) -> int:
    import os
    import site

    from . import _startup, compat
    from .config import validate
    from .errors import ConfigError

    # This process only inspects SGLang: a bad setting goes into the report instead of the
    # startup hook (0.5.9 / 0.5.10) stopping the process when SGLang is imported.
    _startup.hold()
    problems: list[str] = []
    v = compat.sglang_version()
    print(f"sglang-dynspec {__version__} (Python {sys.version.split()[0]})")
    supported = f"{compat.MIN_SUPPORTED} to {compat.MAX_SUPPORTED}"
    if v is None:
        gpu = sorted({r["sglang"] for r in _support_matrix() if r["gpu"]})
        print(f"SGLang: not installed; install a supported release ({supported}) beside sglang-dynspec, "
              f"e.g. pip install 'sglang=={gpu[-1] if gpu else compat.MAX_SUPPORTED}'"
              + (f" (GPU-tested: {', '.join(gpu)})" if gpu else ""))
        problems.append("SGLang is not installed")
    else:
        problem = compat.support_problem(v)
        print(f"SGLang: {v}" + (f" (UNSUPPORTED: {problem})" if problem else f" (supported: {supported})"))
        if problem:
            problems.append(problem)
        if compat.has_plugin_framework(v):
            from importlib.metadata import entry_points

            eps = [e for e in entry_points(group="sglang.srt.plugins") if e.value.startswith("sglang_dynspec")]
            print(f"  activation: plugin entry point (sglang.srt.plugins): "
                  f"{'found: ' + eps[0].value if eps else 'MISSING'}")
            if not eps:
                problems.append("the sglang.srt.plugins entry point is missing: reinstall sglang-dynspec")
        else:
            dirs = site.getsitepackages() + [site.getusersitepackages()]
            pth = [d for d in dirs if os.path.exists(os.path.join(d, "sglang_dynspec_startup.pth"))]
            print(f"  activation: startup hook (.pth, no plugin framework): {'found in ' + pth[0] if pth else 'MISSING'}")
            if not pth:
                problems.append("the startup hook sglang_dynspec_startup.pth is missing: reinstall sglang-dynspec")
        print(f"  worker paths: v1 EAGLEWorker {'present' if compat.has_v1_worker(v) else 'absent'}; "
              f"spec_v2 EAGLEWorkerV2 takes {'ScheduleBatch' if compat.v2_takes_schedule_batch(v) else 'ModelWorkerBatch'}")
        for line in _matrix_rows(v):
            print(f"  {line}")
    if v is not None and not compat.support_problem(v):
        from .activation import planned_hooks

        print("hook targets:")
        errors: list[BaseException] = []
        with _Captured() as cap:
            states = []
            for h in planned_hooks(v):
                try:
                    compat.resolve(h.target)
                    states.append((h, "resolves"))
                except Exception as e:
                    errors.append(e)
                    states.append((h, f"MISSING ({type(e).__name__}: {str(e).splitlines()[0][:120]})"))
            paths = [p for p in ("v1", "spec_v2") if p != "v1" or compat.has_v1_worker(v)]
            adapters = [(p, _describe_adapter(p, args.verbose)) for p in paths]
        for h, state in states:
            print(f"  [{h.kind:6}] {h.target}: {state}")
        if errors:
            problems.append(f"{len(errors)} hook target(s) do not resolve")
            note = _kernel_note(errors, v)
            if note:
                print(f"  note: {note}")
        print("adapters:")
        for p, desc in adapters:
            print(f"  {p}: {desc}")
        if cap.lines:
            if args.verbose:
                print("output of SGLang's import:")
                for line in cap.lines:
                    print(f"  {line}")
            else:
                print(f"(SGLang's import printed {len(cap.lines)} warning/log lines, not shown: --verbose shows them)")
    loaded = None
    try:
        loaded = validate()
    except ConfigError as e:
        print("config: INVALID (server start refuses it)")
        print("  " + str(e).replace("\n", "\n  "))
        problems.append("invalid settings")
    if loaded is not None:
        print("effective config:")
        for name, value, src in loaded.rows():
            print(f"  {name} = {value!r}  [{src}]")
        print(_server_start(loaded))
    if problems:
        print(f"status: PROBLEMS FOUND ({'; '.join(problems)})")
        return 1
    print("status: OK")
    return 0


def _config(args) -> int:
    from .config import validate
    from .errors import ConfigError

    try:
        loaded = validate()
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
        print(_server_start(loaded))
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
        if args.server_trace:
            return _replay_server_trace(args, policy_args)
        for flag, value in (("--follow-recorded", args.follow_recorded), ("--verify-rows", args.verify_rows)):
            if value:
                raise ConfigError(f"{flag}: only applies with --server-trace")
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


def _replay_server_trace(args, policy_args) -> int:
    from statistics import median

    from .config import DynspecSettings
    from .tracereplay import load_server_trace, redrive

    if args.policy is not None and len(args.policy) != 1:
        from .errors import ConfigError

        raise ConfigError(f"--server-trace: re-drives one --policy at a time (got {len(args.policy)})")
    policy = args.policy[0] if args.policy else DynspecSettings.model_fields["policy"].default
    rows = load_server_trace(args.server_trace)
    if args.verify_rows is None and "vr" not in rows[0]:
        from .errors import ConfigError

        raise ConfigError(f"--server-trace ({args.server_trace}): the trace does not record the server's "
                          "speculative_num_draft_tokens (written before it did): give --verify-rows")
    res = redrive(rows, policy, policy_args, args.verify_rows, follow=args.follow_recorded)
    print(f"server trace {args.server_trace}: {len(res.steps)} decode steps re-driven with policy {policy!r}; "
          f"acceptance {'as the controller received it' if res.exact_acceptance else 'inferred (older trace)'}")
    if args.follow_recorded:
        print("the recorded decisions applied (--follow-recorded): costs and estimates are the server's; "
              "'re-driven' is what the policy answered at each step")
    print(f"decisions equal to the recorded ones: {res.agreement:.2%}")
    print(f"\n{'run':>4} {'steps':>6} {'bs p50':>7} {'on: recorded':>13} {'re-driven':>10} "
          f"{'switches: recorded':>19} {'re-driven':>10} {'est. tok/s on / off (last)':>27}  re-driven why")
    runs = []
    for n, run in enumerate(res.runs(), 1):
        sw = lambda key: sum(getattr(a, key) != getattr(b, key) for a, b in zip(run, run[1:]))  # noqa: E731
        why: dict[str, int] = {}
        for s in run:
            why[s.why] = why.get(s.why, 0) + 1
        last = run[-1].estimates
        row = {"steps": len(run), "bs_p50": median(s.bs for s in run),
               "on_recorded": sum(s.recorded for s in run), "on_redriven": sum(s.decided for s in run),
               "switches_recorded": sw("recorded"), "switches_redriven": sw("decided"), "why": why,
               "estimates_last": {k: last.get(k) for k in ("on_tok_s", "off_tok_s")}}
        runs.append(row)
        est = f"{last.get('on_tok_s') or '-'} / {last.get('off_tok_s') or '-'}"
        print(f"{n:>4} {row['steps']:>6} {row['bs_p50']:>7g} {row['on_recorded']:>13} {row['on_redriven']:>10} "
              f"{row['switches_recorded']:>19} {row['switches_redriven']:>10} {est:>27}  "
              + ", ".join(f"{k} {v}" for k, v in sorted(why.items(), key=lambda kv: -kv[1])))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"server_trace": args.server_trace, "policy": policy, "policy_args": policy_args,
                       "follow_recorded": args.follow_recorded,
                       "agreement": round(res.agreement, 4), "exact_acceptance": res.exact_acceptance,
                       "runs": runs}, f, indent=1)
        print(f"wrote {args.json}")
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


def _positive_ints(text: str, what: str = "concurrency levels") -> list[int]:
    try:
        vals = [int(x) for x in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None
    if any(v < 1 for v in vals):
        raise argparse.ArgumentTypeError(f"{what} must be >= 1, got {text!r}")
    return vals


def _positive_int(text: str) -> int:
    vals = _positive_ints(text, "the value")
    if len(vals) != 1:
        raise argparse.ArgumentTypeError(f"expected one integer, got {text!r}")
    return vals[0]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="sglang-dynspec", description=__doc__)
    p.add_argument("--version", action="version", version=__version__)
    sub = p.add_subparsers(dest="cmd", required=True)
    d = sub.add_parser("doctor", help="check the installed SGLang, hook targets and settings, as server start would")
    d.add_argument("-v", "--verbose", action="store_true",
                   help="also the adapters' full descriptions and what importing SGLang printed")
    d.set_defaults(fn=_doctor)
    c = sub.add_parser("config", help="validate the settings as server start does; each value and where it came from")
    c.add_argument("--json", action="store_true", help="machine-readable: {setting: {value, source}}")
    c.set_defaults(fn=_config)
    sub.add_parser("policies", help="registered policies, third-party ones included").set_defaults(fn=_policies)
    r = sub.add_parser(
        "replay", help="project policies on step costs measured on a GPU (CPU only)",
        description="By default: replay decision traces recorded on an H200 (each static mode from its own trace, "
                    "each policy on both), the policy design loop. --profile: the older closed-loop model on "
                    "step-time profiles (no prefills). --check: project a measured sweep from its own costs. --server-trace: what a policy decides at "
                    "the inputs one server recorded.")
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
    r.add_argument("--server-trace", metavar="JSONL",
                   help="instead: re-drive one server's decision trace (SGLANG_DYNSPEC_TRACE_FILE) step by step "
                        "through a --policy, and compare its decisions with the recorded ones")
    r.add_argument("--verify-rows", type=_positive_int, metavar="N",
                   help="--server-trace: the server's --speculative-num-draft-tokens (default: the trace's; "
                        "traces from before 2026-12-01 do not record it)")
    r.add_argument("--follow-recorded", action="store_true",
                   help="--server-trace: apply the recorded decisions and only ask the policy, so that its costs "
                        "and estimates stay the server's own after a decision that differs")
    r.add_argument("--check", metavar="SWEEP_JSON",
                   help="instead: project a measured harness sweep from its own costs and report the error")
    r.set_defaults(fn=_replay)
    args = p.parse_args(argv)
    return args.fn(args)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
