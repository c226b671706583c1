"""Dry run of benchmarks/device/run_pair_rows.sh on CPU, its three calls back to back as on one warm
H200 (run_pair.sh -> run_sweep.sh -> harness for real, a bundle whose `sglang` is the fake server, the
stand-in pair builder, tiny sizes): row1 builds the pair, rows34 and row2 reuse it (no build), row2
runs the GPU tests before its sweep; row2 on an empty pair folder builds it beside the tests (on a GPU of
DYNSPEC_ROWS2_TESTS_BESIDE_GIB or more; else the tests follow the build, if it left them the time). Checks
what the device calls rely on: names, settings of each row, the files that come back (<= 8), the
logs tarballs, the reuse notes, the order of tests / build / sweep."""

import json
import os
import shutil
import subprocess
import tarfile
from pathlib import Path

import pytest

pytest.importorskip("aiohttp")
REPO = Path(__file__).resolve().parents[2]

from benchmarks.dynspec_bench.loadgen import output_lengths  # noqa: E402
from benchmarks.dynspec_bench.testing.fixtures import fake_bundle, free_port_bases  # noqa: E402

MODES = {"off", "on", "dynspec:goodput"}


def _tar_names(path: Path) -> set[str]:
    with tarfile.open(path) as tar:
        return {Path(m.name).name for m in tar.getmembers()}


def _tar_text(path: Path, name: str) -> str:
    with tarfile.open(path) as tar:
        member = next(m for m in tar.getmembers() if Path(m.name).name == name)
        return tar.extractfile(member).read().decode()


@pytest.fixture(scope="module")
def calls(tmp_path_factory):
    root = tmp_path_factory.mktemp("rows")
    prefix = f"dry1g-{os.getpid()}"
    base = {
        **os.environ, "DYNSPEC_BUNDLE": str(fake_bundle(root)), "DYNSPEC_SITE": str(root / "site"),
        "DYNSPEC_ROWS_PREFIX": prefix, "DYNSPEC_PAIR_DIR": str(root / "repo-pair" / "pair"),
        "DYNSPEC_ROWS_NEED_GPUS": "0", "DYNSPEC_ROWS_PORT": str(free_port_bases(1, 24000)[0]),
        "DYNSPEC_PAIR_BUILDER": "benchmarks.dynspec_bench.testing.fake_build", "FAKE_BUILD_STEP_S": "0.3",
        "DYNSPEC_ROWS1_C": "1,2", "DYNSPEC_ROWS3_C": "1,3", "DYNSPEC_ROWS3_LEN_RANGE": "3,12",
        "DYNSPEC_ROWS4_TRACE": "10,60,1,2", "DYNSPEC_ROWS4_LEN_RANGE": "2,5",
        "DYNSPEC_ROWS2_C": "1,3", "DYNSPEC_ROWS2_PYTEST_ARGS": "-q",
        "DYNSPEC_ROWS_ARGS": "--output-len 8 --warmup-tokens 4 --correctness-prompts 4 --correctness-tokens 8 "
                             "--accept-requests 8 --start-timeout 60 --add-trace-overhead-s 2",
        "FAKE_SGLANG_TOKEN_DELAY_S": "0.001", "FAKE_SGLANG_STARTUP_S": "0.2", "DYNSPEC_STATS_SETTLE_S": "0.3",
        "DYNSPEC_BENCH_NO_PROGRESS": "1",
    }
    base.pop("PYTHONPATH", None)  # the drivers build it: bundle site first, then the repository
    runs, names = {}, []

    def run(row: str, out: str, **env):
        names.append(f"{prefix}-{row}")
        proc = subprocess.run(["bash", str(REPO / "benchmarks/device/run_pair_rows.sh"), row], cwd=REPO,
                              env={**base, "OUT": str(root / out), **env}, capture_output=True, text=True,
                              timeout=300)
        runs[out] = (proc, root / out)

    try:
        run("row1", "row1")
        manifest = root / "repo-pair" / "pair" / "pair.json"
        built = manifest.stat().st_mtime_ns
        run("rows34", "rows34")
        run("row2", "row2")
        runs["pair_untouched"] = manifest.stat().st_mtime_ns == built
        # run_pair.sh's off-step comparison on the same pair (reused), instead of its sweep.
        names.append(f"{prefix}-offstep")
        env = {**base, "OUT": str(root / "offstep"), "DYNSPEC_PAIR_CMD": "offstep", "DYNSPEC_PAIR_REUSE": "1",
               "DYNSPEC_PAIR_NAME": f"{prefix}-offstep", "DYNSPEC_PAIR_SIDE": "logs"}
        proc = subprocess.run(["bash", str(REPO / "benchmarks/device/run_pair.sh"), "--batch-sizes", "2",
                               "--input-len", "8", "--output-len", "8", "--start-timeout", "60",
                               "--base-port", str(free_port_bases(1, 20000)[0])],
                              cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
        runs["offstep"] = (proc, root / "offstep")
        bad = subprocess.run(["bash", str(REPO / "benchmarks/device/run_pair.sh")], cwd=REPO,
                             env={**env, "DYNSPEC_PAIR_CMD": "trace"}, capture_output=True, text=True, timeout=60)
        runs["bad_cmd"] = (bad, None)
        # A cold machine with a GPU large enough (any size here): row2 builds the pair while the tests run.
        run("row2", "row2-cold", DYNSPEC_PAIR_DIR=str(root / "cold" / "pair"), DYNSPEC_ROWS2_TESTS_BESIDE_GIB="0")
        # ... and with a smaller one (this machine has 0 GiB of GPU): the tests wait for the build.
        run("row2", "row2-cold-small", DYNSPEC_PAIR_DIR=str(root / "cold-small" / "pair"))
        # ... where the build leaves the tests too little time: they are not run, the sweep is.
        run("row2", "row2-cold-late", DYNSPEC_PAIR_DIR=str(root / "cold-late" / "pair"), DYNSPEC_ROWS2_TESTS_END_S="1")
        # A build that fails: no sweep (run_pair.sh would only build again), the tests still reported.
        run("row2", "row2-failed", DYNSPEC_PAIR_DIR=str(root / "failed" / "pair"), FAKE_BUILD_FAIL_AFTER="2")
        yield runs, prefix
    finally:
        for name in set(names) | {f"{prefix}-row2-gpu-tests"}:
            for path in (Path(f"/tmp/dynspec-logs-{name}"), Path(f"/tmp/dynspec-stats-{name}"),
                         Path(f"/tmp/dynspec-{name}"), Path(f"/tmp/dynspec-phases-{name}.txt"),
                         Path(f"/tmp/{name}.console")):
                shutil.rmtree(path, ignore_errors=True) if path.is_dir() else path.unlink(missing_ok=True)


def _ok(runs, key):
    proc, out = runs[key]
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    return proc.stdout, out


def test_row1_builds_the_pair_greedy_levels_and_accept_pass_of_on_only(calls):
    runs, p = calls
    console, out = _ok(runs, "row1")
    name = f"{p}-row1"
    assert {f.name for f in out.iterdir()} == {f"{name}.json", f"{name}.png", f"{name}-logs.tar.xz",
                                               f"{name}-summary.md"}
    rec = json.loads((out / f"{name}.json").read_text())
    assert "no complete pair" in console and "building the pair" in console
    assert "reused" not in rec["pair"] and rec["build_minutes"] > 0
    s = rec["settings"]
    assert s["temperature"] == 0.0 and s["output_len_range"] is None and s["max_requests"] == 2000
    assert s["level_order"] == "level" and "added_trace" not in s and set(rec["flags"]) == MODES
    for levels in rec["modes"].values():
        assert {c: lv["requests"] for c, lv in levels.items()} == {"1": 32, "2": 32}  # max(32, 8×C)
    # The accept pass goes to the static `on` server only, at t=0 only.
    assert {m: set(t) for m, t in rec["accept_pass"].items()} == {"on": {"0"}}
    assert set(rec["correctness"]) == MODES
    inside = _tar_names(out / f"{name}-logs.tar.xz")
    assert {"pair-build.log", "pair.json", f"{name}.console", "driver.log", "phases.txt"} <= inside
    assert f"### {name}.json" in (out / f"{name}-summary.md").read_text()


def test_rows34_reuse_the_pair_then_a_greedy_trace_with_its_own_lengths(calls):
    runs, p = calls
    console, out = _ok(runs, "rows34")
    name = f"{p}-rows34"
    assert "is reused: no build" in console and "building the pair" not in console
    assert runs["pair_untouched"]  # neither rows34 nor row2 rebuilt it
    assert len(list(out.iterdir())) == 4
    rec = json.loads((out / f"{name}.json").read_text())
    assert rec["pair"]["reused"]["by"] == name and rec["build_minutes"] > 0  # the earlier build's manifest
    log = _tar_text(out / f"{name}-logs.tar.xz", "pair-build.log")
    assert log.startswith(f"[run_pair] {name}: reused the complete pair") and "fake_build: measure done" in log
    s = rec["settings"]
    assert s["temperature"] == 0.7 and s["output_len_range"] == [3, 12] and s["max_requests"] == 800
    assert "accept_pass" not in rec and set(rec["flags"]) == MODES
    at = s["added_trace"]
    assert at["temperature"] == 0.0 and at["output_len_range"] == [2, 5]
    assert at["min_phase_s"] == 1.0  # the driver's 6 s, capped at the dry run's 1 s phases
    trace_tokens = sum(output_lengths(at["arrivals"], 2, 5, seed=0 * 1_000_003 + 30_000))
    for levels in rec["modes"].values():
        assert set(levels) == {"1", "3", "trace"} and levels["trace"]["failed"] == 0
        assert levels["trace"]["completion_tokens"] == trace_tokens
    assert "Trace: 10.0 / 60.0 requests/s" in (out / f"{name}-summary.md").read_text()


def test_row2_runs_the_gpu_tests_first_then_topk4_sweep_on_the_reused_pair(calls):
    runs, p = calls
    console, out = _ok(runs, "row2")
    name, tests = f"{p}-row2", f"{p}-row2-gpu-tests"
    assert {f.name for f in out.iterdir()} == {f"{name}.json", f"{name}.png", f"{name}-logs.tar.xz",
                                               f"{name}-summary.md", f"{tests}-logs.tar.xz", f"{tests}.txt"}
    assert console.index("GPU tests exit 0") < console.index("servers wait for their weights")
    assert "[pair]" in console and "building the pair" not in console
    rec = json.loads((out / f"{name}.json").read_text())
    assert set(rec["flags"]) == {"off", "on@topk4", "dynspec:goodput@topk4"}
    info = rec["mode_info"]["dynspec:goodput@topk4"]
    assert (info["topk"], info["num_steps"], info["num_draft_tokens"]) == (4, 2, 16)
    assert {m: set(t) for m, t in rec["accept_pass"].items()} == {"on@topk4": {"0"}}
    assert set(rec["modes"]["off"]) == {"1", "3"} and rec["pair"]["reused"]["by"] == name
    assert {"pytest.txt", "junit.xml"} <= _tar_names(out / f"{tests}-logs.tar.xz")
    assert "skipped" in (out / f"{tests}.txt").read_text()  # no GPU here: the suite skips, and says so
    assert "### GPU tests" in (out / f"{name}-summary.md").read_text()


def test_row2_cold_builds_the_pair_beside_the_tests(calls):
    runs, p = calls
    console, out = _ok(runs, "row2-cold")
    assert any(ln.startswith("[pair] [run_pair +") and "building the pair" in ln for ln in console.splitlines())
    # The tests started while the pair was being built (here they may end before its first line:
    # the suite skips at once without a GPU), and the sweep started after both.
    assert "not beside its build" not in console
    assert console.index("GPU tests: pytest") < console.index("DYNSPEC_PAIR_BUILD_ONLY: pair")
    assert max(console.index("GPU tests exit 0"), console.index("built, exit 0")) < console.index(
        "servers wait for their weights")
    assert len(list(out.iterdir())) == 6


def test_row2_cold_on_a_small_gpu_runs_the_tests_after_the_build(calls):
    # An H100 did not hold the tests' first server beside the pair build (OOM at start, pair2h-row2).
    runs, p = calls
    console, out = _ok(runs, "row2-cold-small")
    assert "the GPU tests run after the pair is there, not beside its build" in console
    assert console.index("built, exit 0") < console.index("GPU tests: pytest") < console.index("GPU tests exit 0")
    assert console.index("GPU tests exit 0") < console.index("servers wait for their weights")
    assert len(list(out.iterdir())) == 6


def test_row2_cold_on_a_small_gpu_skips_tests_the_build_left_no_time_for(calls):
    runs, p = calls
    console, out = _ok(runs, "row2-cold-late")  # exit 0: tests not run is no test failure
    note = (out / f"{p}-row2-gpu-tests.txt").read_text()
    assert note.startswith("GPU tests not run:") and "DYNSPEC_ROWS2_TESTS_MIN_S=150" in note
    assert "GPU tests: pytest" not in console and (out / f"{p}-row2.json").exists()
    assert "GPU tests: exit skipped" in console


def test_row2_without_a_pair_runs_no_sweep(calls):
    runs, p = calls
    proc, out = runs["row2-failed"]
    assert proc.returncode == 3, proc.stdout[-3000:]
    assert "no pair: no sweep" in proc.stdout and not (out / f"{p}-row2.json").exists()
    assert (out / f"{p}-row2-gpu-tests.txt").exists() and (out / f"{p}-row2-summary.md").exists()


def test_the_pair_folder_is_ignored_so_it_never_travels():
    """The device keeps ignored files between calls on a warm machine and never copies them there:
    .pair/ must stay ignored (a pair of ~6 GB could not travel, and must not be replaced)."""
    if not (REPO / ".git").exists() or shutil.which("git") is None:
        pytest.skip("not a git checkout")
    probe = subprocess.run(["git", "-C", str(REPO), "check-ignore", "-q", ".pair/pair/target-padded/model.safetensors"])
    assert probe.returncode == 0


def test_run_pair_runs_the_offstep_comparison_on_the_pair_instead_of_the_sweep(calls):
    runs, p = calls
    console, out = _ok(runs, "offstep")
    name = f"{p}-offstep"
    assert "is reused: no build" in console and "off-step comparison" in console
    rec = json.loads((out / f"{name}.json").read_text())
    assert rec["kind"] == "offstep" and set(rec["flags"]) == {"off", "dynspec:never"}
    assert list(rec["per_bs"]) == ["2"] and rec["per_bs"]["2"]["off_failed"] == 0
    args = rec["flags"]["off"]["args"]
    # the pair's trained weights, not the dummy-weight default flags
    assert "--load-format" not in args and args[args.index("--model-path") + 1].endswith("target-padded")
    assert rec["draft_model"].endswith("pair/draft")
    assert "pair-build.log" in _tar_names(out / f"{name}-logs.tar.xz")
    proc, _ = runs["bad_cmd"]
    assert proc.returncode == 2 and "DYNSPEC_PAIR_CMD must be sweep or offstep, got 'trace'" in proc.stderr
