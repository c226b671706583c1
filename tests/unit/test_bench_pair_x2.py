"""Dry run of benchmarks/device/run_pair_x2.sh on CPU: both pipelines for real (run_pair.sh ->
run_sweep.sh -> harness), with a bundle whose `sglang` is the fake server, the stand-in pair
builder and tiny sizes. Checks what the device call relies on: two pipelines with their own pair,
names and ports, row 1 vs rows 3 + 4 settings, the files that come back (<= 8), the logs tarballs'
contents and the summary table."""

import json
import os
import shutil
import subprocess
import tarfile
from pathlib import Path

import pytest

pytest.importorskip("aiohttp")
REPO = Path(__file__).resolve().parents[2]

from benchmarks.dynspec_bench.testing.fixtures import fake_bundle, free_port_bases  # noqa: E402

MODES = {"off", "on", "dynspec:goodput"}


def _scratch(name: str) -> list[Path]:
    return [Path(f"/tmp/dynspec-logs-{name}"), Path(f"/tmp/dynspec-stats-{name}"), Path(f"/tmp/dynspec-{name}"),
            Path(f"/tmp/dynspec-phases-{name}.txt"), Path(f"/tmp/{name}.console"), Path(f"/tmp/{name}.rc")]


@pytest.fixture
def dry_run(tmp_path):
    prefix = f"dryx2-{os.getpid()}"
    names = [f"{prefix}-g0-row1", f"{prefix}-g1-rows34"]
    out = tmp_path / "out"
    env = {
        **os.environ, "OUT": str(out), "DYNSPEC_BUNDLE": str(fake_bundle(tmp_path)), "DYNSPEC_SITE": str(tmp_path / "site"),
        "DYNSPEC_X2_PREFIX": prefix, "DYNSPEC_X2_PAIR_ROOT": str(tmp_path), "DYNSPEC_X2_NEED_GPUS": "0",
        "DYNSPEC_X2_PORTS": "%d %d" % tuple(free_port_bases(2, 20000)),
        "DYNSPEC_PAIR_BUILDER": "benchmarks.dynspec_bench.testing.fake_build", "FAKE_BUILD_STEP_S": "0.2",
        "DYNSPEC_X2_ROW1_C": "1,2", "DYNSPEC_X2_ROW3_C": "1,3", "DYNSPEC_X2_LEN_RANGE": "3,12",
        "DYNSPEC_X2_TRACE": "10,60,1,2",
        "DYNSPEC_X2_ARGS": "--output-len 8 --warmup-tokens 4 --correctness-prompts 4 --correctness-tokens 8 "
                           "--accept-requests 8 --start-timeout 60 --add-trace-overhead-s 2",
        "FAKE_SGLANG_TOKEN_DELAY_S": "0.001", "FAKE_SGLANG_STARTUP_S": "0.2", "DYNSPEC_STATS_SETTLE_S": "0.3",
        "DYNSPEC_BENCH_NO_PROGRESS": "1",
    }
    env.pop("PYTHONPATH", None)  # the drivers build it: bundle site first, then the repository
    try:
        proc = subprocess.run(["bash", str(REPO / "benchmarks/device/run_pair_x2.sh")], cwd=REPO, env=env,
                              capture_output=True, text=True, timeout=420)
        yield proc, out, prefix, names
    finally:
        for name in names:
            for path in _scratch(name):
                shutil.rmtree(path, ignore_errors=True) if path.is_dir() else path.unlink(missing_ok=True)


def _tar_names(path: Path) -> set[str]:
    with tarfile.open(path) as tar:
        return {Path(m.name).name for m in tar.getmembers()}


def test_two_gpu_driver_dry_run(dry_run):
    proc, out, prefix, (n0, n1) = dry_run
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    files = {p.name for p in out.iterdir()}
    assert files == {f"{n0}.json", f"{n0}.png", f"{n0}-logs.tar.xz", f"{n1}.json", f"{n1}.png",
                     f"{n1}-logs.tar.xz", f"{prefix}-summary.md"}  # 7 <= the 8 that come back
    row1 = json.loads((out / f"{n0}.json").read_text())
    rows34 = json.loads((out / f"{n1}.json").read_text())

    # Each pipeline on its own pair, ports and GPU.
    assert row1["model"].endswith("pair-g0/target-padded") and rows34["model"].endswith("pair-g1/target-padded")
    ports0 = {f["port"] for f in row1["flags"].values()}
    ports1 = {f["port"] for f in rows34["flags"].values()}
    assert len(ports0) == 3 and len(ports1) == 3 and not ports0 & ports1
    assert rows34["pair"]["config"]["fake"] is True and row1["build_minutes"] > 0

    # Row 1: fixed lengths, greedy, both levels for all three modes, accept pass of `on` only.
    s0 = row1["settings"]
    assert s0["output_len_range"] is None and s0["temperature"] == 0.0 and s0["max_requests"] == 600
    assert s0["level_order"] == "level" and "added_trace" not in s0
    assert set(row1["modes"]) == MODES and all(set(lv) == {"1", "2"} for lv in row1["modes"].values())
    assert set(row1["accept_pass"]) == {"on"} and set(row1["accept_pass"]["on"]) == {"0", "0.7"}
    assert set(row1["correctness"]) == MODES and "trace_phase_summary" not in row1

    # Rows 3 + 4: drawn lengths at temperature 0.7, the levels, then the trace on the same servers.
    s1 = rows34["settings"]
    assert s1["output_len_range"] == [3, 12] and s1["temperature"] == 0.7 and s1["max_requests"] == 400
    assert "accept_pass" not in rows34 and set(rows34["flags"]) == MODES
    for mode, levels in rows34["modes"].items():
        assert set(levels) == {"1", "3", "trace"}
        assert set(levels["trace"]["phases"]) == {"low0", "high0", "low1", "high1"}
    tokens = {lv["3"]["completion_tokens"] for lv in rows34["modes"].values()}
    assert len(tokens) == 1  # the same drawn lengths for every mode
    assert rows34["settings"]["added_trace"]["phase_s"] == 1.0
    summ = rows34["trace_phase_summary"]
    assert summ["dynspec_modes"] == ["dynspec:goodput"]
    assert summ["dynspec:goodput"]["tpot_p50_best_single_static"] in ("off", "on")
    assert rows34["phase_times_s"]["start_wave0"] > 0 and not rows34["skipped"]

    # The logs tarballs carry the build log, manifest and console that no longer come back as files.
    for name in (n0, n1):
        inside = _tar_names(out / f"{name}-logs.tar.xz")
        assert {"pair-build.log", "pair.json", f"{name}.console", "driver.log", "phases.txt"} <= inside
    table = (out / f"{prefix}-summary.md").read_text()
    assert f"### {n0}.json" in table and f"### {n1}.json" in table
    assert "| phase |" in table and "best single static mode" in table
    assert "[g0]" in proc.stdout and "[g1]" in proc.stdout  # both consoles, told apart
