"""Start, watch and stop SGLang HTTP servers in their own process groups."""

from __future__ import annotations

import atexit
import json
import os
import re
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

# SGLang's pool checker words its leak reports in two spellings; match both, any case.
LEAK_PATTERN = re.compile(r"memory leak detected|mem leak detected", re.IGNORECASE)
TRACEBACK_PATTERN = re.compile(r"^Traceback \(most recent call last\):", re.MULTILINE)

_LIVE: set["ServerProcess"] = set()


def _stop_all_live() -> None:
    for srv in list(_LIVE):
        srv.stop()


atexit.register(_stop_all_live)


class ServerStartError(RuntimeError):
    """The server process exited or never became ready; the message carries the log tail."""


@dataclass
class ServerSpec:
    """What to launch: a name, the launcher arguments after the module, extra environment."""

    name: str
    args: list[str]
    env: dict[str, str | None] = field(default_factory=dict)  # None: unset
    port: int = 30000
    host: str = "127.0.0.1"
    # Flags that may be dropped (once) if the first start fails, e.g. untried speed-ups.
    optional_flags: list[str] = field(default_factory=list)
    # None means "python -m sglang.launch_server"; tests substitute a fake server here.
    command: list[str] | None = None
    # Files that must exist before the launch (weights still being written by a builder), how
    # long to wait for them, and a file whose appearance means they never will (builder failed).
    wait_for: list[str] = field(default_factory=list)
    wait_timeout_s: float = 0.0
    wait_abort_file: str | None = None

    def __post_init__(self) -> None:
        if not self.name:
            raise ValueError("ServerSpec.name must be non-empty")
        if not (0 < int(self.port) < 65536):
            raise ValueError(f"ServerSpec.port out of range: {self.port!r}")

    def full_command(self, drop: list[str] | None = None) -> list[str]:
        base = list(self.command) if self.command else [sys.executable, "-m", "sglang.launch_server"]
        args = [a for a in self.args if a not in (drop or [])]
        if not self.command:
            args += ["--host", self.host, "--port", str(self.port)]
        return base + args


def wait_for_files(paths: list[str], timeout_s: float, abort_file: str | None = None,
                   cancelled=lambda: False, poll_s: float = 0.5) -> float:
    """Block until every path exists; returns the seconds waited.  Raises ServerStartError on
    timeout, when ``abort_file`` appears, or when ``cancelled()`` turns true."""
    t0 = time.monotonic()
    while True:
        missing = [p for p in paths if not Path(p).exists()]
        if not missing:
            return time.monotonic() - t0
        if abort_file and Path(abort_file).exists():
            raise ServerStartError(f"gave up waiting for {missing}: {abort_file} appeared")
        if cancelled():
            raise ServerStartError(f"cancelled while waiting for {missing}")
        if time.monotonic() - t0 > timeout_s:
            raise ServerStartError(f"still missing after {timeout_s:.0f} s: {missing}")
        time.sleep(poll_s)


def http_get(url: str, timeout: float = 5.0) -> tuple[int, bytes]:
    """GET returning (status, body); status 0 means the connection failed."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read() if exc.fp else b""
    except (urllib.error.URLError, OSError, TimeoutError):
        return 0, b""


class ServerProcess:
    """One launched server. Use as a context manager; stop() is idempotent."""

    def __init__(self, spec: ServerSpec, log_dir: str | Path, grace_s: float = 20.0):
        self.spec = spec
        self.log_path = Path(log_dir) / f"server-{safe_name(spec.name)}.log"
        self.grace_s = grace_s
        self.proc: subprocess.Popen | None = None
        self.dropped_flags: list[str] = []
        self.start_s: float | None = None
        self.waited_s: float = 0.0  # before the launch, for spec.wait_for
        self.attempts: list[dict] = []
        self._log_file = None
        self._cancelled = False

    @property
    def base_url(self) -> str:
        return f"http://{self.spec.host}:{self.spec.port}"

    # ---- lifecycle -------------------------------------------------------------------
    def launch(self, drop: list[str] | None = None) -> None:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self._log_file = open(self.log_path, "ab")
        cmd = self.spec.full_command(drop)
        self._log_file.write(f"\n=== launch {time.strftime('%H:%M:%S')}: {' '.join(cmd)}\n".encode())
        self._log_file.flush()
        env = dict(os.environ)
        for key, value in self.spec.env.items():
            if value is None:  # unset what this process's environment would pass on
                env.pop(key, None)
            else:
                env[key] = value
        # A new session makes the server the leader of its own process group, so
        # stop() reaches the scheduler/detokenizer children too.
        self.proc = subprocess.Popen(
            cmd, stdout=self._log_file, stderr=subprocess.STDOUT, env=env, start_new_session=True
        )
        _LIVE.add(self)

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def wait_ready(self, timeout_s: float = 300.0, path: str = "/health_generate") -> float:
        """Poll until the server answers 200; raise ServerStartError with the log tail if it dies."""
        t0 = time.monotonic()
        while True:
            if not self.alive():
                rc = self.proc.returncode if self.proc else None
                raise ServerStartError(
                    f"server {self.spec.name!r} exited with code {rc} before ready; log tail:\n{self.log_tail()}"
                )
            status, _ = http_get(self.base_url + path, timeout=10.0)
            if status == 200:
                return time.monotonic() - t0
            if time.monotonic() - t0 > timeout_s:
                raise ServerStartError(
                    f"server {self.spec.name!r} not ready after {timeout_s:.0f}s; log tail:\n{self.log_tail()}"
                )
            time.sleep(1.0)

    def start(self, timeout_s: float = 300.0) -> float:
        """Launch and wait; retry once without spec.optional_flags if the first attempt dies.
        Files in spec.wait_for are waited for first (not counted in ``timeout_s`` or start_s)."""
        if self.spec.wait_for:
            self.waited_s = wait_for_files(self.spec.wait_for, self.spec.wait_timeout_s, self.spec.wait_abort_file,
                                           cancelled=lambda: self._cancelled)
        t0 = time.monotonic()
        drops: list[list[str]] = [[]]
        if self.spec.optional_flags:
            drops.append(list(self.spec.optional_flags))
        last_err: Exception | None = None
        for drop in drops:
            if self._cancelled:
                break
            self.launch(drop)
            try:
                self.wait_ready(timeout_s=max(1.0, timeout_s - (time.monotonic() - t0)))
                self.dropped_flags = drop
                self.attempts.append({"dropped": drop, "ok": True})
                self.start_s = time.monotonic() - t0
                return self.start_s
            except ServerStartError as exc:
                self.attempts.append({"dropped": drop, "ok": False, "error": str(exc)[-2000:]})
                last_err = exc
                self.stop()
        raise last_err or ServerStartError(f"server {self.spec.name!r} start cancelled")

    def stop(self) -> None:
        """SIGTERM the whole group, SIGKILL after the grace period. Safe to call twice."""
        proc, self.proc = self.proc, None
        _LIVE.discard(self)
        if proc is not None:
            _kill_group(proc, self.grace_s)
        if self._log_file is not None:
            self._log_file.close()
            self._log_file = None

    def cancel(self) -> None:
        """Stop and forbid further start attempts (used when another thread is interrupted)."""
        self._cancelled = True
        self.stop()

    def __enter__(self) -> "ServerProcess":
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    # ---- observation -----------------------------------------------------------------
    def log_text(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except FileNotFoundError:
            return ""

    def log_tail(self, n: int = 60) -> str:
        return "\n".join(self.log_text().splitlines()[-n:])

    def log_counts(self) -> dict:
        text = self.log_text()
        return {
            "leak_reports": len(LEAK_PATTERN.findall(text)),
            "tracebacks": len(TRACEBACK_PATTERN.findall(text)),
        }

    def server_info(self) -> dict | None:
        for path in ("/server_info", "/get_server_info"):
            status, body = http_get(self.base_url + path, timeout=10.0)
            if status == 200:
                try:
                    return json.loads(body)
                except ValueError:
                    return None
        return None

    def avg_spec_accept_length(self) -> float | None:
        """The scheduler's cumulative figure (since start, warm-ups included)."""
        info = self.server_info() or {}
        states = info.get("internal_states") or []
        if states and isinstance(states[0], dict):
            val = states[0].get("avg_spec_accept_length")
            return float(val) if val is not None else None
        return None

    def metrics(self) -> dict[str, float]:
        """Prometheus text from /metrics (needs --enable-metrics) as {sample name+labels: value}."""
        status, body = http_get(self.base_url + "/metrics", timeout=10.0)
        return parse_prometheus(body.decode(errors="replace")) if status == 200 else {}


def parse_prometheus(text: str) -> dict[str, float]:
    out: dict[str, float] = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        key, _, value = line.rpartition(" ")
        try:
            out[key.strip()] = float(value)
        except ValueError:
            continue
    return out


def _kill_group(proc: subprocess.Popen, grace_s: float) -> None:
    try:
        pgid = os.getpgid(proc.pid)
    except ProcessLookupError:
        pgid = None
    if pgid is not None:
        try:
            os.killpg(pgid, signal.SIGTERM)
        except ProcessLookupError:
            pass
    try:
        proc.wait(timeout=grace_s)
    except subprocess.TimeoutExpired:
        pass
    # Children (scheduler, detokenizer) can outlive the leader: give the group the rest of
    # the grace period to exit, then SIGKILL whatever remains.
    if pgid is not None:
        deadline = time.monotonic() + grace_s
        while _group_alive(pgid) and time.monotonic() < deadline:
            time.sleep(0.2)
        try:
            os.killpg(pgid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    try:
        proc.wait(timeout=5)
    except subprocess.TimeoutExpired:
        pass


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
        return True
    except ProcessLookupError:
        return False
    except PermissionError:
        return True


def safe_name(name: str) -> str:
    """A mode name as a file-name part (``dynspec:never@topk4`` -> ``dynspec_never_topk4``)."""
    return re.sub(r"[^A-Za-z0-9._-]+", "_", name)


def start_all(
    servers: list[ServerProcess], timeout_s: float = 300.0
) -> tuple[dict[str, float], dict[str, str]]:
    """Start several servers concurrently (start-up is mostly waiting on the GPU side).

    Returns ({name: seconds to ready}, {name: error with log tail}); failed servers are stopped,
    the others keep running so one bad mode does not sink a whole run.
    """
    ok: dict[str, float] = {}
    failed: dict[str, str] = {}
    if not servers:
        return ok, failed
    with ThreadPoolExecutor(max_workers=len(servers)) as pool:
        futures = {srv.spec.name: (srv, pool.submit(srv.start, timeout_s)) for srv in servers}
        try:
            for name, (srv, fut) in futures.items():
                try:
                    ok[name] = fut.result()
                except Exception as exc:  # noqa: BLE001 - reported to the caller per server
                    failed[name] = str(exc)
                    srv.stop()
        except BaseException:
            # Ctrl-C: make the waiting threads give up at once, then let the pool join them.
            for srv in servers:
                srv.cancel()
            raise
    return ok, failed
