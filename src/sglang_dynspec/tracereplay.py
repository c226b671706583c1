"""Replay a policy on decision traces recorded on a GPU, on the CPU.

A *trace set* (made by ``python -m benchmarks.dynspec_bench.traceset``) holds, per load level C,
every decode step of a server that always speculated (``on``) and of one that never did
(``off``): batch size, wall time to the next decode step (prefills included) and the acceptance
estimate.  Replaying a static mode walks its own trace and reproduces its measured throughput.
Replaying a policy runs the real Controller on a simulated clock: each step is taken from the
trace of the mode the policy chose, at the same share of the level's tokens, so a policy that
switches jumps between the two traces.

What it cannot show: how switching itself changes later steps.  A plain stretch entered after
speculation is charged the `off` trace's prefills at that point, which kept the batching of a
server that never speculated; so the projection is optimistic for policies that switch often.
"""

from __future__ import annotations

import gzip
import json
from dataclasses import dataclass, field
from statistics import median
from typing import Any

from .controller import Controller, StepMode
from .errors import ConfigError
from .policies import build_policy
from .replay import SimClock, read_builtin_or_path

BUILTIN_TRACE_SETS = {"h200-pair-0512": "traces-h200-pair-0512.json.gz"}
DECODE_SHARE_CAP = 1.25  # a step longer than this x the level's median interval ran prefills


@dataclass
class Step:
    bs: int
    seconds: float  # decode part
    prefill_s: float  # prefill batches after it
    rows: int  # requests those prefills admitted
    tokens: float


@dataclass
class LevelTrace:
    concurrency: int
    mode: str
    requests: int
    completion_tokens: int
    measured_tok_s: float
    ttft_s: float
    steps: list[Step]

    @property
    def decode_tokens(self) -> float:
        return sum(s.tokens for s in self.steps)


@dataclass
class TraceSet:
    name: str
    source: str
    levels: dict[int, dict[str, LevelTrace]]
    incomplete: list[str] = field(default_factory=list)
    meta: dict[str, Any] = field(default_factory=dict)


def row_tokens(row: list) -> float:
    """Tokens a trace row ``[bs, dt_ms, on, acc]`` produced, by the acceptance estimate of its time
    (exact totals come from the level's completion tokens)."""
    return row[0] * (row[3] if row[2] and row[3] >= 1.0 else 1.0)


def _level(c: int, mode: str, raw: dict) -> LevelTrace:
    rows = raw["steps"]
    med = median(r[1] for r in rows) / 1e3
    tokens = raw["completion_tokens"] - raw["requests"]  # first tokens come from the prefills
    weights = [row_tokens(r) for r in rows]
    scale = tokens / sum(weights) if sum(weights) else 1.0
    extra = [max(r[1] / 1e3 - DECODE_SHARE_CAP * med, 0.0) for r in rows]
    # The level's first C requests were admitted before its first step; the rest replace
    # finished ones, spread over the steps in proportion to their prefill time.
    admitted = max(raw["requests"] - c, 0)
    total_extra = sum(extra)
    steps, carry = [], 0.0
    for r, w, e in zip(rows, weights, extra):
        share = admitted * e / total_extra if total_extra else 0.0
        carry += share
        n = int(carry + 1e-9)
        carry -= n
        steps.append(Step(r[0], r[1] / 1e3 - e, e, n, w * scale))
    ttft = (raw.get("ttft_p50_ms") or 0.0) / 1e3
    return LevelTrace(c, mode, raw["requests"], raw["completion_tokens"], raw["measured_tok_s"], ttft, steps)


def load_trace_set(spec: str) -> TraceSet:
    """A built-in trace set name or a path (.json or .json.gz)."""
    data, origin = read_builtin_or_path(spec, BUILTIN_TRACE_SETS, "--traces")
    try:
        raw = json.loads(gzip.decompress(data) if data[:2] == b"\x1f\x8b" else data)
        levels: dict[int, dict[str, LevelTrace]] = {}
        incomplete = []
        for c, modes in raw["levels"].items():
            for mode, lv in modes.items():
                if not lv.get("complete", True):
                    incomplete.append(f"C={c} {mode}")
                    continue
                levels.setdefault(int(c), {})[mode] = _level(int(c), mode, lv)
    except (ValueError, KeyError, TypeError, IndexError) as e:
        raise ConfigError(f"--traces ({origin}): not a trace set: {type(e).__name__}: {e}") from None
    meta = {k: raw.get(k) for k in ("git_commit", "sglang_version", "gpu", "model", "command", "output_len",
                                     "verify_rows")}
    return TraceSet(raw.get("name", origin), origin, dict(sorted(levels.items())), incomplete, meta)


@dataclass
class LevelResult:
    concurrency: int
    tok_s: float
    steps_on: int = 0
    steps_off: int = 0
    switches: int = 0
    why: dict[str, int] = field(default_factory=dict)

    @property
    def share_on(self) -> float:
        n = self.steps_on + self.steps_off
        return self.steps_on / n if n else 0.0


def replay_static(lv: LevelTrace) -> float:
    """Output tok/s of a static mode from its own trace: the steps, plus the first prefill
    (TTFT p50) before them."""
    seconds = sum(s.seconds + s.prefill_s for s in lv.steps) + lv.ttft_s
    return lv.completion_tokens / seconds


def replay_policy(ts: TraceSet, policy: str, policy_args: dict | None = None) -> list[LevelResult]:
    """Every level in order on one controller, as one server ran them (idle between levels)."""
    clock = SimClock()
    ctl = Controller(build_policy(policy, policy_args or {}), clock=clock, verify_rows=ts.meta.get("verify_rows"))
    out = []
    for c, modes in ts.levels.items():
        if "on" not in modes or "off" not in modes:
            continue
        out.append(_replay_level(ctl, clock, modes, c))
    return out


def _replay_level(ctl: Controller, clock: SimClock, modes: dict[str, LevelTrace], c: int) -> LevelResult:
    traces = {True: modes["on"], False: modes["off"]}
    totals = {m: lv.decode_tokens for m, lv in traces.items()}
    cursor = {True: 0, False: 0}
    done = {True: 0.0, False: 0.0}  # tokens walked in each trace
    res = LevelResult(c, 0.0)
    ctl.on_idle()
    t0 = clock.t
    first = None
    progress = 0.0  # share of the level's decode tokens produced
    mode = True if ctl.prev is None else ctl.prev
    ctl.on_other(min(c, traces[mode].requests))  # the level's first admission, after an idle gap
    clock.t += traces[mode].ttft_s
    while progress < 1.0 - 1e-9:
        lv = traces[mode]
        i = _seek(lv, cursor, done, mode, progress * totals[mode])
        if i is None:
            break
        on = ctl.on_decode(lv.steps[i].bs, lv.steps[i].bs, 0)
        if first is None:
            first = on
        lv = traces[on]
        i = _seek(lv, cursor, done, on, progress * totals[on])
        if i is None:
            break
        s = lv.steps[i]
        clock.t += s.seconds
        if s.prefill_s > 0 or s.rows:
            ctl.on_other(s.rows)
            clock.t += s.prefill_s
        if on:
            acc_rows = s.tokens - s.bs
            ctl.on_result(s.bs, int(round(acc_rows)))
        progress += s.tokens / totals[on]
        done[on] += s.tokens
        cursor[on] = i + 1
        res.steps_on += on
        res.steps_off += not on
        res.switches += on != mode
        why = (ctl.estimates() or {}).get("why", "-")
        res.why[why] = res.why.get(why, 0) + 1
        mode = on
    lv0 = traces[first if first is not None else True]
    res.tok_s = lv0.completion_tokens / (clock.t - t0)
    return res


def _seek(lv: LevelTrace, cursor: dict, done: dict, mode: bool, target: float) -> int | None:
    """Index of the step of ``lv`` at which ``target`` of its decode tokens have been produced."""
    i, walked = cursor[mode], done[mode]
    while i < len(lv.steps) and walked + lv.steps[i].tokens <= target + 1e-9:
        walked += lv.steps[i].tokens
        i += 1
    cursor[mode], done[mode] = i, walked
    return i if i < len(lv.steps) else None


def report(ts: TraceSet, policies: list[str], policy_args: dict | None = None) -> dict:
    """Per level: measured and reproduced static throughput, and each policy's projection."""
    rows: dict[int, dict] = {}
    for c, modes in ts.levels.items():
        row = rows[c] = {}
        for m, lv in modes.items():
            rep = replay_static(lv)
            row[m] = {"measured": lv.measured_tok_s, "replayed": round(rep, 1),
                      "error": round(rep / lv.measured_tok_s - 1.0, 4)}
    for p in policies:
        for r in replay_policy(ts, p, policy_args):
            row = rows[r.concurrency]
            # against the static modes as this same replay reproduces them
            best = max(row[m]["replayed"] for m in ("on", "off"))
            row[f"dynspec:{p}"] = {"projected": round(r.tok_s, 1), "ratio_to_best_static": round(r.tok_s / best, 3),
                                   "share_on": round(r.share_on, 3), "switches": r.switches, "why": r.why}
    return rows


def draw(rows: dict[int, dict], policies: list[str], path: str, title: str = "") -> None:
    """Measured static modes beside the replay: output tok/s per level, and each projected policy."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise ConfigError("--png: needs matplotlib (pip install matplotlib)") from None
    cs = list(rows)
    fig, (ax, ax2) = plt.subplots(2, 1, figsize=(8, 7), sharex=True, gridspec_kw={"height_ratios": [3, 1.4]})
    for m, style in (("off", "o-"), ("on", "s-")):
        ax.plot(cs, [rows[c][m]["measured"] for c in cs], style, label=f"{m}: measured")
        ax.plot(cs, [rows[c][m]["replayed"] for c in cs], style[0] + ":", label=f"{m}: replayed")
    for p in policies:
        ys = [rows[c].get(p, {}).get("projected") for c in cs]
        ax.plot(cs, ys, "^--", label=f"{p}: projected")
        ax2.plot(cs, [rows[c].get(p, {}).get("ratio_to_best_static") for c in cs], "^--", label=p)
    ax2.axhline(0.97, color="grey", lw=0.8, ls=":")
    ax.set_xscale("log")
    ax.set_ylabel("output tok/s")
    ax.legend(fontsize=8)
    ax.set_title(title)
    ax2.set_xlabel("concurrency C")
    ax2.set_ylabel("÷ best static")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


# --- one server's own trace, decision by decision ----------------------------------------------

GAP_S = 3.0  # a pause this long between decode steps separates two runs (load levels) of one server


@dataclass
class RedriveStep:
    """One recorded decode step and what the re-driven policy decided there."""

    t: float
    bs: int
    recorded: bool
    decided: bool
    why: str
    estimates: dict  # the policy's own figures (Policy.explain) at this step


@dataclass
class RedriveResult:
    steps: list[RedriveStep]
    exact_acceptance: bool  # the trace carried the results the controller saw (res_rows / res_acc)

    @property
    def agreement(self) -> float:
        return sum(s.recorded == s.decided for s in self.steps) / len(self.steps) if self.steps else 0.0

    def runs(self, gap_s: float = GAP_S) -> list[list[RedriveStep]]:
        """The steps split where the server paused for ``gap_s`` or longer (the harness's levels)."""
        out: list[list[RedriveStep]] = []
        for s in self.steps:
            if not out or s.t - out[-1][-1].t >= gap_s:
                out.append([])
            out[-1].append(s)
        return out


def load_server_trace(path: str) -> list[dict]:
    """The JSONL decision trace one dynspec server wrote (SGLANG_DYNSPEC_TRACE_FILE)."""
    rows = []
    try:
        with open(path) as fh:
            for n, line in enumerate(fh, 1):
                if line.strip():
                    rows.append(json.loads(line))
    except OSError as e:
        raise ConfigError(f"--server-trace ({path}): {e.strerror or e}") from None
    except ValueError as e:
        raise ConfigError(f"--server-trace ({path}): line {n} is not JSON: {e}") from None
    need = ("bs", "running", "waiting", "on", "acc", "t")
    for n, r in enumerate(rows, 1):
        missing = [k for k in need if k not in r]
        if missing:
            raise ConfigError(f"--server-trace ({path}): line {n} lacks {', '.join(missing)}; "
                              "not a dynspec decision trace")
    if not rows:
        raise ConfigError(f"--server-trace ({path}): no steps")
    return rows


class _FollowRecorded:
    """Asks ``policy`` at every step and keeps its answer, but hands the controller the decision
    the server recorded: costs are then charged to the modes the server really ran."""

    def __init__(self, policy):
        self.policy = policy
        self.name = getattr(policy, "name", type(policy).__name__)
        self.recorded = True
        self.answer: bool | None = None

    def decide(self, x) -> bool:
        self.answer = bool(self.policy.decide(x))
        return self.recorded

    def explain(self) -> dict:
        explain = getattr(self.policy, "explain", None)
        return explain() if explain is not None else {}


def redrive(rows: list[dict], policy: str, policy_args: dict | None = None,
            verify_rows: int | None = None, follow: bool = False) -> RedriveResult:
    """Feed a server's recorded inputs (batch sizes, clock, prefills, speculative results) to a fresh
    controller with ``policy``, step by step, and record what it decides.

    With the policy that server ran, the decisions should match the recorded ones: the check that
    the trace holds everything the policy saw.  With another policy or other arguments, it shows
    what that one would have decided *at the same inputs* — not what would have followed, since a
    different decision changes the batches and timings after it.  Traces written before the
    results were recorded (no ``res_rows``) get the acceptance back from the next step's estimate.
    ``verify_rows``: the server's speculative_num_draft_tokens, by default the trace's (its first line
    has it since traces recorded it, "vr").

    ``follow``: the controller applies the recorded decisions while the policy is still asked at
    every step (its answers are the re-driven ones).  The costs, and the estimates built on them, are
    then the server's own all along: a decision that differs (a near-tie that the trace's rounding
    of the clock tips the other way) no longer charges every later interval to the other mode.  For
    checking a policy's estimates against what each mode delivered on that server.
    """
    clock = SimClock()
    if verify_rows is None:
        verify_rows = rows[0].get("vr")
    asked = build_policy(policy, policy_args or {})
    follower = _FollowRecorded(asked) if follow else None
    ctl = Controller(follower or asked, clock=clock, deadline_s=float("inf"), verify_rows=verify_rows)
    exact = "res_rows" in rows[0]
    out = []
    for i, r in enumerate(rows):
        # (no on_idle at pauses: the server has none; its controller drops long intervals itself)
        if exact and r.get("res"):  # several results since the previous step, each a sample
            for rows_, acc in r["res"]:
                ctl.on_result(int(rows_), int(acc))  # the previous decision's sampling regime
        elif exact and r.get("res_rows"):
            ctl.on_result(int(r["res_rows"]), int(r["res_acc"]))
        if r.get("new"):
            clock.t = r["t"] - (r.get("prefill_ms") or 0.0) / 1e3
            ctl.on_other(int(r["new"]))
        clock.t = r["t"]
        if follower is not None:
            follower.recorded = bool(r["on"])
        # traces before 2026-12-04 have no "greedy": one regime
        mode = ctl.step_mode(int(r["bs"]), int(r["running"]), int(r["waiting"]), greedy=r.get("greedy"))
        decided = follower.answer if follower is not None else mode is not StepMode.OFF
        if not exact and mode is StepMode.ON and i + 1 < len(rows):
            accepted = _accepted_from_estimates(ctl, r, rows[i + 1])
            if accepted is not None:
                ctl.on_result(int(r["bs"]), accepted)
        est = ctl.estimates() or {}
        out.append(RedriveStep(r["t"], int(r["bs"]), bool(r["on"]), decided, str(est.get("why", "-")), est))
    return RedriveResult(out, exact)


def _accepted_from_estimates(ctl: Controller, row: dict, nxt: dict) -> int | None:
    """Accepted drafts of a speculative step, from how the acceptance estimate moved by the next
    step (the controller's own update, inverted)."""
    a0, a1, bs = float(row["acc"]), float(nxt["acc"]), int(row["bs"])
    sample = a0 + (a1 - a0) / ctl.accept_weight(bs)
    if sample < 1.0:
        return None
    return max(0, round((sample - 1.0) * bs))
