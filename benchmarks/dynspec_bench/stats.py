"""Read the counters the dynspec plugin writes to $SGLANG_DYNSPEC_STATS_DIR/stats-<pid>.json."""

from __future__ import annotations

import json
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
