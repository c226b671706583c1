"""Where a decode step's time goes: SGLang's own torch profiler (/start_profile) on a live server
under steady decode load, summarised per step (GPU busy time, kernels, CPU ops, graph replays,
and the plugin's ``dynspec.offstep.*`` ranges)."""

from __future__ import annotations

import asyncio
import bisect
import gzip
import json
import math
import threading
import time
import urllib.request
from collections import defaultdict
from pathlib import Path

from .loadgen import closed_loop, sampling_params


def _events(path: Path) -> list[dict]:
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt") as fh:
        data = json.load(fh)
    evs = data["traceEvents"] if isinstance(data, dict) else data
    return [e for e in evs if e.get("ph") == "X" and "dur" in e]


def _is_wait(e: dict) -> bool:
    """A CUDA call that blocks the host until the GPU gets there (explicit synchronisation, or a
    device-to-pageable-host copy such as v1's .tolist() of the sampled tokens)."""
    name = e.get("name", "")
    return e.get("cat") in ("cuda_runtime", "cuda_driver") and ("Synchronize" in name or "Memcpy" in name)


def _is_own_python(e: dict) -> bool:
    """A Python function of SGLang or the plugin (traces recorded with stacks)."""
    name = e.get("name", "")
    return e.get("cat") == "python_function" and ".py(" in name and ("sglang" in name or "dynspec" in name)


def _busiest_tid(ranges: list[dict]):
    """The thread holding most of ``ranges``: the scheduler's."""
    return max({e.get("tid") for e in ranges}, key=lambda t: sum(1 for e in ranges if e.get("tid") == t))


def _union_us(intervals: list[tuple[float, float]]) -> float:
    total, end = 0.0, None
    for s, e in sorted(intervals):
        if end is None or s > end:
            total += e - s
            end = e
        elif e > end:
            total += e - end
            end = e
    return total


def _top(groups: dict[str, list[float]], steps: int, n: int) -> list[dict]:
    rows = sorted(groups.items(), key=lambda kv: -sum(kv[1]))[:n]
    return [{"name": k[:120], "us_per_step": round(sum(v) / steps, 1), "calls_per_step": round(len(v) / steps, 2)}
            for k, v in rows]


def analyze_trace(path: str | Path, steps: int, top: int = 12) -> dict:
    """Per-step figures of one chrome trace covering ``steps`` decode steps."""
    evs = _events(Path(path))
    if not evs or steps < 1:
        return {"error": f"empty trace or steps={steps}", "trace": str(path)}
    gpu = [e for e in evs if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")]
    t0 = min(e["ts"] for e in evs)
    t1 = max(e["ts"] + e["dur"] for e in evs)
    kernels, cpu_ops, ann_cpu, ann_gpu = defaultdict(list), defaultdict(list), defaultdict(list), defaultdict(list)
    py_funcs = defaultdict(list)  # only in traces recorded with Python stacks (--profile-stack)
    runtime = defaultdict(int)
    for e in evs:
        cat, name, dur = e.get("cat"), e.get("name", "?"), float(e["dur"])
        if cat == "kernel":
            kernels[name].append(dur)
        elif cat == "cpu_op":
            cpu_ops[name].append(dur)
        elif _is_own_python(e):
            py_funcs[name].append(dur)
        elif cat == "cuda_runtime" or cat == "cuda_driver":
            runtime[name] += 1
        elif cat == "user_annotation" and name.startswith("dynspec."):
            ann_cpu[name].append(dur)
        elif cat == "gpu_user_annotation" and name.startswith("dynspec."):
            ann_gpu[name].append(dur)
    busy = _union_us([(e["ts"], e["ts"] + e["dur"]) for e in gpu])
    window = t1 - t0
    launches = sum(v for k, v in runtime.items() if "LaunchKernel" in k or k == "cuLaunchKernel")
    return {
        "trace": Path(path).name,
        "steps": steps,
        "window_ms": round(window / 1e3, 3),
        "step_ms": round(window / steps / 1e3, 3),
        "gpu_busy_ms_per_step": round(busy / steps / 1e3, 3),
        "gpu_busy_share": round(busy / window, 3) if window else None,
        "graph_launches_per_step": round(runtime.get("cudaGraphLaunch", 0) / steps, 2),
        "kernel_launches_per_step": round(launches / steps, 1),
        "sync_calls_per_step": round(sum(v for k, v in runtime.items() if "Synchronize" in k) / steps, 2),
        "dynspec_ranges": {
            k: {"cpu_us_per_step": round(sum(v) / steps, 1), "gpu_us_per_step": round(sum(ann_gpu.get(k, [])) / steps, 1),
                "count": len(v)}
            for k, v in sorted(ann_cpu.items())
        },
        "scheduler_thread": _scheduler_thread_split(evs, steps, window),
        "top_kernels": _top(kernels, steps, top),
        "top_cpu_ops": _top(cpu_ops, steps, top),
        # Inclusive time of SGLang / plugin Python functions (nested ones overlap their callers).
        **({"top_python": _top(py_funcs, steps, 3 * top)} if py_funcs else {}),
    }


def _scheduler_thread_split(evs: list[dict], steps: int, window: float) -> dict | None:
    """Where the scheduler thread's time goes per step: inside the forward (SGLang's ``step[...]``
    ranges and the plugin's ``dynspec.*`` ranges, united), blocked in CUDA synchronisation and
    copy calls (waiting for the GPU; inside the forward too), and the rest (the scheduler's own per-step work: batch preparation,
    result processing).  A CPU-bound server shows a small wait and a large rest."""
    ann = [e for e in evs if e.get("cat") == "user_annotation"
           and (e.get("name", "").startswith("step[") or e.get("name", "").startswith("dynspec."))]
    if not ann:
        return None
    tid = _busiest_tid(ann)
    forward = _union_us([(e["ts"], e["ts"] + e["dur"]) for e in ann if e.get("tid") == tid])
    waits = [e for e in evs if e.get("tid") == tid and _is_wait(e)]
    wait = sum(float(e["dur"]) for e in waits)
    in_fwd = _union_us([(e["ts"], e["ts"] + e["dur"]) for e in waits
                        if any(a["ts"] <= e["ts"] <= a["ts"] + a["dur"] for a in ann if a.get("tid") == tid)])
    return {
        "forward_cpu_us_per_step": round((forward - in_fwd) / steps, 1),
        "wait_us_per_step": round(wait / steps, 1),
        "rest_cpu_us_per_step": round(max(0.0, window - forward - (wait - in_fwd)) / steps, 1),
        "outside_forward_top_ops": _outside_forward_ops(evs, tid, ann, steps),
    }


def _outside_forward_ops(evs: list[dict], tid, ann: list[dict], steps: int, top: int = 10) -> list[dict]:
    """The scheduler thread's outermost profiled calls (aten ops, CUDA runtime calls) outside the
    forward ranges, per step: what SGLang's own batch preparation and result processing launch and
    wait for.  Nested calls are inside their caller's time, so only the outermost one counts."""
    spans = sorted((a["ts"], a["ts"] + a["dur"]) for a in ann if a.get("tid") == tid)
    calls = sorted((e for e in evs if e.get("tid") == tid and e.get("cat") in ("cpu_op", "cuda_runtime", "cuda_driver")),
                   key=lambda e: (e["ts"], -e["dur"]))
    groups: dict[str, list[float]] = defaultdict(list)
    outer_end, i = float("-inf"), 0
    for e in calls:
        ts = e["ts"]
        while i < len(spans) and spans[i][1] < ts:
            i += 1
        if i < len(spans) and spans[i][0] <= ts:
            continue  # inside a forward range
        if ts < outer_end:
            continue  # nested in the previous outermost call
        groups[e.get("name", "?")].append(float(e["dur"]))
        outer_end = ts + e["dur"]
    return _top(groups, steps, top)


def _post_json(url: str, body: dict, timeout_s: float) -> str:
    req = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout_s) as resp:
        return resp.read().decode()[:300]


def profile_server(base_url: str, prompts: list[list[int]], out_dir: str | Path, tag: str, num_steps: int = 30,
                   output_len: int = 1024, lead_s: float = 3.0, timeout_s: float = 90.0,
                   with_stack: bool = False, concurrency: int | None = None,
                   params: list[dict] | None = None) -> dict:
    """Profile ``num_steps`` forward steps of a server decoding ``len(prompts)`` requests at once.

    With ``concurrency`` (and per-request ``params``), a closed loop of that many requests at a
    time over ``prompts`` instead, and the trace is read as prefill and decode windows
    (``analyze_prefill_windows``): a load that keeps admitting requests."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    before = set(out_dir.glob(f"{tag}*.trace.json*"))
    load_err: list[str] = []

    def load() -> None:
        try:
            asyncio.run(closed_loop(base_url, prompts, concurrency or len(prompts),
                                    params if params is not None else sampling_params(output_len)))
        except Exception as exc:  # noqa: BLE001 - reported in the result
            load_err.append(repr(exc))

    th = threading.Thread(target=load, daemon=True)
    th.start()
    time.sleep(lead_s)  # past the prefills, into steady decode
    info: dict = {"tag": tag, "bs": concurrency or len(prompts), "num_steps": num_steps}
    try:
        info["start_profile"] = _post_json(base_url + "/start_profile", {
            "output_dir": str(out_dir), "num_steps": num_steps, "activities": ["CPU", "GPU"],
            "with_stack": with_stack, "record_shapes": False, "profile_prefix": tag}, timeout_s)
    except Exception as exc:  # noqa: BLE001 - the call may block until the steps ran; the file decides
        info["start_profile"] = repr(exc)[:300]
    deadline = time.time() + timeout_s
    trace = None
    while time.time() < deadline:
        new = sorted(set(out_dir.glob(f"{tag}*.trace.json*")) - before)
        if new:
            trace = new[-1]
            time.sleep(1.0)  # let the writer finish
            break
        time.sleep(0.5)
    th.join(timeout=timeout_s)
    if load_err:
        info["load_error"] = load_err[0]
    if trace is None:
        info["error"] = "no trace file appeared"
        return info
    try:
        info.update(analyze_prefill_windows(trace) if concurrency else analyze_trace(trace, num_steps))
    except Exception as exc:  # noqa: BLE001
        info["error"] = f"analysis failed: {exc!r}"[:300]
    return info


def summary_line(p: dict) -> str:
    if "error" in p:
        return f"{p.get('tag')}: {p['error']}"
    rng = " ".join(f"{k.split('.')[-1]}={v['cpu_us_per_step']}/{v['gpu_us_per_step']}us"
                   for k, v in p.get("dynspec_ranges", {}).items())
    return (f"{p['tag']}: step {p['step_ms']} ms, GPU busy {p['gpu_busy_ms_per_step']} ms "
            f"({p['gpu_busy_share']}), graphs/step {p['graph_launches_per_step']}, "
            f"kernels/step {p['kernel_launches_per_step']}, syncs/step {p['sync_calls_per_step']} {rng}")


def _window_index(windows: list[tuple[float, float]], ts: float) -> int | None:
    """Index of the window (sorted, disjoint) holding ``ts``, or None."""
    i = bisect.bisect_right(windows, (ts, math.inf)) - 1
    return i if i >= 0 and windows[i][0] <= ts < windows[i][1] else None


def _window_stats(evs_tid: list[dict], kernels: list[tuple[float, float]], windows: list[tuple[float, float]],
                  top: int) -> dict:
    """Mean per window of: wall time, GPU busy time, the scheduler thread's CUDA waits, its
    ``step[...]`` / ``dynspec.*`` ranges, and (traces with Python stacks) its SGLang / plugin
    functions, inclusive (nested functions overlap their callers)."""
    n = len(windows)
    if n == 0:
        return {"windows": 0}
    ranges, funcs = defaultdict(float), defaultdict(float)
    waits = 0.0
    per_window: list[list[tuple[float, float]]] = [[] for _ in windows]
    for a, b in kernels:
        i = _window_index(windows, a)
        if i is not None:
            per_window[i].append((a, min(b, windows[i][1])))
    busy = sum(_union_us(k) for k in per_window)
    for ev in evs_tid:
        if _window_index(windows, ev["ts"]) is None:
            continue
        cat, name, dur = ev.get("cat"), ev.get("name", "?"), float(ev["dur"])
        if cat == "user_annotation" and (name.startswith("step[") or name.startswith("dynspec.")):
            key = name.split(" bs=")[0] + "]" if name.startswith("step[") else name
            ranges[key] += dur
        elif _is_wait(ev):
            waits += dur
        elif _is_own_python(ev):
            funcs[name] += dur
    walls = sorted(e - s for s, e in windows)
    return {
        "windows": n,
        "wall_ms_median": round(walls[n // 2] / 1e3, 3),
        "wall_ms_mean": round(sum(walls) / n / 1e3, 3),
        "gpu_busy_ms_mean": round(busy / n / 1e3, 3),
        "cuda_wait_ms_mean": round(waits / n / 1e3, 3),
        "ranges_ms_mean": {k: round(v / n / 1e3, 3) for k, v in sorted(ranges.items(), key=lambda kv: -kv[1])},
        "top_python_ms_mean": [{"name": k[:140], "ms": round(v / n / 1e3, 3)}
                               for k, v in sorted(funcs.items(), key=lambda kv: -kv[1])[:top]],
    }


def analyze_prefill_windows(path: str | Path, top: int = 40) -> dict:
    """What a prefill adds to the decode loop, from one chrome trace of a server under a load
    that keeps admitting requests.  A *prefill window* runs from the start of the target decode
    step before one or more EXTEND steps to the start of the decode step after them; a *decode
    window* from one decode step to the next with nothing between.  The difference of their
    means is what the prefill costs the loop; the breakdown says where (compare two servers)."""
    evs = _events(Path(path))
    steps = [e for e in evs if e.get("cat") == "user_annotation" and e.get("name", "").startswith("step[")]
    if not steps:
        return {"error": "no step[...] ranges in the trace", "trace": Path(path).name}
    tid = _busiest_tid(steps)
    steps = sorted((e for e in steps if e.get("tid") == tid), key=lambda e: e["ts"])
    decode_starts = [e["ts"] for e in steps if e["name"].startswith("step[DECODE")]
    extends = [e for e in steps if e["name"].startswith("step[EXTEND")]
    ext_ts = [e["ts"] for e in extends]
    pre, dec = [], []
    for a, b in zip(decode_starts, decode_starts[1:]):
        between = bisect.bisect_left(ext_ts, b) - bisect.bisect_right(ext_ts, a)
        (pre if between else dec).append((a, b))
    kernels = [(e["ts"], e["ts"] + e["dur"]) for e in evs if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")]
    evs_tid = [e for e in evs if e.get("tid") == tid]
    return {
        "trace": Path(path).name,
        "extend_steps": len(extends),
        "prefill": _window_stats(evs_tid, kernels, pre, top),
        "decode": _window_stats(evs_tid, kernels, dec, top),
    }
