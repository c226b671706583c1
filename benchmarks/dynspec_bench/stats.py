"""Read the counters the dynspec plugin writes to $SGLANG_DYNSPEC_STATS_DIR/stats-<pid>.json."""

from __future__ import annotations

import json
import re
from pathlib import Path

COUNTERS = ("decode_steps", "steps_on", "steps_off", "switches", "policy_errors")


def read_stats(stats_dir: str | Path | None) -> dict | None:
    """Sum the counters over scheduler processes (TP rank 0 only, so TP>1 is not double counted).

    Returns None when the directory has no readable stats file (plugin absent or not yet written).
    """
    if not stats_dir:
        return None
    files = sorted(Path(stats_dir).glob("stats-*.json"))
    total: dict = {k: 0 for k in COUNTERS}
    seen = 0
    extras: dict = {}
    for f in files:
        try:
            data = json.loads(f.read_text())
        except (OSError, ValueError):
            continue  # being rewritten right now; the next read catches up
        if not isinstance(data, dict) or int(data.get("tp_rank", 0) or 0) != 0:
            continue
        seen += 1
        for k in COUNTERS:
            total[k] += int(data.get(k, 0) or 0)
        for k in ("policy", "worker_path", "accept_length_on_steps"):
            if data.get(k) is not None:
                extras[k] = data[k]
    if not seen:
        return None
    total.update(extras)
    total["processes"] = seen
    return total


def delta(before: dict | None, after: dict | None) -> dict | None:
    """Counter increase between two reads; None when `after` is missing."""
    if after is None:
        return None
    before = before or {}
    out = {k: int(after.get(k, 0)) - int(before.get(k, 0)) for k in COUNTERS}
    for k in ("policy", "worker_path", "accept_length_on_steps"):
        if k in after:
            out[k] = after[k]
    return out


STAGE_METRIC = "sglang:per_stage_req_latency_seconds"
_STAGE_LABEL = re.compile(r'stage="([^"]+)"')


def stage_latency(before: dict[str, float], after: dict[str, float]) -> dict[str, dict] | None:
    """SGLang's per-stage request latency over a level, from two /metrics samples
    (``ServerProcess.metrics``): {stage: {"requests": n, "mean_ms": mean}}, for every stage with
    requests in between (e.g. ``prefill_forward``: a prefill from its forward's start to its
    result).  The same server-side figure for every mode, plugin or not; None without metrics."""
    sums: dict[str, float] = {}
    counts: dict[str, float] = {}
    for key, value in after.items():
        if not key.startswith(STAGE_METRIC):
            continue
        rest = key[len(STAGE_METRIC):]
        m = _STAGE_LABEL.search(rest)
        if m is None:
            continue
        if rest.startswith("_sum"):
            sums[m.group(1)] = sums.get(m.group(1), 0.0) + value - before.get(key, 0.0)
        elif rest.startswith("_count"):
            counts[m.group(1)] = counts.get(m.group(1), 0.0) + value - before.get(key, 0.0)
    out = {stage: {"requests": int(n), "mean_ms": round(sums.get(stage, 0.0) / n * 1e3, 3)}
           for stage, n in sorted(counts.items()) if n > 0}
    return out or None
