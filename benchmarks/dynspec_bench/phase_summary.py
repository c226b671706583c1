"""Per-phase comparison of dynspec modes with the static modes on one open-loop phase trace.

Input: the result's ``modes`` ({mode: {"trace": {"phases": {label: level summary}}}}). Every
phase instance (``low0``, ``high0``, ``low1``, ...) counts once, whatever its request count, so a
busy high phase does not outweigh a quiet low one. Latency metrics only (lower is better):

- per phase instance and dynspec mode: ``<metric>_dynspec_over_better_static_lower_is_better`` =
  dynspec's value ÷ the lower of the static modes' values in that phase (an oracle that picks the
  better static mode per phase: ≤ 1 means dynspec matched or beat it);
- over the trace: the *best single static mode* is the static mode whose geometric mean over the
  phases is lowest (the one static setting an operator would have picked for the whole trace);
  ``<metric>_best_single_static_over_dynspec_geomean_higher_is_better`` = geomean over phases of
  (that mode's value ÷ dynspec's value): > 1 means dynspec was faster.

A phase enters a dynspec mode's geomeans only when every static mode and that dynspec mode have a
value there (a phase with no completed request has none); ``<metric>_phases_used`` lists them.

Whether a phase is one the issue's row 4 asks for is judged on TPOT p50 alone, from the static modes:
a ``low`` phase where a speculating static mode is the better one by ``ROW4_LEAD["low"]`` (1.2x) or
more, a ``high`` phase where plain decode (``off``, any variant) is better by ``ROW4_LEAD["high"]`` (1.3x) or more.
Per phase ``tpot_p50_static_lead`` (the worse static value ÷ the better) and ``row4_valid``; per
dynspec mode ``row4_valid_phases`` and the largest ``tpot_p50`` ratio to the better static mode over
them, ``tpot_p50_dynspec_over_better_static_max_in_valid_phases`` (the per-phase goal: ≤ 1.05).
"""

from __future__ import annotations

import math
import re

from .modes import parse_mode

METRICS = ("tpot_p50", "ttft_p50")  # level-summary fields are these + "_ms"
ROW4_LEAD = {"low": 1.2, "high": 1.3}  # the better static mode's TPOT p50 lead that makes a row-4 phase


def geomean(values) -> float | None:
    """Geometric mean of positive numbers; None for none (or for any value that is not > 0)."""
    vals = list(values)
    if not vals or any(v is None or not v > 0 for v in vals):
        return None
    return math.exp(math.fsum(math.log(v) for v in vals) / len(vals))


def phase_kind(label: str) -> str:
    """``low0`` -> ``low``: the phase instance's kind (its label without the cycle number)."""
    return re.sub(r"\d+$", "", label) or label


def is_static(mode: str) -> bool:
    return not mode.startswith("dynspec:")


def _pos(v) -> bool:
    return isinstance(v, (int, float)) and v > 0


def _r(v: float | None) -> float | None:
    return None if v is None else round(v, 4)


def traced_phases(modes: dict) -> dict[str, dict[str, dict]]:
    """{mode: {phase label: level summary}} for the modes whose trace has phases."""
    out = {}
    for name, levels in (modes or {}).items():
        phases = ((levels or {}).get("trace") or {}).get("phases")
        if phases:
            out[name] = phases
    return out


def better_static(values: dict[str, float | None], static: list[str]) -> str | None:
    """The static mode with the lowest positive value (ties: the first listed)."""
    have = [s for s in static if _pos(values.get(s))]
    return min(have, key=lambda s: values[s]) if have else None


def best_single_static(values: dict[str, dict[str, float]], static: list[str], phases: list[str]):
    """(mode, {static mode: geomean over ``phases``}): the static mode with the lowest geomean."""
    gms = {s: geomean(values[s][p] for p in phases) for s in static}
    have = [s for s in static if gms[s] is not None]
    return (min(have, key=lambda s: gms[s]) if have else None), gms


def summarize_phases(modes: dict, metrics: tuple[str, ...] = METRICS) -> dict | None:
    """The ``trace_phase_summary`` of a result, or None without a static and a dynspec trace."""
    traced = traced_phases(modes)
    static = [n for n in traced if is_static(n)]
    dyn = [n for n in traced if not is_static(n)]
    if not static or not dyn:
        return None
    phases = list(dict.fromkeys(p for n in traced for p in traced[n]))
    out: dict = {"phases": phases, "static_modes": static, "dynspec_modes": dyn,
                 "per_phase": {p: {} for p in phases}}
    for metric in metrics:
        field = metric + "_ms"
        vals = {n: {p: (traced[n].get(p) or {}).get(field) for p in phases} for n in traced}
        for p in phases:
            row = out["per_phase"][p]
            best = better_static({s: vals[s][p] for s in static}, static)
            row[f"{metric}_better_static"] = best
            for d in dyn:
                ratio = vals[d][p] / vals[best][p] if best and _pos(vals[d][p]) else None
                row.setdefault(d, {})[f"{metric}_dynspec_over_better_static_lower_is_better"] = _r(ratio)
        for d in dyn:
            out.setdefault(d, {}).update(_dyn_summary(metric, d, vals, static, phases))
        if metric == "tpot_p50":
            _row4_validity(out, vals, static, dyn)
    return out


def row4_valid(label: str, better: str | None, lead: float | None) -> bool | None:
    """Is this phase one row 4 asks for (see the module doc)? None: not a low or high phase, or no lead."""
    kind = phase_kind(label)
    if kind not in ROW4_LEAD or better is None or lead is None:
        return None
    return parse_mode(better).speculative == (kind == "low") and lead >= ROW4_LEAD[kind]


def _row4_validity(out: dict, tpot: dict, static: list[str], dyn: list[str]) -> None:
    """Adds row 4's phase validity to ``out`` from ``tpot`` ({mode: {phase: TPOT p50 ms}})."""
    if len({parse_mode(st).speculative for st in static}) < 2:
        return  # row 4 compares plain decode with speculation
    key = "tpot_p50_dynspec_over_better_static_lower_is_better"
    for p in out["phases"]:
        row = out["per_phase"][p]
        better = row.get("tpot_p50_better_static")
        have = [tpot[st][p] for st in static if _pos(tpot[st][p])]
        lead = max(have) / min(have) if len(have) == len(static) else None
        row["tpot_p50_static_lead"] = _r(lead)
        row["row4_valid"] = row4_valid(p, better, lead)
    valid = [p for p in out["phases"] if out["per_phase"][p]["row4_valid"]]
    for d in dyn:
        ratios = [out["per_phase"][p][d][key] for p in valid if out["per_phase"][p][d].get(key) is not None]
        out[d]["row4_valid_phases"] = valid
        out[d]["tpot_p50_dynspec_over_better_static_max_in_valid_phases"] = max(ratios) if ratios else None


def _dyn_summary(metric: str, d: str, vals: dict, static: list[str], phases: list[str]) -> dict:
    used = [p for p in phases if _pos(vals[d][p]) and all(_pos(vals[s][p]) for s in static)]
    single, gms = best_single_static(vals, static, used)
    per_phase_oracle = [vals[d][p] / min(vals[s][p] for s in static) for p in used]
    vs_single = {p: vals[single][p] / vals[d][p] for p in used} if single else {}
    kinds = list(dict.fromkeys(phase_kind(p) for p in used))
    return {
        f"{metric}_phases_used": used,
        f"{metric}_geomean_ms": {**{s: _r(g) for s, g in gms.items()},
                                 d: _r(geomean(vals[d][p] for p in used))},
        f"{metric}_best_single_static": single,
        f"{metric}_best_single_static_over_dynspec_geomean_higher_is_better": _r(geomean(vs_single.values())),
        f"{metric}_best_single_static_over_dynspec_geomean_by_phase_kind_higher_is_better": {
            k: _r(geomean(r for p, r in vs_single.items() if phase_kind(p) == k)) for k in kinds},
        f"{metric}_dynspec_over_better_static_geomean_lower_is_better": _r(geomean(per_phase_oracle)),
    }
