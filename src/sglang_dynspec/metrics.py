"""Where the controller's numbers go: a stats JSON per process, Prometheus, a JSONL trace.

All writes happen at most about once a second (stats, Prometheus) or are buffered (trace),
so the per-step cost stays a clock read and a comparison.
"""

from __future__ import annotations

import atexit
import json
import logging
import math
import os
import time
from pathlib import Path
from typing import Any

from .hookspecs import hookimpl

logger = logging.getLogger("sglang_dynspec")


class StatsWriter:
    """Rewrites ``<dir>/stats-<pid>.json`` atomically, at most every ``interval`` seconds."""

    def __init__(self, directory: Path, extra: dict[str, Any], interval: float = 1.0):
        self.dir = Path(directory)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.path = self.dir / f"stats-{os.getpid()}.json"
        self.extra = extra
        self.interval = interval
        self._last = float("-inf")  # the first call always writes

    def maybe_write(self, snapshot_fn, force: bool = False) -> None:
        now = time.monotonic()
        if not force and now - self._last < self.interval:
            return
        self._last = now
        data = dict(self.extra)
        data.update(snapshot_fn())
        data["pid"] = os.getpid()
        data["written_at"] = time.time()
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps(data))
        os.replace(tmp, self.path)


class PrometheusExporter:
    """Counters on SGLang's own /metrics (prometheus_client, multiprocess-aware).

    SGLang sets PROMETHEUS_MULTIPROC_DIR when started with --enable-metrics; metrics created
    in the scheduler process then show up on the HTTP server's endpoint.
    """

    def __init__(self, labels: dict[str, str]):
        from prometheus_client import Counter, Gauge

        names = list(labels)
        self.labels = labels
        self.steps = Counter("sglang_dynspec_decode_steps", "Decode steps by mode", names + ["mode"])
        self.switches = Counter("sglang_dynspec_switches", "Mode switches", names)
        self.errors = Counter("sglang_dynspec_policy_errors", "Policy failures (safe mode)", names)
        self.wasted = Counter("sglang_dynspec_wasted_draft_tokens", "Drafted but rejected tokens", names)
        self.mode = Gauge("sglang_dynspec_mode", "1 speculating, 0 not", names, multiprocess_mode="mostrecent")
        self.accept = Gauge(
            "sglang_dynspec_accept_length", "Accept length estimate", names, multiprocess_mode="mostrecent"
        )
        self.cost = Gauge(
            "sglang_dynspec_step_cost_seconds", "Agreed step cost estimate at the current batch size",
            names + ["mode"], multiprocess_mode="mostrecent",
        )
        # What the policy believes right now (policies that explain themselves, e.g. goodput).
        self.estimate = Gauge(
            "sglang_dynspec_estimated_output_tokens_per_second",
            "The policy's estimate of each mode's output tok/s at the current batch size, prefills included",
            names + ["mode"], multiprocess_mode="mostrecent",
        )
        self.demand = Gauge(
            "sglang_dynspec_demand_output_tokens_per_second",
            "Output tok/s the arriving requests ask for, as the policy measures them",
            names, multiprocess_mode="mostrecent",
        )
        self._last: dict[str, float] = {}

    def _inc(self, counter, key: str, value: float, **extra) -> None:
        delta = value - self._last.get(key, 0.0)
        if delta > 0:
            counter.labels(**self.labels, **extra).inc(delta)
        self._last[key] = value

    def update(self, snap: dict[str, Any], draft_tokens_per_step: int | None) -> None:
        # A resume step was decided "on" but ran without speculation (after light off-steps).
        resume = snap.get("steps_resume", 0)
        self._inc(self.steps, "on", snap["steps_on"] - resume, mode="on")
        self._inc(self.steps, "off", snap["steps_off"], mode="off")
        self._inc(self.steps, "resume", resume, mode="resume")
        self._inc(self.switches, "switches", snap["switches"])
        self._inc(self.errors, "errors", snap["policy_errors"])
        if draft_tokens_per_step:
            wasted = snap["spec_rows"] * draft_tokens_per_step - snap["accepted_drafts"]
            self._inc(self.wasted, "wasted", max(wasted, 0))
        self.mode.labels(**self.labels).set(1 if snap["mode"] == "on" else 0)
        if snap.get("accept_length") is not None:
            self.accept.labels(**self.labels).set(snap["accept_length"])
        est = snap.get("estimates") or {}
        for mode in ("on", "off"):
            c = snap.get(f"cost_{mode}_s")
            if c is not None:
                self.cost.labels(**self.labels, mode=mode).set(c)
            e = est.get(f"{mode}_tok_s")
            if e is not None:
                self.estimate.labels(**self.labels, mode=mode).set(e)
        if est.get("demand_tok_s") is not None:
            self.demand.labels(**self.labels).set(est["demand_tok_s"])


def _json_value(v) -> str:
    """JSON of a figure: plain numbers and None without json.dumps (a third of the trace's cost per
    step, which a speculative bs-1 step on the H200 pays in full)."""
    if v is None:
        return "null"
    t = type(v)
    if t is int or (t is float and math.isfinite(v)):
        return repr(v)
    return json.dumps(v)


class TraceObserver:
    """A pluggy observer writing one JSON line per decode step, up to a size cap."""

    def __init__(self, path: Path, max_bytes: int):
        self.path = Path(f"{path}.{os.getpid()}") if not str(path).endswith(".jsonl") else Path(
            str(path)[: -len(".jsonl")] + f".{os.getpid()}.jsonl"
        )
        self.max_bytes = max_bytes
        # Opened at the first decision: every SGLang process loads the plugin, only schedulers decide.
        self._f = None
        self._written = 0
        self._full = False
        self._flushed_at = 0.0

    @hookimpl
    def dynspec_decision(self, record):
        if self._full:
            return
        est = record.estimates
        extra = ""
        if est:
            # the policy's figures: estimated tok/s per mode and why it decided so
            extra = "".join(f',"{k}":{_json_value(v)}' for k, v in est.items())
        line = (
            f'{{"step":{record.step},"bs":{record.decode_bs},"running":{record.running},'
            f'"waiting":{record.waiting},"on":{"true" if record.speculate else "false"},'
            f'"acc":{record.accept_length:.4f},"t":{record.t:.6f},"new":{record.admitted},'
            f'"prefill_ms":{record.prefill_s * 1e3:.3f},"res_rows":{record.result_rows},'
            f'"res_acc":{record.result_accepted}{extra}'
        )
        if record.greedy is not None:
            line += ',"greedy":' + ("true" if record.greedy else "false")
        if record.results:
            line += ',"res":' + json.dumps([list(r) for r in record.results], separators=(",", ":"))
        # The first line also carries what the re-drive needs beyond the steps.
        line += f',"vr":{json.dumps(record.verify_rows)}}}\n' if self._written == 0 else "}\n"
        self._written += len(line)
        if self._written > self.max_bytes:
            self._full = True
            if self._f is not None:
                self._f.flush()
            logger.warning("sglang-dynspec: trace %s reached its size cap; no more lines", self.path)
            return
        if self._f is None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._f = open(self.path, "w", buffering=1 << 16)
            atexit.register(self.close)
        self._f.write(line)
        now = time.monotonic()
        if now - self._flushed_at > 1.0:
            # A server is usually killed, not shut down: unflushed lines would be lost
            # (the first traced pair run lost its last level that way).
            self._f.flush()
            self._flushed_at = now

    def close(self) -> None:
        if self._f is not None and not self._f.closed:
            self._f.close()
