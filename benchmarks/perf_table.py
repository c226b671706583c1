"""Generate the README's performance table from committed sweep / pair / trace results.

One row per dynspec mode of each run in which the plugin reported (stats): the GPU, its output tok/s
divided by the best static mode's (`ratio_to_best_static`, the PNG's lower panel) at every measured
concurrency, the lowest of them, and whether the ≥ 0.97× goal holds at every C that ran.  A level
where one of the run's static modes has no result (its server died, a deadline) names it: the ratio
there is not to the best static mode, so it counts for neither the lowest nor the goal; nor does a
closed-loop level where a mode ran fewer than 8×C requests (its cell says how many).

    python benchmarks/perf_table.py            # print the table
    python benchmarks/perf_table.py --write    # replace it in README.md
    python benchmarks/perf_table.py --check    # exit 1 if README.md is stale
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

# Imported as benchmarks.perf_table (tests) or run as a file, whose folder is then on sys.path.
try:
    from . import readme_block
    from .dynspec_bench.phase_summary import is_static
    from .report import level_key
except ImportError:
    import readme_block
    from dynspec_bench.phase_summary import is_static
    from report import level_key

RESULTS = Path(__file__).resolve().parents[1] / "benchmarks" / "results"
GOAL = 0.97
REQUESTS_PER_C = 8  # a closed-loop level measures with 8×C requests per mode or more (the developers' guide)


def _tp(record: dict) -> int:
    for flags in (record.get("flags") or {}).values():
        args = flags.get("args") or []
        for flag in ("--tp", "--tp-size", "--tensor-parallel-size"):
            if flag in args:
                return int(args[args.index(flag) + 1])
    return 1


def _model(record: dict) -> str:
    if record.get("kind") == "pair":
        return "trained pair" + (" (padded)" if record.get("padded") else "")
    return "8B-shaped, dummy weights"


def rows(results: Path = RESULTS) -> list[dict]:
    out = []
    for f in sorted(results.glob("*.json")):
        try:
            d = json.loads(f.read_text())
        except ValueError:
            continue
        if d.get("kind") not in ("sweep", "pair", "trace"):
            continue
        ratios = d.get("ratio_to_best_static") or {}
        for mode in d.get("modes") or {}:
            if not mode.startswith("dynspec:"):
                continue
            if not ((d.get("server_stats") or {}).get(mode) or {}).get("dynspec_stats"):
                continue  # the plugin did not run in that server (no stats): not a dynspec result
            by_c = {c: r for c, r in (ratios.get(mode) or {}).items() if r is not None}
            if not by_c:
                continue
            notes = {c: _uncounted(d, c) for c in by_c}
            complete = [r for c, r in by_c.items() if notes[c] is None]
            out.append({"file": f.name, "model": _model(d), "sglang": d.get("sglang_version"), "tp": _tp(d),
                        "gpu": _gpu(d), "mode": mode, "ratios": by_c, "notes": notes,
                        "min": min(complete) if complete else None})
    return out


def _gpu(record: dict) -> str:
    name = (record.get("gpu") or "").removeprefix("NVIDIA ").split()
    return name[0] if name else "–"


def _missing_statics(record: dict, level: str) -> list[str]:
    """The run's static modes without a result at this level (a server that died, a deadline): the
    ratio there is to the static modes that did run, not to the best of them."""
    ratios = record.get("ratio_to_best_static") or {}
    return [m for m in record.get("modes") or {}
            if is_static(m) and (ratios.get(m) or {}).get(level) is None]


def _uncounted(record: dict, level: str) -> str | None:
    """Why this level counts for neither the lowest nor the goal ("no on", "1 req"); None: it counts."""
    missing = _missing_statics(record, level)
    if missing:
        return f"no {', '.join(missing)}"
    few = _fewest_requests(record, level)
    return None if few is None else f"{few} req"


def _fewest_requests(record: dict, level: str) -> int | None:
    """The fewest requests a mode ran at closed-loop level ``level`` when below REQUESTS_PER_C × C
    (None: enough, or not a closed-loop level).  A level of one request per mode (row 3's C=1 when a
    call has no time for more) is no measurement: it counts for neither the lowest nor the goal."""
    if not level.isdigit():
        return None
    counts = [((m or {}).get(level) or {}).get("requests") for m in (record.get("modes") or {}).values()]
    counts = [n for n in counts if isinstance(n, int)]
    if not counts:
        return None
    fewest = min(counts)
    return fewest if fewest < REQUESTS_PER_C * int(level) else None


def table(results: Path = RESULTS) -> str:
    lines = [f"| run | model | GPU | SGLang, TP | mode | dynspec ÷ best static, by C | lowest | ≥ {GOAL}× at every C |",
             "|---|---|---|---|---|---|---:|---|"]
    for r in rows(results):
        cells = ", ".join(_cell(r, c) for c in sorted(r["ratios"], key=level_key))
        if r["min"] is None:
            lowest, met = "–", "no level with every static mode"
        else:
            lowest = f"{r['min']:.2f}"
            met = "yes" if r["min"] >= GOAL and not any(r["notes"].values()) else "no"
        lines.append(f"| `{r['file']}` | {r['model']} | {r['gpu']} | {r['sglang']}, {r['tp']} | `{r['mode']}` | "
                     f"{cells} | {lowest} | {met} |")
    return "\n".join(lines)


def _cell(row: dict, level: str) -> str:
    cell = f"{level}: {row['ratios'][level]:.2f}"
    note = row["notes"][level]
    return f"{cell} ({note})" if note else cell


def main(argv=None) -> int:
    return readme_block.main("perf-table", table, argv)


if __name__ == "__main__":
    sys.exit(main())
