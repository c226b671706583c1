"""Do tensor-parallel ranks take the same decisions?  Compare the plugin's per-process decision traces.

With ``SGLANG_DYNSPEC_TRACE_FILE=<dir>/<stem>.jsonl`` every scheduler process (one per TP rank)
writes ``<stem>.<pid>.jsonl``: one line per decode step with the step number, batch size and the
decision.  Ranks that agree have identical (step, bs, on) sequences.  A process killed at shutdown
may lose the tail of its buffered file, so the sequences are compared over their common length.
A server with a single process (TP=1) has nothing to compare: its entry has ``compared: false``,
a ``reason`` and ``agree: null``, and does not fail the exit status (only a difference does).

    python -m benchmarks.dynspec_bench.rank_traces <dir> [--stats STATS_DIR] [--into result.json]

Several servers of one run write under the same stem (one trace setting for the whole harness).
``--stats`` names the stats root (``<mode>/stats-<pid>.json`` per process, as the harness writes
it), so that only the processes of one server are compared with each other; without it, every
process of a stem counts as a rank of one server.

run_sweep.sh does all of this when started with DYNSPEC_TRACE=1.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

_NAME = re.compile(r"^(?P<stem>.+)\.(?P<pid>\d+)\.jsonl$")


def read_trace(path: Path) -> list[tuple[int, int, bool]]:
    """(step, bs, on) per complete line; a torn last line is dropped."""
    rows = []
    for line in path.read_text().splitlines():
        try:
            d = json.loads(line)
        except ValueError:
            break  # only the last line can be torn (buffered writes, killed process)
        rows.append((int(d["step"]), int(d["bs"]), bool(d["on"])))
    return rows


def _first_difference(traces: dict[str, list[tuple[int, int, bool]]], n: int) -> dict | None:
    """The earliest of the first n rows where some trace differs from the first one, or None."""
    ref_name = next(iter(traces), None)
    first_diff = None
    for name, rows in traces.items():
        if name == ref_name:
            continue
        for i in range(n):
            if rows[i] != traces[ref_name][i]:
                if first_diff is None or i < first_diff["index"]:
                    first_diff = {"index": i, ref_name: traces[ref_name][i], name: rows[i]}
                break
    return first_diff


def _not_compared_reason(processes: int) -> str | None:
    """Why a group has no verdict: agreement needs two processes that decided."""
    if processes == 0:
        return "no process decided: nothing to compare"
    if processes == 1:
        return "one process: nothing to compare"
    return None


def compare_group(paths: list[Path]) -> dict:
    traces = {p.name: read_trace(p) for p in sorted(paths)}
    # Empty files: processes that never decided (or lost their whole buffer at a kill).
    empty = sorted(k for k, v in traces.items() if not v)
    traces = {k: v for k, v in traces.items() if v}
    lengths = {k: len(v) for k, v in traces.items()}
    n = min(lengths.values()) if lengths else 0
    first_diff = _first_difference(traces, n)
    reason = _not_compared_reason(len(traces))
    ref = next(iter(traces.values()), [])[:n]
    return {
        "processes": len(traces),
        "empty_files": empty,
        "lines": lengths,
        "steps_compared": n,
        "steps_on_compared": sum(1 for r in ref if r[2]),
        "switches_compared": sum(1 for a, b in zip(ref, ref[1:]) if a[2] != b[2]),
        # A single process (TP=1) agrees with nobody and differs from nobody: no verdict (null).
        "compared": reason is None,
        "reason": reason,
        "agree": None if reason else first_diff is None,
        "first_difference": first_diff,
    }


def summary_line(stem: str, r: dict) -> str:
    """One console line per group: AGREE, DIFFER with the first difference, or why not compared."""
    counts = f"({r['steps_on_compared']} on, {r['switches_compared']} switches)"
    if not r["compared"]:  # the counts then describe the lone trace, not a comparison
        return (f"{stem}: {r['processes']} process(es), {r['steps_compared']} steps {counts}: "
                f"NOT COMPARED, {r['reason']}")
    verdict = "AGREE" if r["agree"] else "DIFFER " + json.dumps(r["first_difference"])
    return f"{stem}: {r['processes']} processes, {r['steps_compared']} steps compared {counts}: {verdict}"


_STATS = re.compile(r"^stats-(?P<pid>\d+)\.json$")


def servers_by_pid(stats_dir: str | Path) -> dict[str, str]:
    """pid -> server (its stats folder, named after the mode) from a harness stats root."""
    out = {}
    for p in Path(stats_dir).rglob("stats-*.json"):
        m = _STATS.match(p.name)
        if m:
            out[m["pid"]] = p.parent.name
    return out


def compare_dir(directory: str | Path, stats_dir: str | Path | None = None) -> dict:
    """{trace stem (and server, given ``stats_dir``): comparison} for every group of per-process
    files under ``directory``; a process without stats is its own group ``[pid N]``."""
    servers = servers_by_pid(stats_dir) if stats_dir is not None else None
    groups: dict[str, list[Path]] = {}
    for p in Path(directory).rglob("*.jsonl"):
        m = _NAME.match(p.name)
        if not m:
            continue
        key = str(p.parent / m["stem"])
        if servers is not None:
            key += f" [{servers.get(m['pid'], 'pid ' + m['pid'])}]"
        groups.setdefault(key, []).append(p)
    return {key: compare_group(paths) for key, paths in sorted(groups.items())}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("directory")
    ap.add_argument("--stats", default=None, metavar="STATS_DIR",
                    help="harness stats root: compare only the processes of one server with each other")
    ap.add_argument("--into", default=None, metavar="RESULT.json",
                    help="add the comparison to this harness result as `tp_rank_agreement`")
    args = ap.parse_args(argv)
    out = compare_dir(args.directory, args.stats)
    if not out:
        print(f"no <stem>.<pid>.jsonl traces under {args.directory}", file=sys.stderr)
        return 2
    for stem, r in out.items():
        print(summary_line(stem, r))
    if args.into and Path(args.into).exists():
        rec = json.loads(Path(args.into).read_text())
        rec["tp_rank_agreement"] = next(iter(out.values())) if len(out) == 1 else out
        Path(args.into).write_text(json.dumps(rec, indent=1))
    # Only a difference fails: a single-process server has nothing to disagree about.
    return 1 if any(r["agree"] is False for r in out.values()) else 0


if __name__ == "__main__":
    raise SystemExit(main())
