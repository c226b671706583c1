"""Sweep driver: per wave, start the wave's servers together, then measure one mode at a time."""

from __future__ import annotations

import asyncio
import json
import os
import math
import time
from dataclasses import dataclass, field
from pathlib import Path

from . import correctness as corr
from .loadgen import closed_loop, first_errors, open_loop, sampling_params, summarize, summarize_by_phase
from .modes import Mode, ServerConfig, parse_mode, stats_dir_for, worker_path_guess
from .prompts import PromptSource
from .results import base_record, phase, validate, write_json
from .server import ServerProcess
from .stats import delta, read_stats
from .wave import log, running_modes

# The plugin rewrites its stats file about once per second; tests shorten the wait.
STATS_SETTLE_S = float(os.environ.get("DYNSPEC_STATS_SETTLE_S", "1.5"))


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
                "temperature": cfg.temperature, "requests_factor": cfg.requests_factor,
                "max_requests": cfg.max_requests, "warmup_tokens": cfg.warmup_tokens,
                "waves": cfg.waves, "reference": cfg.reference,
                "deterministic": cfg.server.deterministic, "policy_args": cfg.server.policy_args,
                "correctness": {"prompts": cfg.correctness_prompts, "new_tokens": cfg.correctness_tokens,
                                "concurrency": cfg.correctness_concurrency},
            },
            "modes": {}, "correctness": {}, "mode_info": {}, "server_stats": {},
            "ratio_to_best_static": {}, "skipped": [], "errors": {},
        })
        self._outputs: dict[str, list] = {}
        self._next_port = cfg.base_port

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
            for m in modes:
                srv = live.get(m.name)
                if m.name in self.cfg.accept_only:
                    if srv is not None:
                        self._after_mode(m, srv)
                    continue
                if srv is not None:
                    with phase(self.record, f"measure:{m.name}"):
                        self._measure_mode(m, srv)
                    self._after_mode(m, srv)
                write_json(self.json_path, self.record)

    # ---- one mode --------------------------------------------------------------------
    def _mode_info(self, m: Mode) -> dict:
        shape = m.shape or {}
        return {"kind": m.kind, "policy": m.policy, "variants": m.variants,
                "worker_path": worker_path_guess(m, self.record.get("sglang_version")),
                "topk": shape.get("topk"), "num_steps": shape.get("num_steps"),
                "num_draft_tokens": shape.get("num_draft_tokens"), "overlap": m.overlap}

    def _stats_dir(self, m: Mode) -> str | None:
        if m.kind != "dynspec" or not self.cfg.server.stats_root:
            return None
        return stats_dir_for(self.cfg.server.stats_root, m.name)

    def _measure_mode(self, m: Mode, srv: ServerProcess) -> None:
        cfg = self.cfg
        base = srv.base_url
        with phase(self.record, f"correctness:{m.name}"):
            self._outputs[m.name] = corr.collect_outputs(
                base, self.corr_prompts, cfg.correctness_tokens, cfg.correctness_concurrency)
        levels = self.record["modes"].setdefault(m.name, {})
        if cfg.trace is not None:
            levels["trace"] = self._measure_trace(m, srv)
            return
        for ci, c in enumerate(cfg.concurrency):
            if cfg.remaining_s() < cfg.level_margin_s:
                log(f"deadline near: skipping {m.name} C={c}")
                self.record["skipped"].append({"mode": m.name, "C": c, "why": "deadline"})
                continue
            if not srv.alive():
                self.record["skipped"].append({"mode": m.name, "C": c, "why": "server died"})
                continue
            levels[str(c)] = self._measure_level(m, srv, c, salt=1 + ci)
            lv = levels[str(c)]
            log(f"  {m.name:24s} C={c:<4d} {lv['output_tok_per_s']!s:>10} tok/s  tpot50={lv['tpot_p50_ms']} ms "
                 f"acc={lv['accept_length']} sw={lv['switches']} failed={lv['failed']}/{lv['requests']}")
            write_json(self.json_path, self.record)

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

    def _measure_level(self, m: Mode, srv: ServerProcess, c: int, salt: int) -> dict:
        cfg = self.cfg
        params = sampling_params(cfg.output_len, cfg.temperature)
        warm = self.prompts.take(c, salt=10_000 + salt)
        asyncio.run(closed_loop(srv.base_url, warm, c, sampling_params(min(cfg.warmup_tokens, cfg.output_len),
                                                                        cfg.temperature), desc=f"warm {m.name} C={c}"))
        sdir = self._stats_dir(m)
        if sdir:
            time.sleep(STATS_SETTLE_S)
        before = read_stats(sdir)
        prompts = self.prompts.take(cfg.requests_for(c), salt=salt)
        results, wall = asyncio.run(closed_loop(srv.base_url, prompts, c, params, desc=f"{m.name} C={c}"))
        level = summarize(results, wall)
        level["switches"] = 0
        if sdir:
            time.sleep(STATS_SETTLE_S)
            d = delta(before, read_stats(sdir))
            level["switches"] = d["switches"] if d else None
            level["decode_steps"] = d["decode_steps"] if d else None
            level["steps_off"] = d["steps_off"] if d else None
            level["steps_on"] = d["steps_on"] if d else None
            level["policy_errors"] = d["policy_errors"] if d else None
            level["off_not_applied"] = d["off_not_applied"] if d else None
        if level["failed"]:
            level["errors"] = first_errors(results)
        return level

    def _measure_trace(self, m: Mode, srv: ServerProcess) -> dict:
        cfg = self.cfg
        arrivals, phases = cfg.trace
        c = cfg.trace_warmup_concurrency
        asyncio.run(closed_loop(srv.base_url, self.prompts.take(c, salt=20_000), c,
                                sampling_params(cfg.warmup_tokens, cfg.temperature), desc="warm trace"))
        sdir = self._stats_dir(m)
        if sdir:
            time.sleep(STATS_SETTLE_S)
        before = read_stats(sdir)
        prompts = self.prompts.take(len(arrivals), salt=30_000)
        results, wall = asyncio.run(open_loop(srv.base_url, prompts, arrivals,
                                              sampling_params(cfg.output_len, cfg.temperature), phases,
                                              desc=f"trace {m.name}"))
        level = summarize(results, wall)
        level["switches"] = 0
        if sdir:
            time.sleep(STATS_SETTLE_S)
            d = delta(before, read_stats(sdir))
            level["switches"] = d["switches"] if d else None
            level["decode_steps"] = d["decode_steps"] if d else None
        if phases:
            level["phases"] = summarize_by_phase(results, wall)
        log(f"  {m.name:24s} trace {level['output_tok_per_s']} tok/s failed={level['failed']}/{level['requests']}")
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
