"""Command line: python -m benchmarks.dynspec_bench {sweep,trace,fuzz,offstep} ..."""

from __future__ import annotations

import argparse
import json
import math
import os
import shlex
import sys
import time
from importlib import util as importlib_util
from pathlib import Path

from .modes import DEFAULT_COMMON_FLAGS, OPTIONAL_FLAGS, ServerConfig

REPO = Path(__file__).resolve().parents[2]

# Per-workload defaults of the fuzz subcommand (flags left unset take these).
FUZZ_DEFAULTS = {
    "switch": {"concurrency": [1, 8, 32, 128], "min_decode_steps": 2000, "max_seconds_per_c": 120.0},
    "faults": {"concurrency": [256], "min_decode_steps": 10000, "max_seconds_per_c": 420.0},
}

PRESETS = {
    # The first H200 call: six Llama-8B-shaped servers do not fit in 139 GB at C=128
    # (≈104 GB of weights + ≈7 GB KV each), so they run as two waves of three. Requests are capped
    # at 128 per level (C=32: 4×C, C=128: 1×C) so both waves fit one 600 s call.
    "first-h200": {
        "waves": [["off", "on", "dynspec:random"], ["off@nooverlap", "on@topk4", "dynspec:random@topk4"]],
        "concurrency": [1, 8, 32, 128], "input_len": 256, "output_len": 128, "max_requests": 128,
    },
    "quick": {"waves": [["off", "on"]], "concurrency": [1, 8], "input_len": 256, "output_len": 64,
              "max_requests": 32},
}


def _number_list(text: str, field: str, kind: type, what: str, ok) -> list:
    """Comma-separated numbers of ``kind``, each passing ``ok``; the error names ``field``."""
    try:
        vals = [kind(x) for x in str(text).replace(" ", ",").split(",") if x]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{field}: expected comma-separated {what}, got {text!r}") from None
    if not vals or not all(ok(v) for v in vals):
        raise argparse.ArgumentTypeError(f"{field}: expected {what}, got {text!r}")
    return vals


def _ints(text: str, field: str) -> list[int]:
    return _number_list(text, field, int, "positive integers", lambda v: v >= 1)


def _floats(text: str, field: str) -> list[float]:
    return _number_list(text, field, float, "numbers >= 0", lambda v: v >= 0)


def _len_range(text: str, field: str = "--output-len-range") -> tuple[int, int]:
    vals = _ints(text, field)
    if len(vals) != 2 or vals[0] > vals[1]:
        raise argparse.ArgumentTypeError(f"{field}: expected LO,HI with LO <= HI, got {text!r}")
    return vals[0], vals[1]


def _temperature(text: str, field: str) -> float:
    try:
        val = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{field}: expected a number >= 0, got {text!r}") from None
    if not (math.isfinite(val) and val >= 0):
        raise argparse.ArgumentTypeError(f"{field}: expected a number >= 0, got {text!r}")
    return val


def _json_obj(text: str | None, field: str) -> dict | None:
    if not text:
        return None
    try:
        val = json.loads(text)
    except ValueError as exc:
        raise SystemExit(f"{field}: not valid JSON ({exc}): {text!r}") from None
    if not isinstance(val, dict):
        raise SystemExit(f"{field}: must be a JSON object, got {text!r}")
    return val


def deterministic_supported(common_flags: list[str]) -> tuple[bool, str]:
    """--enable-deterministic-inference exists in the installed SGLang and accepts our backend."""
    spec = importlib_util.find_spec("sglang")
    if spec is None or not spec.submodule_search_locations:
        return False, "sglang not importable here"
    src = Path(list(spec.submodule_search_locations)[0]) / "srt" / "server_args.py"
    if not src.exists() or "enable_deterministic_inference" not in src.read_text(errors="replace"):
        return False, "this SGLang has no --enable-deterministic-inference"
    backend = common_flags[common_flags.index("--attention-backend") + 1] \
        if "--attention-backend" in common_flags else None
    if backend not in ("triton", "flashinfer"):
        # Without an explicit backend SGLang picks fa3 on Hopper, which the H200 bundle cannot run.
        return False, f"attention backend {backend!r} is not a deterministic one usable here (triton/flashinfer)"
    return True, f"supported with --attention-backend {backend}"


def _add_server_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("servers")
    g.add_argument("--model", default=os.environ.get("DYNSPEC_MODEL", str(REPO / "benchmarks/models/llama8b")))
    g.add_argument("--draft", default=os.environ.get("DYNSPEC_DRAFT", str(REPO / "benchmarks/models/eagle3-llama8b")))
    g.add_argument("--common-flags", default=None,
                   help="replace the default SGLang flags (one shell-quoted string)")
    g.add_argument("--extra-flags", default="", help="appended to every server (one shell-quoted string)")
    g.add_argument("--no-optional-flags", action="store_true",
                   help=f"do not add {OPTIONAL_FLAGS} (otherwise added, and dropped on a failed start)")
    g.add_argument("--piecewise-cuda-graph", action="store_true",
                   help="keep SGLang's default piecewise CUDA graphs for prefill (not --disable-piecewise-cuda-graph): "
                        "~16 s more start-up per server; without them a prefill on the padded pair is eager and "
                        "CPU-bound (25-50 ms for one 256-token request on the H200)")
    g.add_argument("--mem-fraction-static", type=float, default=0.85,
                   help="fraction of the GPU memory free at each server's start; --max-total-tokens caps the KV")
    g.add_argument("--max-total-tokens", type=int, default=None, help="default: max C × (in+out+64), rounded up")
    g.add_argument("--policy-args", default=os.environ.get("DYNSPEC_POLICY_ARGS"),
                   help="JSON object for SGLANG_DYNSPEC_POLICY_ARGS")
    g.add_argument("--stats-root", default=None, help="parent of per-server SGLANG_DYNSPEC_STATS_DIR")
    g.add_argument("--deterministic", choices=["off", "on", "auto"], default="off",
                   help="add --enable-deterministic-inference (auto: only where supported; changes kernels)")
    g.add_argument("--no-metrics", action="store_true", help="do not pass --enable-metrics")
    g.add_argument("--base-port", type=int, default=None)
    g.add_argument("--start-timeout", type=float, default=300.0)
    g.add_argument("--wait-for-weights", type=float, default=0.0, metavar="SECONDS",
                   help="each server first waits up to this long for <model>/model.safetensors (and its draft's): "
                        "weights a builder is still writing; sweep/trace also wait for --prompts-file")
    g.add_argument("--wait-abort-file", default=None,
                   help="with --wait-for-weights: stop waiting when this file appears (the builder failed)")
    g.add_argument("--out-dir", default=str(REPO / "benchmarks/results"))
    g.add_argument("--name", default=None, help="result file stem (default: the subcommand)")
    g.add_argument("--log-dir", default=None, help="server logs (default: <out-dir>/<name>-logs)")
    g.add_argument("--deadline-epoch", type=float, default=_env_float("DYNSPEC_DEADLINE_EPOCH"),
                   help="unix time after which no new level/wave starts (results are still written)")
    g.add_argument("--seed", type=int, default=0)
    g.add_argument("--wave-margin-s", type=float, default=_env_float("DYNSPEC_WAVE_MARGIN_S") or 150.0,
                   help="do not start a wave of servers with less time than this before the deadline")
    g.add_argument("--level-margin-s", type=float, default=_env_float("DYNSPEC_LEVEL_MARGIN_S") or 25.0,
                   help="do not start a level with less time than this before the deadline")


def _env_float(name: str) -> float | None:
    v = os.environ.get(name)
    return float(v) if v else None


def _deadline(args) -> float | None:
    if args.deadline_epoch is None:
        return None
    return time.monotonic() + (args.deadline_epoch - time.time())


def _server_cfg(args, max_c: int, name: str) -> ServerConfig:
    common = shlex.split(args.common_flags) if args.common_flags else list(DEFAULT_COMMON_FLAGS)
    det = args.deterministic == "on"
    if args.deterministic == "auto":
        det, why = deterministic_supported(common)
        print(f"[dynspec-bench] deterministic inference: {'on' if det else 'off'} ({why})", flush=True)
    mtt = args.max_total_tokens
    if mtt is None:
        out_len = max(args.output_len, *(getattr(args, "output_len_range", None) or [0]),
                      *(getattr(args, "add_trace_output_len_range", None) or [0]))
        need = max_c * (args.input_len + out_len + 64)
        # Floor: small pools make SGLang shrink its prefill chunk and queue requests.
        mtt = max(32768, int(math.ceil(need / 4096) * 4096))
    return ServerConfig(
        model=args.model, draft=args.draft, common_flags=common,
        optional_flags=[] if args.no_optional_flags else [
            f for f in OPTIONAL_FLAGS if not (args.piecewise_cuda_graph and f == "--disable-piecewise-cuda-graph")],
        mem_fraction_static=args.mem_fraction_static, max_total_tokens=mtt,
        extra_flags=shlex.split(args.extra_flags), policy_args=_json_obj(args.policy_args, "--policy-args"),
        stats_root=args.stats_root or f"/tmp/dynspec-stats/{name}-{os.getpid()}",
        deterministic=det, enable_metrics=not args.no_metrics,
        wait_for_weights_s=args.wait_for_weights, wait_abort_file=args.wait_abort_file,
    )


def _waves(args, preset: dict) -> list[list[str]]:
    if args.modes:
        return [[m.strip() for m in w.split(",") if m.strip()] for w in args.modes]
    if "waves" in preset:
        return preset["waves"]
    raise SystemExit("--modes: give at least one wave of modes, e.g. --modes off,on,dynspec:random")


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.dynspec_bench", description=__doc__)
    sub = ap.add_subparsers(dest="cmd", required=True)
    for cmd in ("sweep", "trace"):
        p = sub.add_parser(cmd, help="compare modes over concurrency levels" if cmd == "sweep"
                           else "compare modes on an open-loop arrival trace")
        _add_server_args(p)
        p.add_argument("--preset", choices=sorted(PRESETS), default=None)
        p.add_argument("--modes", action="append",
                       help="one wave of comma-separated modes, started together; repeat for more waves")
        p.add_argument("-C", "--concurrency", type=lambda t: _ints(t, "--concurrency"), default=None)
        p.add_argument("--input-len", type=int, default=None)
        p.add_argument("--output-len", type=int, default=None)
        p.add_argument("--output-len-range", type=_len_range, default=None, metavar="LO,HI",
                       help="draw each measured request's max_new_tokens uniformly from LO..HI (seeded: the "
                            "same lengths for every mode); --output-len then sizes only warm-ups and the accept pass")
        p.add_argument("--output-len-seed", type=int, default=None, help="seed of those lengths (default: --seed)")
        p.add_argument("--temperature", type=float, default=0.0)
        p.add_argument("--level-order", choices=["mode", "level"], default="mode",
                       help="mode: each mode's levels in turn; level: every mode at one C before the next C "
                            "(a deadline then cuts the highest C of all modes, not the last mode's levels), each level "
                            "starting one mode later than the one before")
        p.add_argument("--requests-factor", type=int, default=8, help="requests per level = factor × C")
        p.add_argument("--min-requests", type=int, default=8,
                       help="requests per level at least: max(this, factor × C), then capped by --max-requests")
        p.add_argument("--max-requests", type=int, default=None)
        p.add_argument("--warmup-tokens", type=int, default=32)
        p.add_argument("--prompts-file", default=None, help="JSON list of token-id lists")
        p.add_argument("--reference", default="off", help="mode the others are compared with, token by token")
        p.add_argument("--correctness-prompts", type=int, default=16)
        p.add_argument("--correctness-tokens", type=int, default=64)
        p.add_argument("--correctness-concurrency", type=int, default=8)
        p.add_argument("--kind", choices=["sweep", "pair", "trace"], default=cmd)
        p.add_argument("--accept-temperatures", type=lambda t: _floats(t, "--accept-temperatures"), default=[],
                       help="accept-length pass of every speculative mode at these temperatures, before the levels")
        p.add_argument("--accept-only", default="",
                       help="comma-separated modes (also listed in --modes) that get only the accept pass")
        p.add_argument("--accept-concurrency", type=int, default=8)
        p.add_argument("--accept-requests", type=int, default=64)
        p.add_argument("--pair-manifest", default=None, help="pair.json of build_pair, embedded in the record")
        if cmd == "trace":
            p.add_argument("--trace-file", default=None, help='JSON: [t,...] or {"arrivals_s": [...], "phases": [...]}')
            p.add_argument("--alternating", default="2,40,20,3",
                           help="low_rate,high_rate,phase_seconds,cycles for a generated low/high trace")
        else:
            p.add_argument("--add-trace", default=None, metavar="LOW,HIGH,PHASE_S,CYCLES",
                           help="after the closed-loop levels, an open-loop low/high trace on the same servers "
                                "(requests/s, requests/s, seconds per phase, cycles); its phases shrink to fit "
                                "the deadline, down to --add-trace-min-phase-s, else it is skipped")
            p.add_argument("--add-trace-min-phase-s", type=float, default=None,
                           help="shortest phase the plan may shrink to (default: 5 s, or PHASE_S if shorter)")
            p.add_argument("--add-trace-overhead-s", type=float, default=10.0,
                           help="seconds per mode the trace plan reserves besides the arrivals (draining, stats)")
            p.add_argument("--add-trace-temperature", type=lambda t: _temperature(t, "--add-trace-temperature"),
                           default=None, metavar="T",
                           help="the added trace's sampling temperature (default: --temperature, as the levels)")
            p.add_argument("--add-trace-output-len-range", default=None, metavar="LO,HI",
                           type=lambda t: _len_range(t, "--add-trace-output-len-range"),
                           help="the added trace's output lengths, drawn uniformly from LO..HI (seeded, the same "
                                "for every mode; default: the levels' --output-len-range, else --output-len)")
    p = sub.add_parser("fuzz", help="random on/off every step: crashes, leaks, output drift")
    _add_server_args(p)
    p.add_argument("--policy", default="random")
    p.add_argument("--variant", default="", help="mode variant for the dynspec and on servers, e.g. topk4")
    p.add_argument("--workload", choices=list(FUZZ_DEFAULTS), default="switch",
                   help="switch: uniform requests (off, on, dynspec servers); faults: mixed lengths, stop ids, "
                        "aborts, chunked long prompts, radix hits, opt-outs (off and dynspec servers)")
    p.add_argument("-C", "--concurrency", type=lambda t: _ints(t, "--concurrency"), default=None,
                   help="default: 1,8,32,128 (switch), 256 (faults)")
    p.add_argument("--min-decode-steps", type=int, default=None, help="default: 2000 (switch), 10000 (faults)")
    p.add_argument("--max-seconds-per-c", type=float, default=None, help="default: 120 (switch), 420 (faults)")
    p.add_argument("--input-len", type=int, default=256)
    p.add_argument("--output-len", type=int, default=128)
    p.add_argument("--chunked-prefill-size", type=int, default=512,
                   help="faults: passed to both servers (unless --extra-flags sets it)")
    p.add_argument("--long-prompt-len", type=int, default=1500, help="faults: the long prompts' length")
    p.add_argument("--drain-s", type=float, default=30.0,
                   help="faults: seconds in-flight requests get after a level stops before they are cut")
    p = sub.add_parser("offstep", help="step time with speculation forced off vs a plain server")
    _add_server_args(p)
    p.add_argument("--policy", default="never")
    p.add_argument("--variant", default="",
                   help="mode variant(s) of the dynspec server, e.g. topk4; comma-separated for several servers")
    p.add_argument("--batch-sizes", type=lambda t: _ints(t, "--batch-sizes"), default=[1, 8, 32, 128])
    p.add_argument("--profile-bs", type=lambda t: _ints(t, "--profile-bs"), default=[],
                   help="also profile every server at these batch sizes (SGLang /start_profile)")
    p.add_argument("--profile-steps", type=int, default=30, help="decode steps per profile")
    p.add_argument("--profile-stack", action="store_true",
                   help="record Python stacks in the profiles (heavier: shows which code each step runs)")
    p.add_argument("--input-len", type=int, default=256)
    p.add_argument("--output-len", type=int, default=512)
    p.add_argument("--requests-factor", type=int, default=2)
    p.add_argument("--prefill-c", type=int, default=0,
                   help="also a prefill-heavy level: closed loop at this concurrency, short varied outputs (0: none)")
    p.add_argument("--prefill-out", type=lambda t: tuple(_ints(t, "--prefill-out")), default=(16, 64),
                   help="lo,hi output lengths of the prefill level (uniform)")
    p.add_argument("--prefill-requests", type=int, default=200)
    p.add_argument("--prefill-temp", type=float, default=0.7)
    p.add_argument("--prefill-profile-steps", type=int, default=0,
                   help="also profile each server under the prefill level for this many forward steps")
    return ap


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = build_parser().parse_args(argv)
    name = args.name or args.cmd
    full_argv = ["-m", "benchmarks.dynspec_bench", *argv]
    if args.cmd in ("sweep", "trace"):
        from .loadgen import alternating_trace, load_trace
        from .sweep import Sweep, SweepConfig, TracePlan

        preset = PRESETS.get(args.preset or "", {})
        for key in ("concurrency", "input_len", "output_len", "max_requests"):
            if getattr(args, key) is None and key in preset:
                setattr(args, key, preset[key])
        args.concurrency = args.concurrency or [1, 8, 32, 128]
        args.input_len = args.input_len or 256
        args.output_len = args.output_len or 128
        if args.prompts_file and args.wait_for_weights > 0:
            # The builder writes its prompts before the weights; the servers wait for those.
            from .server import wait_for_files

            waited = wait_for_files([args.prompts_file], args.wait_for_weights, args.wait_abort_file)
            print(f"[dynspec-bench] {args.prompts_file} after {waited:.1f}s", flush=True)
        trace = None
        max_c = max(args.concurrency)
        if args.cmd == "trace":
            if args.trace_file:
                trace = load_trace(args.trace_file)
            else:
                low, high, ps, cyc = args.alternating.split(",")
                trace = alternating_trace(float(low), float(high), float(ps), int(cyc), seed=args.seed)
            max_c = 128
        add_trace = None
        if args.cmd == "sweep" and not args.add_trace:
            for opt in ("temperature", "output_len_range"):
                if getattr(args, f"add_trace_{opt}") is not None:
                    raise SystemExit(f"--add-trace-{opt.replace('_', '-')}: only with --add-trace (it sets the "
                                     "added trace's requests; the levels use --temperature / --output-len-range)")
        if getattr(args, "add_trace", None):
            try:
                add_trace = TracePlan.parse(args.add_trace, min_phase_s=args.add_trace_min_phase_s,
                                            overhead_s=args.add_trace_overhead_s,
                                            temperature=args.add_trace_temperature,
                                            output_len_range=args.add_trace_output_len_range)
            except ValueError as exc:
                raise SystemExit(f"--add-trace: {exc}") from None
            max_c = max(max_c, 128)  # the high phase's requests in flight, not a closed-loop C
        cfg = SweepConfig(
            waves=_waves(args, preset), server=_server_cfg(args, max_c, name), concurrency=args.concurrency,
            input_len=args.input_len, output_len=args.output_len, temperature=args.temperature,
            requests_factor=args.requests_factor, min_requests=args.min_requests, max_requests=args.max_requests,
            warmup_tokens=args.warmup_tokens, prompts_file=args.prompts_file, seed=args.seed,
            correctness_prompts=args.correctness_prompts, correctness_tokens=args.correctness_tokens,
            correctness_concurrency=args.correctness_concurrency, reference=args.reference,
            out_dir=args.out_dir, name=name, log_dir=args.log_dir, base_port=args.base_port or 30000,
            start_timeout_s=args.start_timeout, deadline=_deadline(args), kind=args.kind, trace=trace,
            wave_margin_s=args.wave_margin_s, level_margin_s=args.level_margin_s,
            accept_temperatures=args.accept_temperatures,
            accept_only=[m.strip() for m in args.accept_only.split(",") if m.strip()],
            accept_concurrency=args.accept_concurrency, accept_requests=args.accept_requests,
            pair_manifest=args.pair_manifest, output_len_range=args.output_len_range,
            output_len_seed=args.output_len_seed, level_order=args.level_order, add_trace=add_trace,
        )
        rec = Sweep(cfg, full_argv).run()
        return 0 if rec["modes"] else 1
    if args.cmd == "fuzz":
        from .fuzz import FuzzConfig, run_fuzz

        for key, val in FUZZ_DEFAULTS[args.workload].items():
            if getattr(args, key) is None:
                setattr(args, key, val)
        extra = {}
        if args.workload == "faults":
            from .faults import FaultMix, kv_tokens_needed

            mix = FaultMix(input_len=args.input_len, long_prompt_len=args.long_prompt_len)
            if args.max_total_tokens is None:
                args.max_total_tokens = kv_tokens_needed(max(args.concurrency), mix)
            extra = {"fault_mix": mix, "chunked_prefill_size": args.chunked_prefill_size,
                     "long_prompt_len": args.long_prompt_len, "drain_s": args.drain_s}
        cfg = FuzzConfig(server=_server_cfg(args, max(args.concurrency), name), policy=args.policy,
                         variant=args.variant, concurrency=args.concurrency,
                         min_decode_steps=args.min_decode_steps, output_len=args.output_len,
                         input_len=args.input_len, max_seconds_per_c=args.max_seconds_per_c,
                         out_dir=args.out_dir, name=name, log_dir=args.log_dir, base_port=args.base_port or 30100,
                         start_timeout_s=args.start_timeout, deadline=_deadline(args), seed=args.seed,
                         level_margin_s=args.level_margin_s, workload=args.workload, **extra)
        rec = run_fuzz(cfg, full_argv)
        return 0 if rec["per_C"] else 1
    from .offstep import OffstepConfig, run_offstep

    cfg = OffstepConfig(server=_server_cfg(args, max(args.batch_sizes), name), batch_sizes=args.batch_sizes,
                        variant=args.variant, policy=args.policy, output_len=args.output_len,
                        input_len=args.input_len, requests_factor=args.requests_factor, out_dir=args.out_dir,
                        name=name, log_dir=args.log_dir, base_port=args.base_port or 30200, start_timeout_s=args.start_timeout,
                        deadline=_deadline(args), seed=args.seed, level_margin_s=args.level_margin_s,
                        profile_bs=args.profile_bs, profile_steps=args.profile_steps,
                        profile_stack=args.profile_stack, prefill_c=args.prefill_c, prefill_out=args.prefill_out,
                        prefill_requests=args.prefill_requests, prefill_temp=args.prefill_temp,
                        prefill_profile_steps=args.prefill_profile_steps)
    rec = run_offstep(cfg, full_argv)
    return 0 if rec["per_bs"] else 1
