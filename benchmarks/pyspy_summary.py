"""Where each SGLang scheduler spent its CPU while serving: py-spy's raw samples (see
benchmarks/device/pyspy_watch.sh) inside the scheduler's event loop, by the loop's own steps and
by the plugin's frames.  Idle samples are not recorded, so the counts are busy CPU; every server of
one harness run served the same requests, so their totals compare directly.

    python3 benchmarks/pyspy_summary.py <dir with map.txt and sched-<pid>.txt> [--json out.json]

The mode of each scheduler comes from its launcher's --port and the harness's port order
(``--modes`` from ``--base-port`` on, as driver.log lists them): pass ``--modes a,b,c``.
"""

from __future__ import annotations

import argparse
import json
import re
from collections import Counter
from pathlib import Path

LOOP = "event_loop_"  # Scheduler.event_loop_normal / _overlap
# (category, a frame name it is recognised by), first match from the stack's leaf upwards wins
# for the plugin; otherwise the outermost loop step below the event loop names it.
LOOP_STEPS = (
    ("recv+process requests", ("Scheduler.recv_requests", "Scheduler.process_input_requests")),
    ("next batch (schedule)", ("Scheduler.get_next_batch_to_run",)),
    ("run batch", ("Scheduler.run_batch",)),
    ("process results", ("Scheduler.process_batch_result",)),
)
INNER = (
    ("target decode forward", ("TpModelWorker.forward_batch_generation",)),
    ("prefill graph / extend", ("PiecewiseCudaGraphRunner.replay", "ModelRunner.forward_extend")),
    ("draft (EAGLE)", ("EAGLEWorkerV2.draft", "EagleDraftWorker.draft", "_draft_extend_for_prefill",
                       "_draft_extend_for_decode")),
    ("verify (EAGLE)", ("EAGLEWorkerV2.verify",)),
)
PLUGIN = "sglang_dynspec/"


def _name(frame: str) -> str:
    return frame.split(" (", 1)[0]


def summarize(path: Path) -> dict:
    steps: Counter = Counter()
    inner: Counter = Counter()
    plugin_own = 0
    busy = 0
    for line in path.read_text().splitlines():
        stack, _, n = line.rpartition(" ")
        if not n.isdigit():
            continue
        frames = stack.split(";")
        at = next((i for i, f in enumerate(frames) if LOOP in f), None)
        if at is None:
            continue
        k = int(n)
        busy += k
        below = frames[at + 1:]
        names = [_name(f) for f in below]
        step = next((cat for cat, keys in LOOP_STEPS if names and names[0] in keys), names[0] if names else "(loop)")
        steps[step] += k
        for cat, keys in INNER:
            if any(x in keys or any(x.endswith("." + key) or x == key for key in keys) for x in names):
                inner[cat] += k
                break
        # the plugin's own code: samples whose innermost plugin frame is the leaf or calls no SGLang frame
        plug = [i for i, f in enumerate(below) if PLUGIN in f]
        if plug and all(PLUGIN in f or "/sglang/" not in f for f in below[plug[-1]:]):
            plugin_own += k
    return {"busy": busy, "loop_steps": dict(steps.most_common()), "inner": dict(inner.most_common()),
            "plugin_own": plugin_own}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("dir", type=Path)
    ap.add_argument("--modes", default=None, help="the harness's --modes, in port order from --base-port")
    ap.add_argument("--base-port", type=int, default=30000)
    ap.add_argument("--json", type=Path, default=None)
    a = ap.parse_args()
    modes = a.modes.split(",") if a.modes else []
    out = {}
    for line in (a.dir / "map.txt").read_text().splitlines():
        pid = line.split()[0]
        m = re.search(r"--port (\d+)", line)
        port = int(m.group(1)) if m else None
        i = port - a.base_port if port is not None else -1
        name = modes[i] if 0 <= i < len(modes) else f"port {port}"
        f = a.dir / f"sched-{pid}.txt"
        if f.exists():
            out[name] = summarize(f)
    for name, s in out.items():
        print(f"## {name}: {s['busy']} busy samples in the event loop; plugin's own code {s['plugin_own']}")
        for k, v in s["loop_steps"].items():
            print(f"  {k:28s} {v:7d}  {v / max(s['busy'], 1):6.1%}")
        for k, v in s["inner"].items():
            print(f"    {k:26s} {v:7d}  {v / max(s['busy'], 1):6.1%}")
    if a.json:
        a.json.write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
