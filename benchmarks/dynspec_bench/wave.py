"""Start a group of mode servers together, record their flags and start times, stop them after."""

from __future__ import annotations

import contextlib
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from .modes import Mode, ServerConfig, build_server_spec
from .results import gpu_memory_used_mib, phase
from .server import ServerProcess, start_all


def log(msg: str) -> None:
    print(f"[dynspec-bench {time.strftime('%H:%M:%S')}] {msg}", flush=True)


def stop_all(servers: list[ServerProcess]) -> None:
    if servers:
        with ThreadPoolExecutor(max_workers=len(servers)) as pool:
            list(pool.map(lambda s: s.stop(), servers))


def _clear_stats(stats_dir: str | None) -> None:
    """Old stats files (an earlier server on the same dir) would be summed into this one's."""
    if stats_dir:
        Path(stats_dir).mkdir(parents=True, exist_ok=True)
        for f in Path(stats_dir).glob("stats-*.json"):
            f.unlink(missing_ok=True)


@contextlib.contextmanager
def running_modes(
    record: dict, modes: list[Mode], server_cfg: ServerConfig, log_dir: str | Path, ports: list[int],
    timeout_s: float = 300.0, factory=None, label: str = "start_wave",
):
    """Yields {mode name: started ServerProcess}; failures land in record['errors'][name]['start']."""
    if len(ports) < len(modes):
        raise ValueError(f"need {len(modes)} ports, got {len(ports)}")
    servers = []
    for m, port in zip(modes, ports):
        spec = build_server_spec(m, server_cfg, port)
        servers.append(factory(spec, log_dir) if factory else ServerProcess(spec, log_dir))
        record.setdefault("flags", {})[m.name] = {"args": list(spec.args), "env": dict(spec.env), "port": port}
        _clear_stats(spec.env.get("SGLANG_DYNSPEC_STATS_DIR"))
    try:
        log(f"{label}: starting {[m.name for m in modes]}")
        with phase(record, label):
            ok, failed = start_all(servers, timeout_s)
        for s in servers:
            name = s.spec.name
            if s.waited_s:
                record["phase_times_s"][f"wait:{name}"] = round(s.waited_s, 3)
            if name in ok:
                record["phase_times_s"][f"start:{name}"] = round(ok[name], 3)
                extra = f" (dropped {s.dropped_flags})" if s.dropped_flags else ""
                log(f"  {name} ready in {ok[name]:.1f}s{extra}")
            if s.dropped_flags:
                record["flags"][name]["dropped_after_failed_start"] = list(s.dropped_flags)
            if name in failed:
                record.setdefault("errors", {}).setdefault(name, {})["start"] = failed[name][-4000:]
                log(f"  {name} FAILED to start:\n{failed[name][-1500:]}")
        record.setdefault("gpu_memory_used_mib", {})[label] = gpu_memory_used_mib()
        yield {s.spec.name: s for s in servers if s.spec.name in ok}
    finally:
        stop_all(servers)
