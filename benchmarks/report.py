#!/usr/bin/env python3
"""Print markdown tables from harness result files: python benchmarks/report.py [--short] results/*.json

--short: a few lines per file (closed-loop tok/s and TPOT per C, trace phases, what was skipped)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

# Imported as benchmarks.report (tests) or run as a file, whose folder is then on sys.path.
try:
    from .dynspec_bench.phase_summary import ROW4_LEAD
except ImportError:
    from dynspec_bench.phase_summary import ROW4_LEAD


def _f(v, nd=1):
    if v is None:
        return "–"
    if isinstance(v, float):
        return f"{v:.{nd}f}"
    return str(v)


def level_key(c: str):
    """Order of a result's level keys: concurrencies numerically, other keys ("trace") after them."""
    return (not c.isdigit(), int(c) if c.isdigit() else 0, c)


def sweep_table(rec: dict) -> str:
    modes = rec.get("modes") or {}
    levels = sorted({c for lv in modes.values() for c in lv}, key=level_key)
    ratios = rec.get("ratio_to_best_static") or {}
    lines = ["| mode | " + " | ".join(f"C={c}" for c in levels) + " |",
             "|---|" + "---:|" * len(levels)]
    for name, lv in modes.items():
        cells = []
        for c in levels:
            x = lv.get(c)
            if not x:
                cells.append("–")
                continue
            r = (ratios.get(name) or {}).get(c)
            cell = f"{_f(x.get('output_tok_per_s'), 0)} ({_f(r, 2)}×)"
            if x.get("failed"):
                cell += f" {x['failed']} failed"
            cells.append(cell)
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    lines.append("")
    lines.append("| mode | C | tok/s | TPOT p50 ms | TPOT p99 ms | TTFT p50 ms | accept | switches | req | failed |")
    lines.append("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for name, lv in modes.items():
        for c in levels:
            x = lv.get(c)
            if x:
                lines.append(f"| {name} | {c} | {_f(x.get('output_tok_per_s'), 0)} | {_f(x.get('tpot_p50_ms'), 2)} | "
                             f"{_f(x.get('tpot_p99_ms'), 2)} | {_f(x.get('ttft_p50_ms'), 1)} | "
                             f"{_f(x.get('accept_length'), 2)} | {_f(x.get('switches'))} | {x.get('requests')} | "
                             f"{x.get('failed')} |")
    corr = rec.get("correctness") or {}
    if corr:
        ref = (rec.get("settings") or {}).get("reference_used")
        lines += ["", f"Greedy outputs vs `{ref}` (first mismatching token index per request; – = identical):", "",
                  "| mode | mismatched / requests | first mismatch |", "|---|---:|---|"]
        for name, c in corr.items():
            fm = ", ".join("–" if i is None else str(i) for i in c.get("first_mismatch", []))
            lines.append(f"| {name} | {c.get('mismatched')} / {c.get('requests')} | {fm} |")
    return "\n".join(lines)


def fuzz_table(rec: dict) -> str:
    lines = [f"policy `{rec.get('policy')}`", "",
             "| C | decode steps | switches | crashed | leak reports | requests | mismatched | accept after resume | accept static on |",
             "|---:|---:|---:|---|---:|---:|---:|---:|---:|"]
    for c, x in sorted((rec.get("per_C") or {}).items(), key=lambda kv: int(kv[0])):
        lines.append(f"| {c} | {_f(x.get('decode_steps'))} | {_f(x.get('switches'))} | {x.get('crashed')} | "
                     f"{x.get('leak_reports')} | {x.get('requests')} | {_f(x.get('mismatched'))} | "
                     f"{_f(x.get('accept_length_after_resume'), 2)} | {_f(x.get('accept_length_static_on'), 2)} |")
    return "\n".join(lines)


def offstep_table(rec: dict) -> str:
    lines = ["| bs | off step ms | plain step ms | ratio |", "|---:|---:|---:|---:|"]
    for bs, x in sorted((rec.get("per_bs") or {}).items(), key=lambda kv: int(kv[0])):
        lines.append(f"| {bs} | {_f(x.get('off_step_ms'), 3)} | {_f(x.get('plain_step_ms'), 3)} | {_f(x.get('ratio'), 3)} |")
    return "\n".join(lines)


def _closed_loop_short(rec: dict, names: list[str], dyn: list[str]) -> list[str]:
    modes = rec.get("modes") or {}
    levels = sorted({c for lv in modes.values() for c in lv if c.isdigit()}, key=level_key)
    if not levels:
        return []
    ratios = rec.get("ratio_to_best_static") or {}
    lines = ["| C | " + " | ".join(f"{n} tok/s (TPOT p50 ms)" for n in names)
             + "".join(f" | {d} ÷ best static, tok/s" for d in dyn) + " |",
             "|---:|" + "---:|" * (len(names) + len(dyn))]
    for c in levels:
        cells = []
        for n in names:
            x = modes[n].get(c)
            cells.append(f"{_f(x.get('output_tok_per_s'), 0)} ({_f(x.get('tpot_p50_ms'), 2)})" if x else "–")
        cells += [f"{_f((ratios.get(d) or {}).get(c), 3)}" for d in dyn]
        lines.append(f"| {c} | " + " | ".join(cells) + " |")
    return lines


def _trace_short(rec: dict, names: list[str]) -> list[str]:
    summ = rec.get("trace_phase_summary")
    if not summ:
        return []
    modes = rec.get("modes") or {}
    dyn = summ["dynspec_modes"]
    at = (rec.get("settings") or {}).get("added_trace") or {}
    head = []
    if at.get("phase_s"):
        # Records older than the trace's own sampling options have neither key: the levels' then.
        lens = at["output_len_range"] or (rec.get("settings") or {}).get("output_len") \
            if "output_len_range" in at else "as the levels"
        head = [f"Trace: {at.get('low_rate_per_s')} / {at.get('high_rate_per_s')} requests/s, {at.get('phase_s')} s "
                f"phases × {at.get('cycles')} cycles, temperature {at.get('temperature', 'as the levels')}, "
                f"output tokens {lens}", ""]
    lines = head + ["| phase | " + " | ".join(f"{n} TPOT / TTFT p50 ms" for n in names)
             + "".join(f" | {d} ÷ better static, TPOT / TTFT p50 (lower is better)" for d in dyn)
             + " | static lead, TPOT p50 (row-4 phase?) |",
             "|---|" + "---:|" * (len(names) + len(dyn) + 1)]
    for p in summ["phases"]:
        cells = []
        for n in names:
            x = ((modes[n].get("trace") or {}).get("phases") or {}).get(p)
            cells.append(f"{_f(x.get('tpot_p50_ms'), 2)} / {_f(x.get('ttft_p50_ms'), 0)}" if x else "–")
        row = summ["per_phase"][p]
        for d in dyn:
            r = row.get(d) or {}
            cells.append(f"{_f(r.get('tpot_p50_dynspec_over_better_static_lower_is_better'), 3)} / "
                         f"{_f(r.get('ttft_p50_dynspec_over_better_static_lower_is_better'), 3)}")
        valid = {True: "yes", False: "no", None: "–"}[row.get("row4_valid")]
        cells.append(f"{_f(row.get('tpot_p50_static_lead'), 2)} ({valid})")
        lines.append(f"| {p} | " + " | ".join(cells) + " |")
    for d in dyn:
        x = summ.get(d) or {}
        for metric in ("tpot_p50", "ttft_p50"):
            lines.append(
                f"{d}, {metric} over {len(x.get(f'{metric}_phases_used') or [])} phases: best single static mode "
                f"{x.get(f'{metric}_best_single_static')} ÷ {d} = "
                f"{_f(x.get(f'{metric}_best_single_static_over_dynspec_geomean_higher_is_better'), 3)} "
                f"(geomean, higher is better; by phase kind "
                f"{x.get(f'{metric}_best_single_static_over_dynspec_geomean_by_phase_kind_higher_is_better')}); "
                f"{d} ÷ better static per phase = "
                f"{_f(x.get(f'{metric}_dynspec_over_better_static_geomean_lower_is_better'), 3)} (geomean, lower is better)")
        if "row4_valid_phases" in x:
            lines.append(
                f"{d}, row-4 phases (low: a speculating static mode ahead by ≥ {ROW4_LEAD['low']}x, "
                f"high: `off` by ≥ {ROW4_LEAD['high']}x, "
                f"TPOT p50) {', '.join(x['row4_valid_phases']) or 'none'}: worst TPOT p50 ÷ better static "
                f"{_f(x.get('tpot_p50_dynspec_over_better_static_max_in_valid_phases'), 3)} (goal ≤ 1.05)")
    return lines


def short_table(rec: dict, source: str = "") -> str:
    """A few lines for a device call's console: per C every mode's tok/s (TPOT p50) and dynspec's
    tok/s ÷ the best static mode; per trace phase every mode's TPOT / TTFT p50 and dynspec's ratio
    to the better static mode, then the trace's geomeans; what was skipped."""
    s = rec.get("settings") or {}
    names = list(rec.get("modes") or {})
    dyn = [n for n in names if n.startswith("dynspec:")]
    out_len = s.get("output_len_range") or s.get("output_len")
    lines = [f"### {source}: {rec.get('kind')}, temperature {s.get('temperature')}, output tokens {out_len}, "
             f"{rec.get('gpu')}, commit {rec.get('git_commit')}", ""]
    lines += _closed_loop_short(rec, names, dyn)
    trace = _trace_short(rec, names)
    if trace:
        lines += ["", *trace]
    if rec.get("skipped"):
        lines += ["", "Skipped: " + ", ".join(f"{x.get('mode')} C={x.get('C')} ({x.get('why')})" for x in rec["skipped"])]
    for name, err in (rec.get("errors") or {}).items():
        lines.append(f"Error in {name}: {str(err)[:200]}")
    return "\n".join(lines)


def report(rec: dict, source: str = "") -> str:
    head = (f"### {source} — {rec.get('kind')} | model {rec.get('model')} | SGLang {rec.get('sglang_version')} | "
            f"torch {rec.get('torch_version')} | {rec.get('gpu')} | commit {rec.get('git_commit')}")
    kind = rec.get("kind")
    body = fuzz_table(rec) if kind == "fuzz" else offstep_table(rec) if kind == "offstep" else sweep_table(rec)
    tail = []
    if rec.get("skipped"):
        tail.append(f"Skipped (deadline/death): {rec['skipped']}")
    for name, err in (rec.get("errors") or {}).items():
        tail.append(f"Error in {name}: {str(err)[:300]}")
    return "\n".join([head, "", body, *(["", *tail] if tail else [])])


def main(argv: list[str]) -> int:
    short = "--short" in argv
    argv = [a for a in argv if a != "--short"]
    if not argv:
        print(__doc__, file=sys.stderr)
        return 2
    rc = 0
    for path in argv:
        try:
            rec = json.loads(Path(path).read_text())
        except (OSError, ValueError) as exc:
            print(f"{path}: cannot read result ({exc})", file=sys.stderr)
            rc = 1
            continue
        print(short_table(rec, Path(path).name) if short else report(rec, Path(path).name))
        print()
    return rc


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
