"""Sweep driver: per wave, start the wave's servers together, then measure one mode at a time."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import math
import time
from dataclasses import dataclass, field
from pathlib import Path

from . import correctness as corr
from .loadgen import (
    alternating_trace, closed_loop, first_errors, open_loop, output_lengths, sampling_params, summarize,
    summarize_by_phase,
)
from .modes import Mode, ServerConfig, parse_mode, stats_dir_for, worker_path_guess
from .phase_summary import summarize_phases
from .prompts import PromptSource
from .results import base_record, phase, validate, write_json
from .server import ServerProcess
from .stats import delta, read_stats, stage_latency
from .wave import log, running_modes

# The plugin rewrites its stats file about once per second; tests shorten the wait.
STATS_SETTLE_S = float(os.environ.get("DYNSPEC_STATS_SETTLE_S", "1.5"))
# A level starts only with this many times the longest time the same C took for another mode
# left (a speculative mode can take twice as long as `off` at high C), or level_margin_s if more.
LEVEL_ESTIMATE_FACTOR = 2.0
LEVEL_ORDERS = ("mode", "level")


def checked_len_range(rng, what: str) -> tuple[int, int]:
    """(lo, hi) output lengths as ints, or ValueError naming ``what``."""
    lo, hi = rng
    if not 1 <= int(lo) <= int(hi):
        raise ValueError(f"{what}: need 1 <= lo <= hi, got {rng}")
    return int(lo), int(hi)


@dataclass
class TracePlan:
    """An alternating low/high open-loop trace run on the same servers after the closed-loop levels.

    Every measured mode gets the same trace. Its phases shrink (never below ``min_phase_s``) so
    that the whole trace fits every mode before the deadline; if even that does not fit it is
    skipped: the closed-loop levels come first."""

    low_rate: float
    high_rate: float
    phase_s: float
    cycles: int
    min_phase_s: float = 5.0
    # Per mode besides the arrivals: stats reads, the requests of the last phase finishing.
    overhead_s: float = 10.0
    # The trace's own sampling temperature and output lengths (lo, hi); None: the run's
    # (SweepConfig.temperature / output_len_range), as for the closed-loop levels.
    temperature: float | None = None
    output_len_range: tuple[int, int] | None = None

    def __post_init__(self) -> None:
        if not (self.low_rate > 0 and self.high_rate > 0 and self.phase_s > 0):
            raise ValueError(f"trace plan: rates and phase_s must be > 0, got {self}")
        if self.cycles < 1:
            raise ValueError(f"trace plan: cycles must be >= 1, got {self.cycles}")
        if not 0 < self.min_phase_s <= self.phase_s:
            raise ValueError(f"trace plan: need 0 < min_phase_s <= phase_s, got {self.min_phase_s}, {self.phase_s}")
        if self.temperature is not None and not (math.isfinite(self.temperature) and self.temperature >= 0):
            raise ValueError(f"trace plan: temperature must be a number >= 0, got {self.temperature}")
        if self.output_len_range is not None:
            self.output_len_range = checked_len_range(self.output_len_range, "trace plan: output_len_range")

    @classmethod
    def parse(cls, text: str, min_phase_s: float | None = None, overhead_s: float = 10.0,
              temperature: float | None = None, output_len_range: tuple[int, int] | None = None) -> "TracePlan":
        """``low_rate,high_rate,phase_s,cycles`` (requests/s, requests/s, seconds, count);
        ``min_phase_s`` defaults to 5 s, or phase_s when that is shorter."""
        try:
            low, high, ps, cyc = (x.strip() for x in text.split(","))
            phase_s = float(ps)
            plan = cls(float(low), float(high), phase_s, int(cyc),
                       min_phase_s=min(5.0, phase_s) if min_phase_s is None else min_phase_s, overhead_s=overhead_s)
        except ValueError as exc:
            raise ValueError(f"trace plan {text!r}: expected low_rate,high_rate,phase_s,cycles ({exc})") from None
        # Checked by __post_init__, with messages of their own (not about the text's shape).
        return dataclasses.replace(plan, temperature=temperature, output_len_range=output_len_range)

    def seconds_per_mode(self, phase_s: float) -> float:
        return 2 * self.cycles * phase_s + self.overhead_s

    def fit_phase_s(self, seconds_left: float, n_modes: int) -> float | None:
        """The longest phase (<= phase_s) with which all n_modes traces end in seconds_left."""
        per_mode = seconds_left / max(1, n_modes) - self.overhead_s
        phase_s = min(self.phase_s, per_mode / (2 * self.cycles))
        return round(phase_s, 3) if phase_s >= self.min_phase_s else None

    def build(self, phase_s: float, seed: int) -> tuple[list[float], list[str]]:
        return alternating_trace(self.low_rate, self.high_rate, phase_s, self.cycles, seed=seed)


@dataclass
class SweepConfig:
    waves: list[list[str]]
    server: ServerConfig
    concurrency: list[int] = field(default_factory=lambda: [1, 8, 32, 128])
    input_len: int = 256
    output_len: int = 128
    temperature: float = 0.0
    requests_factor: int = 8
    min_requests: int = 8
    max_requests: int | None = None
    # (lo, hi): each measured request's max_new_tokens drawn uniformly from lo..hi, seeded with
    # output_len_seed (default: seed) and the level, so every mode serves the same lengths.
    # output_len then sizes only the KV pool's floor, the accept pass and the warm-ups.
    output_len_range: tuple[int, int] | None = None
    output_len_seed: int | None = None
    warmup_tokens: int = 32
    prompts_file: str | None = None
    seed: int = 0
    # Acceptance pass: every static `on` mode's accept length at these temperatures (C =
    # accept_concurrency, accept_requests held-out prompts), before any sweep level; modes in
    # accept_only are started with the waves but get only this pass (no sweep levels).
    accept_temperatures: list[float] = field(default_factory=list)
    accept_only: list[str] = field(default_factory=list)
    accept_concurrency: int = 8
    accept_requests: int = 64
    pair_manifest: str | None = None
    correctness_prompts: int = corr.DEFAULT_PROMPTS
    correctness_tokens: int = corr.DEFAULT_NEW_TOKENS
    correctness_concurrency: int = corr.DEFAULT_CONCURRENCY
    reference: str = "off"
    out_dir: str = "benchmarks/results"
    name: str = "sweep"
    log_dir: str | None = None
    base_port: int = 30000
    start_timeout_s: float = 300.0
    deadline: float | None = None  # time.monotonic() value after which nothing new starts
    level_margin_s: float = 25.0
    wave_margin_s: float = 150.0
    kind: str = "sweep"
    trace: tuple[list[float], list[str] | None] | None = None
    trace_warmup_concurrency: int = 8
    # "mode": each mode's levels one mode after the other (a deadline cuts the last modes' high
    # levels); "level": every mode at one C before the next C (it cuts the highest C of all modes).
    level_order: str = "mode"
    add_trace: TracePlan | None = None  # after the levels, on the same servers (sweep kind)
    server_factory: object = None  # tests inject a callable(spec, log_dir) -> ServerProcess

    def __post_init__(self) -> None:
        if not self.waves or not any(self.waves):
            raise ValueError("waves: give at least one mode")
        names = [m for w in self.waves for m in w]
        if len(set(names)) != len(names):
            raise ValueError(f"waves: a mode appears twice: {names}")
        for n in names:
            parse_mode(n)
        stray = [n for n in self.accept_only if n not in names]
        if stray:
            raise ValueError(f"accept_only: {stray} are in no wave")
        if any(t < 0 for t in self.accept_temperatures):
            raise ValueError(f"accept_temperatures: must be >= 0, got {self.accept_temperatures}")
        if self.accept_only and not self.accept_temperatures:
            raise ValueError("accept_only: needs accept_temperatures (the pass they are started for)")
        if self.trace is None:
            if not self.concurrency or any(int(c) < 1 for c in self.concurrency):
                raise ValueError(f"concurrency: need positive integers, got {self.concurrency}")
        if self.output_len < 1 or self.input_len < 1:
            raise ValueError("input_len and output_len must be >= 1")
        if self.requests_factor < 1:
            raise ValueError(f"requests_factor must be >= 1, got {self.requests_factor}")
        if self.output_len_range is not None:
            self.output_len_range = checked_len_range(self.output_len_range, "output_len_range")
        if self.output_len_seed is None:
            self.output_len_seed = self.seed
        if self.level_order not in LEVEL_ORDERS:
            raise ValueError(f"level_order must be one of {LEVEL_ORDERS}, got {self.level_order!r}")
        if self.add_trace is not None and self.trace is not None:
            raise ValueError("add_trace: a trace run already measures a trace (give one of trace / add_trace)")

    def requests_for(self, c: int) -> int:
        n = max(self.min_requests, self.requests_factor * c)
        return min(n, self.max_requests) if self.max_requests else n

    def remaining_s(self) -> float:
        return math.inf if self.deadline is None else self.deadline - time.monotonic()


class Sweep:
    def __init__(self, cfg: SweepConfig, argv: list[str] | None = None):
        self.cfg = cfg
        self.out_dir = Path(cfg.out_dir)
        self.log_dir = Path(cfg.log_dir or (self.out_dir / f"{cfg.name}-logs"))
        self.json_path = self.out_dir / f"{cfg.name}.json"
        self.png_path = self.out_dir / f"{cfg.name}.png"
        self.prompts = PromptSource(cfg.input_len, cfg.seed, cfg.prompts_file)
        self.corr_prompts = (
            self.prompts.take(cfg.correctness_prompts, salt=999_983) if cfg.prompts_file
            else corr.correctness_prompts(cfg.correctness_prompts, cfg.input_len)
        )
        self.record = base_record(cfg.kind, cfg.server.model, argv)
        self.record.update({
            "draft_model": cfg.server.draft,
            "settings": {
                "concurrency": list(cfg.concurrency), "input_len": cfg.input_len, "output_len": cfg.output_len,
                "output_len_range": list(cfg.output_len_range) if cfg.output_len_range else None,
                "output_len_seed": cfg.output_len_seed if cfg.output_len_range else None,
                "temperature": cfg.temperature, "requests_factor": cfg.requests_factor,
                "max_requests": cfg.max_requests, "warmup_tokens": cfg.warmup_tokens,
                "waves": cfg.waves, "reference": cfg.reference, "level_order": cfg.level_order,
                "deterministic": cfg.server.deterministic, "policy_args": cfg.server.policy_args,
                "correctness": {"prompts": cfg.correctness_prompts, "new_tokens": cfg.correctness_tokens,
                                "concurrency": cfg.correctness_concurrency},
            },
            "modes": {}, "correctness": {}, "mode_info": {}, "server_stats": {},
            "ratio_to_best_static": {}, "skipped": [], "errors": {},
        })
        if cfg.add_trace is not None:
            plan = cfg.add_trace
            temp, lens = self._trace_sampling()
            self.record["settings"]["added_trace"] = {
                "low_rate_per_s": plan.low_rate, "high_rate_per_s": plan.high_rate, "cycles": plan.cycles,
                "phase_s_requested": plan.phase_s, "min_phase_s": plan.min_phase_s,
                "overhead_s_per_mode": plan.overhead_s, "seed": cfg.seed, "phase_s": None, "arrivals": None,
                # What the trace's requests ask for (its own, or the run's): null range = output_len each.
                "temperature": temp, "output_len_range": list(lens) if lens else None,
            }
        self._outputs: dict[str, list] = {}
        self._next_port = cfg.base_port
        self._level_wall: dict[int, float] = {}  # longest time one mode's level at C took, for the deadline

    # ---- top level -------------------------------------------------------------------
    def run(self) -> dict:
        try:
            for w, wave in enumerate(self.cfg.waves):
                self._run_wave(w, [parse_mode(n) for n in wave])
        finally:
            self._finish()
        return self.record

    def _run_wave(self, w: int, modes: list[Mode]) -> None:
        if self.cfg.remaining_s() < self.cfg.wave_margin_s:
            log(f"deadline near: skipping wave {w} ({[m.name for m in modes]})")
            self.record["skipped"] += [{"mode": m.name, "C": None, "why": "deadline"} for m in modes]
            return
        for m in modes:
            self.record["mode_info"][m.name] = self._mode_info(m)
        ports = list(range(self._next_port, self._next_port + len(modes)))
        self._next_port += len(modes)
        with running_modes(self.record, modes, self.cfg.server, self.log_dir, ports,
                           self.cfg.start_timeout_s, self.cfg.server_factory, label=f"start_wave{w}") as live:
            if self.cfg.accept_temperatures:
                for m in modes:
                    if m.kind == "on" and live.get(m.name) is not None:
                        with phase(self.record, f"accept:{m.name}"):
                            self._accept_pass(m, live[m.name])
                write_json(self.json_path, self.record)
            measured = [(m, live[m.name]) for m in modes
                        if m.name not in self.cfg.accept_only and live.get(m.name) is not None]
            if self.cfg.level_order == "mode":
                for m, srv in measured:
                    with phase(self.record, f"measure:{m.name}"):
                        self._measure_mode(m, srv)
                    write_json(self.json_path, self.record)
            else:
                self._measure_level_major(measured)
            if self.cfg.add_trace is not None:
                self._added_trace(measured)
            for m in modes:
                if live.get(m.name) is not None:
                    self._after_mode(m, live[m.name])
            write_json(self.json_path, self.record)

    # ---- one mode --------------------------------------------------------------------
    def _mode_info(self, m: Mode) -> dict:
        shape = m.shape or {}
        return {"kind": m.kind, "policy": m.policy, "variants": m.variants,
                "worker_path": worker_path_guess(m, self.record.get("sglang_version")),
                "topk": shape.get("topk"), "num_steps": shape.get("num_steps"),
                "num_draft_tokens": shape.get("num_draft_tokens"), "overlap": m.overlap}

    def _stats_dir(self, m: Mode) -> str | None:
        if m.kind != "dynspec" or m.bare or not self.cfg.server.stats_root:
            return None
        return stats_dir_for(self.cfg.server.stats_root, m.name)

    def _correctness(self, m: Mode, srv: ServerProcess) -> None:
        cfg = self.cfg
        with phase(self.record, f"correctness:{m.name}"):
            self._outputs[m.name] = corr.collect_outputs(
                srv.base_url, self.corr_prompts, cfg.correctness_tokens, cfg.correctness_concurrency)

    def _measure_mode(self, m: Mode, srv: ServerProcess) -> None:
        """Mode-major order: this mode's correctness prompts, then all its levels (or its trace)."""
        self._correctness(m, srv)
        levels = self.record["modes"].setdefault(m.name, {})
        if self.cfg.trace is not None:
            levels["trace"] = self._measure_trace(m, srv, self.cfg.trace)
            return
        for ci, c in enumerate(self.cfg.concurrency):
            self._run_level(m, srv, ci, c)

    def _measure_level_major(self, measured: list[tuple[Mode, ServerProcess]]) -> None:
        """Level-major order: every mode's correctness prompts, then each C for every mode in turn,
        the order rotated by one mode per level."""
        for m, srv in measured:
            self._correctness(m, srv)
            self.record["modes"].setdefault(m.name, {})
        if self.cfg.trace is not None:
            for m, srv in measured:
                with phase(self.record, f"measure:{m.name}", add=True):
                    self.record["modes"][m.name]["trace"] = self._measure_trace(m, srv, self.cfg.trace)
                write_json(self.json_path, self.record)
            return
        for ci, c in enumerate(self.cfg.concurrency):
            # Each level starts with the next mode: no mode always runs right after the same one
            # (the H200 runs measured dynspec last at every level, after stock `on`).
            k = ci % len(measured) if measured else 0
            for m, srv in measured[k:] + measured[:k]:
                with phase(self.record, f"measure:{m.name}", add=True):
                    self._run_level(m, srv, ci, c)

    def _level_time_needed(self, c: int) -> float:
        return max(self.cfg.level_margin_s, LEVEL_ESTIMATE_FACTOR * self._level_wall.get(c, 0.0))

    def _run_level(self, m: Mode, srv: ServerProcess, ci: int, c: int) -> None:
        """One level of one mode, unless the deadline is too near or the server died."""
        cfg = self.cfg
        left, need = cfg.remaining_s(), self._level_time_needed(c)
        if left < need:
            log(f"deadline near: skipping {m.name} C={c} ({left:.0f} s left, {need:.0f} s needed)")
            self.record["skipped"].append({"mode": m.name, "C": c, "why": "deadline"})
            return
        if not srv.alive():
            self.record["skipped"].append({"mode": m.name, "C": c, "why": "server died"})
            return
        t0 = time.monotonic()
        lv = self._measure_level(m, srv, c, salt=1 + ci)
        self._level_wall[c] = max(self._level_wall.get(c, 0.0), time.monotonic() - t0)
        self.record["modes"].setdefault(m.name, {})[str(c)] = lv
        log(f"  {m.name:24s} C={c:<4d} {lv['output_tok_per_s']!s:>10} tok/s  tpot50={lv['tpot_p50_ms']} ms "
            f"acc={lv['accept_length']} sw={lv['switches']} failed={lv['failed']}/{lv['requests']}")
        write_json(self.json_path, self.record)

    def _added_trace(self, measured: list[tuple[Mode, ServerProcess]]) -> None:
        """The open-loop trace after the levels: planned once so that every mode gets all of it."""
        plan, info = self.cfg.add_trace, self.record["settings"]["added_trace"]
        left = self.cfg.remaining_s()
        phase_s = plan.fit_phase_s(left, len(measured)) if measured else None
        if phase_s is None:
            why = (f"deadline: {left:.0f} s left, {len(measured)} modes × "
                   f"{plan.seconds_per_mode(plan.min_phase_s):.0f} s needed at the shortest phases")
            log(f"skipping the added trace ({why})")
            self.record["skipped"] += [{"mode": m.name, "C": "trace", "why": why} for m, _ in measured]
            return
        if phase_s < plan.phase_s:
            log(f"added trace: phases shortened to {phase_s} s (requested {plan.phase_s} s) to fit the deadline")
        trace = plan.build(phase_s, seed=self.cfg.seed)
        info.update(phase_s=phase_s, arrivals=len(trace[0]), phases=list(dict.fromkeys(trace[1])))
        params = self._request_params(len(trace[0]), salt=30_000, sampling=self._trace_sampling())
        for m, srv in measured:
            # Planned to fit; a mode that ran long must not push the rest past the device's limit.
            left = self.cfg.remaining_s()
            if left < plan.seconds_per_mode(phase_s) - plan.overhead_s / 2:
                self.record["skipped"].append({"mode": m.name, "C": "trace", "why": f"deadline ({left:.0f} s left)"})
                continue
            if not srv.alive():
                self.record["skipped"].append({"mode": m.name, "C": "trace", "why": "server died"})
                continue
            with phase(self.record, f"trace:{m.name}"):
                self.record["modes"].setdefault(m.name, {})["trace"] = self._measure_trace(m, srv, trace, warm=False,
                                                                                         params=params)
            write_json(self.json_path, self.record)

    def _trace_sampling(self) -> tuple[float, tuple[int, int] | None]:
        """Temperature and output-length range of the added trace: its plan's, else the run's."""
        plan, cfg = self.cfg.add_trace, self.cfg
        temp = plan.temperature if plan.temperature is not None else cfg.temperature
        lens = plan.output_len_range if plan.output_len_range is not None else cfg.output_len_range
        return temp, lens

    def _request_params(self, n: int, salt: int,
                        sampling: tuple[float, tuple[int, int] | None] | None = None) -> dict | list[dict]:
        """Sampling params of a level's n requests: one fixed length, or drawn per request.
        ``sampling``: (temperature, output-length range or None) instead of the run's."""
        cfg = self.cfg
        temp, rng = sampling if sampling is not None else (cfg.temperature, cfg.output_len_range)
        if rng is None:
            return sampling_params(cfg.output_len, temp)
        lo, hi = rng
        lens = output_lengths(n, lo, hi, seed=cfg.output_len_seed * 1_000_003 + salt)
        return [sampling_params(k, temp) for k in lens]

    def _accept_pass(self, m: Mode, srv: ServerProcess) -> None:
        """SGLang's accept length of mode ``m`` per temperature, on held-out prompts."""
        cfg = self.cfg
        c = cfg.accept_concurrency
        out = self.record.setdefault("accept_pass", {}).setdefault(m.name, {})
        asyncio.run(closed_loop(srv.base_url, self.prompts.take(c, salt=40_000), c,
                                sampling_params(cfg.warmup_tokens), desc=f"warm accept {m.name}"))
        for i, t in enumerate(cfg.accept_temperatures):
            if cfg.remaining_s() < cfg.level_margin_s:
                self.record["skipped"].append({"mode": m.name, "C": None, "why": f"deadline (accept pass t={t})"})
                continue
            prompts = self.prompts.take(cfg.accept_requests, salt=41_000 + i)
            results, wall = asyncio.run(closed_loop(srv.base_url, prompts, c, sampling_params(cfg.output_len, t),
                                                    desc=f"accept {m.name} t={t}"))
            lv = summarize(results, wall)
            out[f"{t:g}"] = {k: lv[k] for k in ("accept_length", "output_tok_per_s", "tpot_p50_ms", "requests", "failed")}
            out[f"{t:g}"]["concurrency"] = c
            log(f"  accept {m.name:20s} t={t:g}: {lv['accept_length']} (C={c}, {lv['requests']} requests)")
        # The pair record's headline: greedy accept length per draft shape.
        if cfg.kind == "pair":
            key = f"topk{m.shape['topk']}"
            if "0" in out:
                self.record.setdefault("accept_length", {})[key] = out["0"]["accept_length"]
            sampled = {t: v["accept_length"] for t, v in out.items() if t != "0"}
            if sampled:
                self.record.setdefault("accept_length_sampled", {})[key] = sampled

    def _embed_manifest(self, path: str) -> None:
        """The pair builder's manifest (recipe, timings, 4-gram shares) into the record."""
        try:
            man = json.loads(Path(path).read_text())
        except (OSError, ValueError) as exc:
            self.record["errors"]["pair_manifest"] = f"{path}: {exc}"
            return
        self.record["pair"] = man
        secs = man.get("phase_seconds") or {}
        total = secs.get("total", sum(float(v) for v in secs.values()))
        if secs:
            self.record["build_minutes"] = round(float(total) / 60.0, 2)
        for key in ("repeated_4gram_share", "offline_greedy_accept_topk1_2steps"):
            if key in man:
                self.record[key] = man[key]
        cfg = man.get("config") or {}
        self.record["padded"] = bool(cfg.get("pad_layers") or cfg.get("pad_intermediate"))

    def _add_stats(self, level: dict, sdir: str | None, before: dict | None, keys: tuple[str, ...]) -> None:
        """The dynspec plugin's counters over the level (0 switches for modes without the plugin)."""
        level["switches"] = 0
        if not sdir:
            return
        time.sleep(STATS_SETTLE_S)
        d = delta(before, read_stats(sdir))
        for k in keys:
            level[k] = d[k] if d else None

    def _measure_level(self, m: Mode, srv: ServerProcess, c: int, salt: int) -> dict:
        cfg = self.cfg
        warm = self.prompts.take(c, salt=10_000 + salt)
        asyncio.run(closed_loop(srv.base_url, warm, c, sampling_params(min(cfg.warmup_tokens, cfg.output_len),
                                                                        cfg.temperature), desc=f"warm {m.name} C={c}"))
        sdir = self._stats_dir(m)
        if sdir:
            time.sleep(STATS_SETTLE_S)
        before = read_stats(sdir)
        metrics = srv.metrics()
        n = cfg.requests_for(c)
        prompts = self.prompts.take(n, salt=salt)
        results, wall = asyncio.run(closed_loop(srv.base_url, prompts, c, self._request_params(n, salt),
                                                desc=f"{m.name} C={c}"))
        level = summarize(results, wall)
        level["stage_ms"] = stage_latency(metrics, srv.metrics())
        self._add_stats(level, sdir, before, ("switches", "decode_steps", "steps_off", "steps_on", "policy_errors"))
        if level["failed"]:
            level["errors"] = first_errors(results)
        return level

    def _measure_trace(self, m: Mode, srv: ServerProcess, trace: tuple[list[float], list[str] | None],
                       warm: bool = True, params: dict | list[dict] | None = None) -> dict:
        """One mode on an open-loop trace; ``warm=False`` when the server has just run the levels;
        ``params``: the requests' sampling params (default: the run's temperature and lengths)."""
        cfg = self.cfg
        arrivals, phases = trace
        if warm:
            c = cfg.trace_warmup_concurrency
            asyncio.run(closed_loop(srv.base_url, self.prompts.take(c, salt=20_000), c,
                                    sampling_params(cfg.warmup_tokens, cfg.temperature), desc="warm trace"))
        sdir = self._stats_dir(m)
        if sdir:
            time.sleep(STATS_SETTLE_S)
        before = read_stats(sdir)
        prompts = self.prompts.take(len(arrivals), salt=30_000)
        if params is None:
            params = self._request_params(len(arrivals), salt=30_000)
        metrics = srv.metrics()
        results, wall = asyncio.run(open_loop(srv.base_url, prompts, arrivals, params, phases,
                                              desc=f"trace {m.name}"))
        level = summarize(results, wall)
        level["stage_ms"] = stage_latency(metrics, srv.metrics())
        self._add_stats(level, sdir, before, ("switches", "decode_steps", "steps_off", "steps_on"))
        if phases:
            level["phases"] = summarize_by_phase(results, wall)
        if level["failed"]:
            level["errors"] = first_errors(results)
        log(f"  {m.name:24s} trace {level['output_tok_per_s']} tok/s tpot50={level['tpot_p50_ms']} ms "
            f"failed={level['failed']}/{level['requests']}")
        return level

    def _after_mode(self, m: Mode, srv: ServerProcess) -> None:
        info = {"alive_at_end": srv.alive(), **srv.log_counts()}
        if srv.alive() and m.speculative:
            info["avg_spec_accept_length"] = srv.avg_spec_accept_length()
        stats = read_stats(self._stats_dir(m))
        if stats:
            info["dynspec_stats"] = stats
            if stats.get("worker_path"):
                self.record["mode_info"][m.name]["worker_path"] = stats["worker_path"]
        self.record["server_stats"][m.name] = info

    # ---- summary ---------------------------------------------------------------------
    def _finish(self) -> None:
        rec = self.record
        if self.cfg.pair_manifest:
            # Read last: with --wait-for-weights the builder may still have been writing it at start.
            self._embed_manifest(self.cfg.pair_manifest)
        ref = self._outputs.get(self.cfg.reference)
        if ref is None and self._outputs:
            rec["settings"]["reference_used"] = next(iter(self._outputs))
            ref = self._outputs[rec["settings"]["reference_used"]]
        else:
            rec["settings"]["reference_used"] = self.cfg.reference if ref is not None else None
        for name, outs in self._outputs.items():
            if ref is not None:
                rec["correctness"][name] = corr.compare(ref, outs)
        rec["ratio_to_best_static"] = ratios_to_best_static(rec["modes"])
        summary = summarize_phases(rec["modes"])
        if summary is not None:
            rec["trace_phase_summary"] = summary
        # Top-level spec fields describe the first speculative mode; mode_info has each mode's.
        for info in rec["mode_info"].values():
            if info["kind"] != "off":
                for k in ("worker_path", "topk", "num_steps", "num_draft_tokens"):
                    rec[k] = info[k]
                break
        try:
            validate(rec)
        except ValueError as exc:  # still write what was measured; say what is off
            rec["validation_error"] = str(exc)
            log(f"result does not match the documented shape: {exc}")
        write_json(self.json_path, rec)
        try:
            from .plot import plot_sweep
            if plot_sweep(rec, self.png_path):
                rec["png"] = str(self.png_path)
        except ImportError as exc:  # matplotlib missing: the JSON is what matters
            log(f"no PNG: {exc}")
        log(f"wrote {self.json_path}")


def ratios_to_best_static(modes: dict) -> dict:
    """{mode: {C: tok/s ÷ max(tok/s of non-dynspec modes at C)}}."""
    levels = {c for lv in modes.values() for c in lv}
    best = {}
    for c in levels:
        vals = [lv[c]["output_tok_per_s"] for name, lv in modes.items()
                if not name.startswith("dynspec:") and c in lv and lv[c].get("output_tok_per_s")]
        if vals:
            best[c] = max(vals)
    out = {}
    for name, lv in modes.items():
        out[name] = {c: (round(lv[c]["output_tok_per_s"] / best[c], 4)
                         if c in best and lv[c].get("output_tok_per_s") else None) for c in lv}
    return out
