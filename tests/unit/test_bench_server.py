"""Server manager: readiness, log scans, retry without optional flags, whole-group cleanup."""

import os
import sys
import time

import pytest

pytest.importorskip("aiohttp")

from benchmarks.dynspec_bench.server import (  # noqa: E402
    ServerProcess, ServerSpec, ServerStartError, parse_prometheus, start_all,
)
from benchmarks.dynspec_bench.testing.fixtures import fake_spec, free_port  # noqa: E402


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie still answers kill(0); count it dead.
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def test_stop_kills_the_whole_process_group(tmp_path):
    pidfile = tmp_path / "child.pid"
    srv = ServerProcess(fake_spec("g", tmp_path, {"FAKE_SGLANG_CHILD_PIDFILE": str(pidfile)}), tmp_path, grace_s=5)
    srv.start(60)
    child = int(pidfile.read_text())
    leader = srv.proc.pid
    assert _pid_alive(child) and _pid_alive(leader)
    srv.stop()
    deadline = time.time() + 10
    while time.time() < deadline and (_pid_alive(child) or _pid_alive(leader)):
        time.sleep(0.1)
    assert not _pid_alive(child), "scheduler-like child survived stop()"
    assert not _pid_alive(leader)
    srv.stop()  # idempotent


def test_sigterm_ignoring_group_is_killed(tmp_path):
    # A "server" whose child ignores SIGTERM: stop() must escalate to SIGKILL for the group.
    script = ("import signal,subprocess,sys,time,pathlib;"
              "c=subprocess.Popen([sys.executable,'-c','import signal,time;"
              "signal.signal(signal.SIGTERM,signal.SIG_IGN);time.sleep(3600)']);"
              f"pathlib.Path({str(tmp_path / 'c.pid')!r}).write_text(str(c.pid));time.sleep(3600)")
    spec = ServerSpec(name="stubborn", args=[], command=[sys.executable, "-c", script], port=free_port())
    srv = ServerProcess(spec, tmp_path, grace_s=1.0)
    srv.launch()
    for _ in range(100):
        if (tmp_path / "c.pid").exists():
            break
        time.sleep(0.05)
    child = int((tmp_path / "c.pid").read_text())
    time.sleep(0.3)
    srv.stop()
    time.sleep(0.3)
    assert not _pid_alive(child)


def test_dead_server_raises_with_log_tail(tmp_path):
    spec = ServerSpec(name="dies", args=[], port=free_port(),
                      command=[sys.executable, "-c", "print('boom: bad flag'); raise SystemExit(7)"])
    srv = ServerProcess(spec, tmp_path, grace_s=1)
    t0 = time.monotonic()
    with pytest.raises(ServerStartError, match="boom: bad flag") as err:
        srv.start(timeout_s=60)
    assert "code 7" in str(err.value)
    assert time.monotonic() - t0 < 20  # early exit, not the full timeout


def test_not_ready_times_out(tmp_path):
    spec = ServerSpec(name="mute", args=[], port=free_port(),
                      command=[sys.executable, "-c", "import time; time.sleep(60)"])
    srv = ServerProcess(spec, tmp_path, grace_s=1)
    with pytest.raises(ServerStartError, match="not ready after"):
        srv.start(timeout_s=2)
    assert not srv.alive()


def test_retry_without_optional_flag_and_log_scan(tmp_path):
    spec = fake_spec("retry", tmp_path, {"FAKE_SGLANG_DIE_IF_FLAG": "--disable-piecewise-cuda-graph",
                                         "FAKE_SGLANG_LEAK_LINES": "2"},
                     extra_args=["--disable-piecewise-cuda-graph"])
    spec.optional_flags = ["--disable-piecewise-cuda-graph"]
    with ServerProcess(spec, tmp_path, grace_s=5) as srv:
        srv.start(60)
        assert srv.dropped_flags == ["--disable-piecewise-cuda-graph"]
        assert [a["ok"] for a in srv.attempts] == [False, True]
        counts = srv.log_counts()
        assert counts["leak_reports"] == 2  # only the second attempt prints them after the flag check
        assert "sglang:num_requests_total" in " ".join(srv.metrics())
    assert not srv.alive()


def test_start_all_reports_failures_and_keeps_the_rest(tmp_path):
    good = ServerProcess(fake_spec("good", tmp_path), tmp_path, grace_s=5)
    bad = ServerProcess(ServerSpec(name="bad", args=[], port=free_port(),
                                   command=[sys.executable, "-c", "raise SystemExit(1)"]), tmp_path, grace_s=1)
    try:
        ok, failed = start_all([good, bad], timeout_s=60)
        assert set(ok) == {"good"} and set(failed) == {"bad"}
        assert good.alive() and not bad.alive()
    finally:
        good.stop()
        bad.stop()


def test_spec_validation_and_prometheus_parse():
    with pytest.raises(ValueError, match="name"):
        ServerSpec(name="", args=[])
    with pytest.raises(ValueError, match="port"):
        ServerSpec(name="x", args=[], port=70000)
    m = parse_prometheus('# HELP a\nsglang:x{a="1"} 2.5\nbad line\nsglang:y 3\n')
    assert m == {'sglang:x{a="1"}': 2.5, "sglang:y": 3.0}


def test_an_env_value_of_none_unsets_what_the_harness_inherited(tmp_path, monkeypatch):
    # A `@bare` dynspec mode unsets the run-wide SGLANG_DYNSPEC_TRACE_FILE this way.
    monkeypatch.setenv("FAKE_SGLANG_DIE_IF_FLAG", "--some-flag")
    dies = fake_spec("inherits", tmp_path, extra_args=["--some-flag"])
    with pytest.raises(ServerStartError):
        with ServerProcess(dies, tmp_path, grace_s=5) as srv:
            srv.start(30)
    unset = fake_spec("unsets", tmp_path, {"FAKE_SGLANG_DIE_IF_FLAG": None}, extra_args=["--some-flag"])
    with ServerProcess(unset, tmp_path, grace_s=5) as srv:
        srv.start(30)
        assert srv.alive()
