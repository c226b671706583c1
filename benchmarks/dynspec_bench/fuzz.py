"""Fuzz: a dynspec server whose policy flips every step, driven until N decode steps per C.

Checks per C that the server survives, leaks nothing (log scan), keeps greedy outputs equal to
the `off` server's, and that speculation still accepts as well as a static `on` server afterwards.

``workload="faults"`` (``fuzz --workload faults``) replaces the uniform requests with the fault
mix of faults.py (mixed lengths, stop ids, aborts, chunked long prompts, radix hits, opt-outs),
against the dynspec and `off` servers only; see faults.py and benchmarks/results/README.md.
"""

from __future__ import annotations

import asyncio
import os
import time
from dataclasses import dataclass, field
from pathlib import Path

from . import correctness as corr
from . import faults as flt
from .loadgen import closed_loop, first_errors, mean_accept_length, sampling_params
from .modes import parse_mode, stats_dir_for
from .prompts import PromptSource
from .runconfig import RunConfig
from .results import base_record, finish, phase, write_json
from .stats import read_stats
from .wave import log, running_modes

# The plugin rewrites its stats file about once per second; tests shorten the wait.
STATS_SETTLE_S = float(os.environ.get("DYNSPEC_STATS_SETTLE_S", "1.5"))


WORKLOADS = ("switch", "faults")


@dataclass
class FuzzConfig(RunConfig):
    policy: str = "random"
    concurrency: list[int] = field(default_factory=lambda: [1, 8, 32, 128])
    min_decode_steps: int = 2000
    max_seconds_per_c: float = 120.0
    name: str = "fuzz"
    # "switch": uniform requests, three servers (off, on, dynspec). "faults": see faults.py.
    workload: str = "switch"
    chunked_prefill_size: int = 512  # faults: added to both servers unless extra_flags set one
    fault_mix: "flt.FaultMix | None" = None  # faults: None = FaultMix() with long_prompt_len/input_len
    long_prompt_len: int = 1500
    drain_s: float = 30.0  # faults: in-flight requests get this long after a level's stop, then are cut
    poll_s: float = 1.0    # faults: stats-file poll interval

    def __post_init__(self) -> None:
        if self.workload not in WORKLOADS:
            raise ValueError(f"workload must be one of {WORKLOADS}, got {self.workload!r}")
        if self.workload == "faults" and self.chunked_prefill_size < 1:
            raise ValueError(f"chunked_prefill_size must be >= 1, got {self.chunked_prefill_size}")
        if self.min_decode_steps < 1:
            raise ValueError(f"min_decode_steps must be >= 1, got {self.min_decode_steps}")
        if not self.concurrency or any(int(c) < 1 for c in self.concurrency):
            raise ValueError(f"concurrency: need positive integers, got {self.concurrency}")


def _suffix(variant: str) -> str:
    return f"@{variant}" if variant else ""


def run_fuzz(cfg: FuzzConfig, argv: list[str] | None = None) -> dict:
    if cfg.workload == "faults":
        return run_faults(cfg, argv)
    off_m = parse_mode("off" + ("@nooverlap" if "nooverlap" in cfg.variant else ""))
    on_m = parse_mode("on" + _suffix(cfg.variant))
    dyn_m = parse_mode(f"dynspec:{cfg.policy}" + _suffix(cfg.variant))
    out_dir = Path(cfg.out_dir)
    json_path = out_dir / f"{cfg.name}.json"
    rec = base_record("fuzz", cfg.server.model, argv)
    shape = dyn_m.shape
    rec.update({"policy": cfg.policy, "topk": shape["topk"], "num_steps": shape["num_steps"],
                "num_draft_tokens": shape["num_draft_tokens"], "per_C": {}, "errors": {},
                "draft_model": cfg.server.draft,
                "settings": {"min_decode_steps": cfg.min_decode_steps, "output_len": cfg.output_len,
                             "input_len": cfg.input_len, "concurrency": cfg.concurrency,
                             "variant": cfg.variant, "policy_args": cfg.server.policy_args}})
    from .modes import worker_path_guess
    rec["worker_path"] = worker_path_guess(dyn_m, rec["sglang_version"])
    sdir = stats_dir_for(cfg.server.stats_root, dyn_m.name) if cfg.server.stats_root else None
    prompts = PromptSource(cfg.input_len, cfg.seed)
    params = sampling_params(cfg.output_len)
    modes = [off_m, on_m, dyn_m]
    ports = [cfg.base_port + i for i in range(3)]
    try:
        with running_modes(rec, modes, cfg.server, cfg.log_dir or out_dir / f"{cfg.name}-logs", ports,
                           cfg.start_timeout_s, cfg.server_factory) as live:
            missing = [m.name for m in modes if m.name not in live]
            if missing:
                raise RuntimeError(f"fuzz needs all three servers; failed to start: {missing}")
            off, on, dyn = live[off_m.name], live[on_m.name], live[dyn_m.name]
            for ci, c in enumerate(cfg.concurrency):
                if cfg.remaining_s() < cfg.level_margin_s:
                    rec.setdefault("skipped", []).append({"C": c, "why": "deadline"})
                    continue
                with phase(rec, f"fuzz:C={c}"):
                    rec["per_C"][str(c)] = _fuzz_level(cfg, c, ci, off, on, dyn, sdir, prompts, params)
                lv = rec["per_C"][str(c)]
                log(f"fuzz C={c}: steps={lv['decode_steps']} switches={lv['switches']} crashed={lv['crashed']} "
                    f"leaks={lv['leak_reports']} mismatched={lv['mismatched']} acc={lv['accept_length_after_resume']}"
                    f" vs on {lv['accept_length_static_on']}")
                write_json(json_path, rec)
                if not dyn.alive():
                    break
            rec["server_stats"] = {m.name: live[m.name].log_counts() for m in modes}
    except RuntimeError as exc:
        rec["errors"]["run"] = str(exc)
        log(str(exc))
    finish(json_path, rec)
    log(f"wrote {json_path}")
    return rec


def _fuzz_level(cfg, c, ci, off, on, dyn, sdir, prompts, params) -> dict:
    leaks_before = dyn.log_counts()["leak_reports"]
    # Correctness at this batch size: at least C prompts so the batch really fills.
    cp = corr.correctness_prompts(max(corr.DEFAULT_PROMPTS, c), cfg.input_len)
    ref = corr.collect_outputs(off.base_url, cp, corr.DEFAULT_NEW_TOKENS, c)
    got = corr.collect_outputs(dyn.base_url, cp, corr.DEFAULT_NEW_TOKENS, c)
    cmp = corr.compare(ref, got)
    before = read_stats(sdir)
    t0 = time.monotonic()
    requests = failed = 0
    errors: list[str] = []
    accepts: list = []
    steps = switches = policy_errors = None
    rnd = 0
    while True:
        batch = prompts.take(max(c, 8), salt=100 * (ci + 1) + rnd)
        rnd += 1
        results, _ = asyncio.run(closed_loop(dyn.base_url, batch, c, params, desc=f"fuzz C={c}"))
        requests += len(results)
        failed += sum(1 for r in results if not r.ok)
        errors += first_errors(results)
        accepts += results
        time.sleep(STATS_SETTLE_S)
        now = read_stats(sdir)
        if now is not None:
            b = before or {}
            steps = now["decode_steps"] - b.get("decode_steps", 0)
            switches = now["switches"] - b.get("switches", 0)
            policy_errors = now["policy_errors"] - b.get("policy_errors", 0)
        if not dyn.alive() or failed:
            break
        if steps is not None and steps >= cfg.min_decode_steps:
            break
        if steps is None and rnd >= 3:
            break  # no stats file: the plugin is not reporting; do not loop blindly
        if time.monotonic() - t0 > cfg.max_seconds_per_c or cfg.remaining_s() < cfg.level_margin_s:
            break
    stats_now = read_stats(sdir) or {}
    acc_src = "stats.accept_length_on_steps"
    acc = stats_now.get("accept_length_on_steps")
    if acc is None:
        acc, acc_src = mean_accept_length(accepts), "meta_info (loadgen.accept_length)"
    static = asyncio.run(closed_loop(on.base_url, prompts.take(max(2 * c, 8), salt=7000 + ci), c, params,
                                     desc=f"on C={c}"))[0]
    level = {
        "decode_steps": steps, "switches": switches,
        # > 0: the policy was replaced by the safe mode during this level (switching stopped there)
        "policy_errors": policy_errors,
        "crashed": (not dyn.alive()) or failed > 0,
        "leak_reports": dyn.log_counts()["leak_reports"] - leaks_before,
        "requests": requests, "failed": failed,
        "mismatched": cmp["mismatched"], "first_mismatch": cmp["first_mismatch"],
        "accept_length_after_resume": acc, "accept_length_source": acc_src,
        "accept_length_static_on": mean_accept_length(static),
        "server_avg_spec_accept_length": dyn.avg_spec_accept_length() if dyn.alive() else None,
    }
    if errors:
        level["errors"] = errors[:3]
    return level


# ---- workload "faults" ---------------------------------------------------------------------
def _fault_mix(cfg: FuzzConfig) -> "flt.FaultMix":
    if cfg.fault_mix is not None:
        return cfg.fault_mix
    return flt.FaultMix(input_len=cfg.input_len, long_prompt_len=cfg.long_prompt_len)


def run_faults(cfg: FuzzConfig, argv: list[str] | None = None) -> dict:
    """The fault mix against the dynspec server and the `off` reference, per C; see faults.py."""
    import dataclasses

    off_m = parse_mode("off" + ("@nooverlap" if "nooverlap" in cfg.variant else ""))
    dyn_m = parse_mode(f"dynspec:{cfg.policy}" + _suffix(cfg.variant))
    mix = _fault_mix(cfg)
    server = cfg.server
    if "--chunked-prefill-size" not in server.extra_flags:
        server = dataclasses.replace(server, extra_flags=list(server.extra_flags)
                                     + ["--chunked-prefill-size", str(cfg.chunked_prefill_size)])
    out_dir = Path(cfg.out_dir)
    json_path = out_dir / f"{cfg.name}.json"
    rec = base_record("fuzz", server.model, argv)
    shape = dyn_m.shape
    rec.update({"workload": "faults", "policy": cfg.policy, "topk": shape["topk"], "num_steps": shape["num_steps"],
                "num_draft_tokens": shape["num_draft_tokens"], "per_C": {}, "errors": {},
                "draft_model": server.draft,
                "settings": {"workload": "faults", "min_decode_steps": cfg.min_decode_steps,
                             "concurrency": cfg.concurrency, "variant": cfg.variant,
                             "policy_args": server.policy_args, "max_seconds_per_c": cfg.max_seconds_per_c,
                             "chunked_prefill_size": _flag_value(server.extra_flags, "--chunked-prefill-size"),
                             "drain_s": cfg.drain_s, "seed": cfg.seed, "mix": mix.settings(),
                             "reference": off_m.name}})
    from .modes import worker_path_guess
    rec["worker_path"] = worker_path_guess(dyn_m, rec["sglang_version"])
    sdir = stats_dir_for(server.stats_root, dyn_m.name) if server.stats_root else None
    source = flt.CaseSource(mix, cfg.seed)
    modes = [off_m, dyn_m]
    ports = [cfg.base_port + i for i in range(2)]
    try:
        with running_modes(rec, modes, server, cfg.log_dir or out_dir / f"{cfg.name}-logs", ports,
                           cfg.start_timeout_s, cfg.server_factory) as live:
            missing = [m.name for m in modes if m.name not in live]
            if missing:
                raise RuntimeError(f"fuzz --workload faults needs both servers; failed to start: {missing}")
            off, dyn = live[off_m.name], live[dyn_m.name]
            # Level end = the deadline minus what draining, the scrape and the write need.
            reserve = cfg.drain_s + 10.0
            for ci, c in enumerate(cfg.concurrency):
                left = cfg.remaining_s() - reserve
                if left < cfg.level_margin_s or not dyn.alive():
                    rec.setdefault("skipped", []).append(
                        {"C": c, "why": "deadline" if dyn.alive() else "dynspec server dead"})
                    continue
                budget = min(cfg.max_seconds_per_c, left / (len(cfg.concurrency) - ci))
                with phase(rec, f"fuzz:C={c}"):
                    rec["per_C"][str(c)] = _faults_level(cfg, c, ci, off, dyn, sdir, source, budget)
                lv = rec["per_C"][str(c)]
                log(f"faults C={c}: steps={lv['decode_steps']} switches={lv['switches']} "
                    f"forced_off={lv['steps_forced_off']} crashed={lv['crashed']} leaks={lv['leak_reports']} "
                    f"requests={lv['requests']} aborted={lv['aborted']} compared={lv['compared']} "
                    f"mismatched={lv['mismatched']} errors={lv['errors']} stop={lv['stop_reason']}")
                write_json(json_path, rec)
            if dyn.alive():
                scrape = flt.scrape_metrics(dyn.base_url)
                rec["metrics_scrape"] = scrape["lines"]
                rec["metrics_scrape_status"] = scrape["status"]
                rec["server_aborted_requests"] = scrape["server_aborted_requests"]
            else:
                rec["metrics_scrape"], rec["metrics_scrape_status"] = [], None
            rec["server_stats"] = {m.name: live[m.name].log_counts() for m in modes}
            st = flt.stats_with_extras(sdir)
            if st is not None:
                rec["server_stats"][dyn_m.name]["dynspec_stats"] = st
    except RuntimeError as exc:
        rec["errors"]["run"] = str(exc)
        log(str(exc))
    finish(json_path, rec)
    log(f"wrote {json_path}")
    return rec


def _flag_value(args: list[str], flag: str) -> int | str | None:
    if flag not in args:
        return None
    i = len(args) - 1 - args[::-1].index(flag)  # the last occurrence wins in argparse
    v = args[i + 1] if i + 1 < len(args) else None
    return int(v) if v is not None and v.lstrip("-").isdigit() else v


def _faults_level(cfg, c, ci, off, dyn, sdir, source, budget_s: float) -> dict:
    leaks_before = dyn.log_counts()["leak_reports"]
    before = flt.stats_with_extras(sdir)
    stop_at = time.monotonic() + max(1.0, budget_s)
    run = asyncio.run(flt.drive(dyn.base_url, off.base_url, c, source, first_index=(ci + 1) * 10_000_000,
                                stats_dir=sdir, min_decode_steps=cfg.min_decode_steps, stop_at=stop_at,
                                drain_s=cfg.drain_s, alive=dyn.alive, poll_s=cfg.poll_s))
    time.sleep(STATS_SETTLE_S)
    after = flt.stats_with_extras(sdir)
    level = flt.summarize_level(run, before, after)
    alive = dyn.alive()
    level["crashed"] = not alive or not flt.health_ok(dyn.base_url)
    level["leak_reports"] = dyn.log_counts()["leak_reports"] - leaks_before
    level["accept_length_after_resume"] = (after or {}).get("accept_length_on_steps")
    level["accept_length_source"] = "stats.accept_length_on_steps"
    level["accept_length_static_on"] = None  # no static `on` server in the fault run
    level["server_avg_spec_accept_length"] = dyn.avg_spec_accept_length() if alive else None
    level["concurrency_client"] = c
    return level
