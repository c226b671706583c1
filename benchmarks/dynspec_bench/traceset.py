"""Turn a harness run with decision traces into a trace set for `sglang-dynspec replay --traces`.

Input: the run's result JSON and its logs tarball (``<name>-logs.tar.xz``, with ``trace/dyn.<pid>.jsonl``
from ``DYNSPEC_TRACE=1`` and ``stats/<mode>/stats-<pid>.json`` naming each pid's mode).  For each
static dynspec mode (``dynspec:always`` = on, ``dynspec:never`` = off) and each level C, the
measured level is the run of decode steps that follows its warm-up: traces are cut at idle gaps
and matched to levels in order.  A level whose trace holds fewer tokens than the level produced
(a trace cut short when its server stopped) is recorded as incomplete.

    python -m benchmarks.dynspec_bench.traceset RESULT.json LOGS.tar.xz -o traces.json.gz
"""

from __future__ import annotations

import argparse
import gzip
import json
import re
import sys
import tarfile
from pathlib import Path

from sglang_dynspec.tracereplay import row_tokens

GAP_S = 0.3  # an idle gap between runs of decode steps (the harness settles 1.5 s around levels)
MIN_LEVEL_STEPS = 40  # a warm-up (32 tokens) is shorter than a level
COMPLETE_SHARE = 0.8  # of the level's decode tokens the trace must hold (speculative steps: bs x acc EMA)
STATIC_MODES = {"dynspec:always": "on", "dynspec:never": "off", "on": "on", "off": "off"}


def read_logs(tar_path: Path) -> tuple[dict[str, list[dict]], dict[str, str]]:
    """(pid -> trace rows, pid -> mode) from a logs tarball."""
    traces: dict[str, list[dict]] = {}
    modes: dict[str, str] = {}
    with tarfile.open(tar_path) as tar:
        for m in tar.getmembers():
            if not m.isfile():
                continue
            t = re.search(r"trace/dyn\.(\d+)\.jsonl$", m.name)
            s = re.search(r"stats/([^/]+)/stats-(\d+)\.json$", m.name)
            if t:
                rows = []
                for line in tar.extractfile(m).read().decode().splitlines():
                    try:
                        rows.append(json.loads(line))
                    except json.JSONDecodeError:
                        break  # a last line cut short
                traces[t.group(1)] = rows
            elif s:
                # stats dirs are named after the mode with ':' made safe (dynspec_always)
                modes[s.group(2)] = s.group(1).replace("dynspec_", "dynspec:", 1)
    return traces, modes


def segments(rows: list[dict], gap_s: float = GAP_S) -> list[list[dict]]:
    out: list[list[dict]] = []
    for r in rows:
        if not out or r["t"] - out[-1][-1]["t"] > gap_s:
            out.append([])
        out[-1].append(r)
    return out


def match_levels(segs: list[list[dict]], levels: list[int]) -> dict[int, list[dict]]:
    """The measured run of each level C, in order: the first long enough segment whose batches
    stay within C and reach half of it."""
    found: dict[int, list[dict]] = {}
    i = 0
    for c in levels:
        while i < len(segs):
            seg = segs[i]
            i += 1
            top = max(r["bs"] for r in seg)
            if len(seg) >= MIN_LEVEL_STEPS and c / 2 <= top <= c:
                found[c] = seg
                break
    return found


def level_record(seg: list[dict], level: dict, output_len: int) -> dict:
    steps = []
    for a, b in zip(seg, seg[1:] + [None]):
        dt = (b["t"] - a["t"]) if b is not None else None
        steps.append([a["bs"], None if dt is None else round(dt * 1e3, 4), 1 if a["on"] else 0, round(a["acc"], 3)])
    # the last step has no successor: give it the median interval
    known = sorted(s[1] for s in steps if s[1] is not None)
    if known:
        steps[-1][1] = known[len(known) // 2]
    decode_tokens = sum(row_tokens(s) for s in steps)
    tokens = int(level["completion_tokens"])
    requests = int(level["requests"])
    # each request's first token comes from its prefill; the decode steps make the rest
    expected_decode = tokens - requests
    return {
        "requests": requests,
        "completion_tokens": tokens,
        "measured_tok_s": level["output_tok_per_s"],
        "ttft_p50_ms": level.get("ttft_p50_ms"),
        "tpot_p50_ms": level.get("tpot_p50_ms"),
        "complete": decode_tokens >= COMPLETE_SHARE * expected_decode,
        "steps": steps,
    }


def build(result_path: Path, logs_path: Path) -> dict:
    result = json.loads(result_path.read_text())
    traces, pid_modes = read_logs(logs_path)
    settings = result.get("settings", {})
    output_len = int(settings.get("output_len") or 128)
    out = {"name": result_path.stem, "source": f"{result_path.name} + {logs_path.name}",
           "git_commit": result.get("git_commit"), "sglang_version": result.get("sglang_version"),
           "gpu": result.get("gpu"), "model": result.get("model"), "output_len": output_len,
           "command": result.get("command"), "verify_rows": result.get("num_draft_tokens"), "levels": {}}
    for pid, mode in pid_modes.items():
        kind = STATIC_MODES.get(mode)
        if kind is None or pid not in traces:
            continue
        measured = result["modes"].get(mode, {})
        levels = sorted(int(c) for c in measured)
        found = match_levels(segments(traces[pid]), levels)
        for c in levels:
            if c in found:
                rec = level_record(found[c], measured[str(c)], output_len)
            else:  # no run of steps long enough: the trace ended early
                rec = {"complete": False, "steps": []}
            out["levels"].setdefault(str(c), {})[kind] = rec
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("result", type=Path)
    p.add_argument("logs", type=Path)
    p.add_argument("-o", "--out", type=Path, required=True, help="trace set (.json or .json.gz)")
    args = p.parse_args(argv)
    data = build(args.result, args.logs)
    if not data["levels"]:
        print("no static dynspec mode with a decision trace in these files", file=sys.stderr)
        return 2
    text = json.dumps(data, separators=(",", ":"))
    if args.out.suffix == ".gz":
        args.out.write_bytes(gzip.compress(text.encode(), mtime=0))
    else:
        args.out.write_text(text)
    for c, modes in sorted(data["levels"].items(), key=lambda kv: int(kv[0])):
        print(f"C={c:>4}: " + ", ".join(f"{m} {len(v['steps'])} steps{'' if v['complete'] else ' (incomplete: left out)'}"
                                         for m, v in sorted(modes.items())))
    return 0


if __name__ == "__main__":
    sys.exit(main())
