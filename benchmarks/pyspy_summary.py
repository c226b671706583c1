"""Where each SGLang scheduler spent its CPU while serving: py-spy's raw samples (see
benchmarks/device/pyspy_watch.sh) inside the scheduler's event loop, as prefill work, waits for the
GPU (on a result; on spec_v2's last verify) and the rest (decode steps), and by the loop's own
steps.  Idle samples are not recorded, so the counts are busy CPU (waits included: the overlap loop
spins on a result's event); every server of one harness run served the same requests, so their
totals compare directly.

    python3 benchmarks/pyspy_summary.py <dir with map.txt and sched-<pid>.txt> --modes a,b,c \
        [--logs <run's log folder>] [--json out.json]

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
# The loop's own steps, by the frame right below the event loop.
LOOP_STEPS = (
    ("recv+process requests", ("Scheduler.recv_requests", "Scheduler.process_input_requests")),
    ("next batch (schedule)", ("Scheduler.get_next_batch_to_run",)),
    ("run batch", ("Scheduler.run_batch",)),
    ("process results", ("Scheduler.process_batch_result",)),
)
# A sample is a prefill's if any of these frames is on its stack (SGLang's extend path, the
# plugin's light prefill, the scheduler's prefill scheduling and result processing) ...
PREFILL_FRAMES = ("ModelRunner.forward_extend", "forward_prefill_off", "Scheduler.process_batch_result_prefill",
                  "Scheduler.get_new_batch_prefill", "SchedulerOutputProcessorMixin.process_batch_result_prefill")
# ... a wait for the GPU if its leaf is this (the overlap loop waiting on a result's copy) ...
GPU_WAIT_LEAF = "Event.synchronize"
# ... and a wait for the last verify if this frame is above it: spec_v2 blocks there before it filters
# or merges a speculative batch, so the next batch is scheduled only after the GPU has verified ...
VERIFY_WAIT_FRAME = "ScheduleBatch.maybe_wait_verify_done"
PLUGIN = "sglang_dynspec/"  # ... and the plugin's if one of its frames is on the stack (inclusive)


def _name(frame: str) -> str:
    return frame.split(" (", 1)[0]


def summarize(path: Path) -> dict:
    """Busy samples in the event loop: by loop step, and as prefill / GPU wait / verify wait / the
    rest (decode steps and everything else), and how many had a plugin frame."""
    steps: Counter = Counter()
    kinds: Counter = Counter()
    plugin = 0
    for line in path.read_text().splitlines():
        stack, _, n = line.rpartition(" ")
        if not n.isdigit():
            continue
        frames = stack.split(";")
        at = next((i for i, f in enumerate(frames) if LOOP in f), None)
        if at is None:
            continue
        k = int(n)
        names = [_name(f) for f in frames[at + 1:]]
        step = next((cat for cat, keys in LOOP_STEPS if names and names[0] in keys), names[0] if names else "(loop)")
        steps[step] += k
        if any(x in PREFILL_FRAMES for x in names):
            kinds["prefill"] += k
        elif names and names[-1] == GPU_WAIT_LEAF:
            kinds["verify wait" if VERIFY_WAIT_FRAME in names else "gpu wait"] += k
        else:
            kinds["decode and rest"] += k
        if any(PLUGIN in f for f in frames[at + 1:]):
            plugin += k
    return {"busy": sum(kinds.values()), "loop_steps": dict(steps.most_common()), "kinds": dict(kinds),
            "with_plugin_frame": plugin}


def log_counts(log: Path, decode_log_interval: int) -> tuple[int, int]:
    """(decode steps, prefill batches) of one server from its log: SGLang logs every prefill batch
    and every ``decode_log_interval``-th decode step."""
    text = log.read_text(errors="replace")
    return text.count("Decode batch") * decode_log_interval, text.count("Prefill batch")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("dir", type=Path)
    ap.add_argument("--modes", default=None, help="the harness's --modes, in port order from --base-port")
    ap.add_argument("--base-port", type=int, default=30000)
    ap.add_argument("--rate", type=float, default=200.0, help="py-spy's samples per second (pyspy_watch.sh: 200)")
    ap.add_argument("--logs", type=Path, default=None,
                    help="the run's log folder (server-<mode>.log): per decode step and per prefill batch figures")
    ap.add_argument("--decode-log-interval", type=int, default=40, help="the servers' --decode-log-interval")
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
        if not f.exists():
            continue
        s = summarize(f)
        log = a.logs / f"server-{name.replace(':', '_')}.log" if a.logs else None
        if log is not None and log.exists():
            s["decode_steps"], s["prefill_batches"] = log_counts(log, a.decode_log_interval)
        out[name] = s
    ms = 1e3 / a.rate
    for name, s in out.items():
        print(f"## {name}: {s['busy']} busy samples in the event loop ({s['busy'] * ms / 1e3:.1f} s), "
              f"{s['with_plugin_frame']} with a plugin frame")
        for k, v in s["kinds"].items():
            print(f"  {k:22s} {v:7d}  {v / max(s['busy'], 1):6.1%}")
        if s.get("decode_steps"):
            print(f"  per decode step, decode and rest: {s['kinds'].get('decode and rest', 0) * ms / s['decode_steps'] * 1e3:.0f} µs "
                  f"({s['decode_steps']} steps); per prefill batch: "
                  f"{s['kinds'].get('prefill', 0) * ms / max(s['prefill_batches'], 1):.2f} ms ({s['prefill_batches']} batches)")
        for k, v in s["loop_steps"].items():
            print(f"    {k:40s} {v:7d}")
    if a.json:
        a.json.write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
