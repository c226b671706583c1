"""Replay recorded step costs and acceptance through any policy, on the CPU.

A *profile* holds, per decode batch size, the measured step time of a plain decode server
(``plain``), of a speculative step (``spec``) and of a dynspec off-step (``offstep``, plain
decode + draft sync), plus the accept length.  The simulator runs a closed loop of C
requests (or a phase-changing sequence of C values), asks the policy through the real
Controller with a simulated clock, and projects output tokens per second.  Prefill time is
not modelled; ``check_against`` reports how far projections land from a measured run.
"""

from __future__ import annotations

import bisect
import json
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

from .controller import Controller
from .errors import ConfigError
from .policies import build_policy

BUILTIN_PROFILES = {
    "h200-trained-pair": "profile-h200-trained-pair.json",
    "h200-dummy-0512": "profile-h200-dummy-0512.json",
    "h200-pair-0512": "profile-h200-pair-0512.json",
}


@dataclass
class Profile:
    name: str
    accept_length: float
    points: dict[str, list[tuple[int, float]]]  # series -> sorted (bs, seconds)
    source: str = ""
    notes: str = ""

    def time(self, series: str, bs: int) -> float:
        """Piecewise-linear step time at ``bs``; linear extrapolation past the ends."""
        pts = self.points[series]
        xs = [p[0] for p in pts]
        if len(pts) == 1:
            return pts[0][1]
        i = bisect.bisect_left(xs, bs)
        i = min(max(i, 1), len(pts) - 1)
        (x0, y0), (x1, y1) = pts[i - 1], pts[i]
        y = y0 + (y1 - y0) * (bs - x0) / (x1 - x0)
        return max(y, 1e-6)


def read_builtin_or_path(spec: str, builtins: dict[str, str], what: str) -> tuple[bytes, str]:
    """(bytes, origin) of a built-in data file named ``spec``, or of the file at path ``spec``."""
    if spec in builtins:
        return resources.files("sglang_dynspec.data").joinpath(builtins[spec]).read_bytes(), f"built-in {spec}"
    try:
        return Path(spec).read_bytes(), spec
    except OSError as e:
        raise ConfigError(f"{what} ({spec!r}): not a built-in ({', '.join(builtins)}) and not readable: {e}") from None


def load_profile(spec: str) -> Profile:
    """A built-in profile name or a path to a profile JSON."""
    text, origin = read_builtin_or_path(spec, BUILTIN_PROFILES, "profile")
    try:
        raw = json.loads(text)
    except json.JSONDecodeError as e:
        raise ConfigError(f"profile ({origin}): not valid JSON: {e}") from None
    return parse_profile(raw, origin)


def parse_profile(raw: dict[str, Any], origin: str = "profile") -> Profile:
    def bad(field_name, msg):
        raise ConfigError(f"profile.{field_name} ({origin}): {msg}")

    if not isinstance(raw, dict):
        raise ConfigError(f"profile ({origin}): must be a JSON object")
    acc = raw.get("accept_length")
    if not isinstance(acc, (int, float)) or acc < 1.0:
        bad("accept_length", f"must be a number >= 1.0, got {acc!r}")
    series = raw.get("step_seconds")
    if not isinstance(series, dict):
        bad("step_seconds", "must be an object {plain|spec|offstep: {bs: seconds}}")
    points = {}
    for key in ("plain", "spec", "offstep"):
        table = series.get(key)
        if not isinstance(table, dict) or not table:
            bad(f"step_seconds.{key}", "missing or empty")
        pts = []
        for bs, sec in table.items():
            try:
                b = int(bs)
            except ValueError:
                bad(f"step_seconds.{key}", f"batch size {bs!r} is not an integer")
            if not isinstance(sec, (int, float)) or sec <= 0:
                bad(f"step_seconds.{key}.{bs}", f"must be a positive number of seconds, got {sec!r}")
            pts.append((b, float(sec)))
        points[key] = sorted(pts)
    unknown = set(series) - {"plain", "spec", "offstep"}
    if unknown:
        bad("step_seconds", f"unknown series {sorted(unknown)}")
    return Profile(raw.get("name", origin), float(acc), points, raw.get("source", ""), raw.get("notes", ""))


@dataclass
class Phase:
    concurrency: int
    seconds: float


@dataclass
class RunResult:
    policy: str
    tokens: float = 0.0
    seconds: float = 0.0
    steps_on: int = 0
    steps_off: int = 0
    switches: int = 0
    per_phase: list[dict] = field(default_factory=list)

    @property
    def tok_per_s(self) -> float:
        return self.tokens / self.seconds if self.seconds else 0.0


class SimClock:
    """A clock the replay advances by the step times it charges."""

    def __init__(self):
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def simulate(profile: Profile, policy_spec: str, phases: list[Phase], *, policy_args: dict | None = None,
             output_len: int = 128, static: str | None = None, prefill_s: float = 0.0,
             requests: int | None = None, state: dict | None = None) -> RunResult:
    """Run the phases through a policy (or a static server: ``static`` = "plain" | "spec").

    ``prefill_s``: time a full refill of the batch costs (e.g. a measured TTFT), charged in
    proportion to the requests admitted.  ``requests``: stop after that many complete (one
    phase only) instead of after the phase's duration.  ``state``: a dict carried between
    calls so that one server's controller (its learnt costs) spans several runs.
    """
    state = {} if state is None else state
    clock = state.setdefault("clock", SimClock())
    ctl = None
    if static is None:
        ctl = state.get("controller")
        if ctl is None:
            ctl = state["controller"] = Controller(build_policy(policy_spec, policy_args or {}), clock=clock)
        ctl.on_idle()  # a new run starts after an idle gap
    t_start = clock.t
    res = RunResult(static or policy_spec)
    acc = profile.accept_length
    prev = None
    for ph in phases:
        # Requests in flight: tokens still owed each; a finished one is replaced at once (closed loop).
        owed = [float(output_len)] * ph.concurrency
        t_end = clock.t + ph.seconds
        tok0, t0 = res.tokens, clock.t
        done = 0
        clock.t += prefill_s  # the first admission
        while (done < requests) if requests is not None else (clock.t < t_end):
            bs = len(owed)
            if ctl is not None:
                on = ctl.on_decode(bs, bs, 0)
            else:
                on = static == "spec"
            if on:
                dt = profile.time("spec", bs)
                got = acc
            else:
                dt = profile.time("offstep" if ctl is not None else "plain", bs)
                got = 1.0
            clock.t += dt
            produced = 0.0
            refilled = 0
            for i in range(bs):
                take = min(got, owed[i])
                owed[i] -= take
                produced += take
                if owed[i] <= 1e-9:
                    owed[i] = float(output_len)
                    refilled += 1
            res.tokens += produced
            done += refilled
            if refilled and prefill_s and (requests is None or done < requests):
                if ctl is not None:
                    ctl.on_other()  # a prefill batch runs between two decode steps
                clock.t += prefill_s * refilled / bs
            if ctl is not None and on:
                ctl.on_result(bs, int(round((acc - 1.0) * bs)))
            res.steps_on += on
            res.steps_off += not on
            res.switches += prev is not None and on != prev
            prev = on
        span = clock.t - t0
        res.per_phase.append({"C": ph.concurrency, "seconds": round(span, 3),
                              "tok_per_s": round((res.tokens - tok0) / span, 1) if span else 0.0})
    res.seconds = clock.t - t_start
    return res


def phase_trace(low: int, high: int, seconds: float, cycles: int) -> list[Phase]:
    out = []
    for _ in range(cycles):
        out += [Phase(low, seconds), Phase(high, seconds)]
    return out


def compare(profile: Profile, policies: list[str], phases: list[Phase], policy_args: dict | None = None,
            output_len: int = 128) -> list[RunResult]:
    runs = [simulate(profile, "", phases, static="plain", output_len=output_len),
            simulate(profile, "", phases, static="spec", output_len=output_len)]
    for p in policies:
        runs.append(simulate(profile, p, phases, policy_args=policy_args if len(policies) == 1 else None,
                             output_len=output_len))
    return runs


# --- profiles from harness results ------------------------------------------------------

def profile_from_sweep(result: dict, spec_mode: str = "on", off_mode: str = "off",
                       offstep_mode: str = "dynspec:never") -> Profile:
    """Step times from a harness sweep JSON: TPOT p50 of plain/off-step servers; spec = TPOT × accept."""
    modes = result.get("modes", {})
    for m in (spec_mode, off_mode, offstep_mode):
        if m not in modes:
            raise ConfigError(f"result.modes: no mode {m!r} (have {sorted(modes)})")
    accs = [v["accept_length"] for v in modes[spec_mode].values() if v.get("accept_length")]
    acc = sum(accs) / len(accs) if accs else 1.0
    step = {
        "plain": {c: v["tpot_p50_ms"] / 1e3 for c, v in modes[off_mode].items()},
        "spec": {c: v["tpot_p50_ms"] * acc / 1e3 for c, v in modes[spec_mode].items()},
        "offstep": {c: v["tpot_p50_ms"] / 1e3 for c, v in modes[offstep_mode].items()},
    }
    return parse_profile({"name": f"from {result.get('command', 'sweep')}", "accept_length": max(acc, 1.0),
                          "step_seconds": step}, "sweep result")


def check_against(result: dict, profile: Profile, mode_policy: dict[str, str], output_len: int = 128) -> list[dict]:
    """Projected vs measured output tok/s for each (mode, C) of a sweep result.

    Each level is replayed as the harness ran it: the same number of requests at
    concurrency C, a refill costing that level's measured TTFT p50.
    """
    rows = []
    for mode, policy in mode_policy.items():
        state: dict = {}  # levels ran one after another on one server: keep its controller
        for c, v in sorted(result["modes"].get(mode, {}).items(), key=lambda kv: int(kv[0])):
            phases = [Phase(int(c), 0.0)]
            kw = dict(output_len=output_len, prefill_s=(v.get("ttft_p50_ms") or 0.0) / 1e3,
                      requests=int(v.get("requests") or c))
            if policy in ("plain", "spec"):
                sim = simulate(profile, "", phases, static=policy, **kw)
            else:
                sim = simulate(profile, policy, phases, state=state, **kw)
            measured = v["output_tok_per_s"]
            rows.append({"mode": mode, "C": int(c), "measured": measured, "projected": round(sim.tok_per_s, 1),
                         "error": round(sim.tok_per_s / measured - 1.0, 4) if measured else None})
    return rows
