"""Sweep driver end to end against fake servers launched as `python -m sglang.launch_server`."""

import json
import os
import time

import pytest

pytest.importorskip("aiohttp")

from benchmarks import report  # noqa: E402
from benchmarks.dynspec_bench import cli, results, sweep as sweep_mod  # noqa: E402
from benchmarks.dynspec_bench.modes import ServerConfig, parse_mode  # noqa: E402
from benchmarks.dynspec_bench.results import RESULT_SCHEMA, validate  # noqa: E402
from benchmarks.dynspec_bench.server import ServerProcess  # noqa: E402
from benchmarks.dynspec_bench.sweep import Sweep, SweepConfig  # noqa: E402
from benchmarks.dynspec_bench.testing.fixtures import free_port, use_fake_servers  # noqa: E402

FLIP = 3


@pytest.fixture
def shim_env(monkeypatch):
    # Servers are launched the real way (python -m sglang.launch_server); the shim is that sglang.
    use_fake_servers(monkeypatch, 0.002)
    monkeypatch.setattr(sweep_mod, "STATS_SETTLE_S", 0.4)


def _factory(spec, log_dir):
    # Free ports (not the fixed 30000+), and a simulated output drift for the `on` mode only.
    spec.port = free_port()
    if spec.name == "on":
        spec.env["FAKE_SGLANG_FLIP_AT"] = str(FLIP)
    return ServerProcess(spec, log_dir, grace_s=5)


def _cfg(tmp_path, **kw):
    base = dict(
        waves=[["off", "on", "dynspec:random"]],
        server=ServerConfig(model="m", draft="d", stats_root=str(tmp_path / "stats"), max_total_tokens=4096),
        concurrency=[1, 4], output_len=12, input_len=16, requests_factor=2, warmup_tokens=4,
        correctness_prompts=6, correctness_tokens=8, correctness_concurrency=3,
        out_dir=str(tmp_path / "out"), name="t", server_factory=_factory,
    )
    base.update(kw)
    return SweepConfig(**base)


def test_sweep_writes_valid_json_png_and_detects_mismatch(tmp_path, shim_env):
    jsonschema = pytest.importorskip("jsonschema")
    pytest.importorskip("matplotlib")
    rec = Sweep(_cfg(tmp_path), argv=["sweep", "--test"]).run()
    out = tmp_path / "out"
    on_disk = json.loads((out / "t.json").read_text())
    jsonschema.validate(on_disk, RESULT_SCHEMA)
    assert (out / "t.png").stat().st_size > 1000
    assert set(on_disk["modes"]) == {"off", "on", "dynspec:random"}
    for mode, levels in on_disk["modes"].items():
        assert set(levels) == {"1", "4"}
        for c, lv in levels.items():
            assert lv["failed"] == 0 and lv["requests"] == max(8, 2 * int(c))
            assert lv["output_tok_per_s"] > 0
    assert on_disk["modes"]["off"]["1"]["switches"] == 0
    dyn = on_disk["modes"]["dynspec:random"]["4"]
    # random policy in the fake flips a coin per token: many switches, steps = tokens generated
    assert dyn["decode_steps"] == 8 * 12 and dyn["switches"] > 10
    assert on_disk["modes"]["on"]["1"]["accept_length"] == pytest.approx(2.0)
    assert on_disk["correctness"]["off"]["mismatched"] == 0
    assert on_disk["correctness"]["on"] == {"requests": 6, "mismatched": 6, "first_mismatch": [FLIP] * 6,
                                             "failed": 0}
    assert on_disk["correctness"]["dynspec:random"]["first_mismatch"] == [None] * 6
    best = max(on_disk["modes"]["off"]["4"]["output_tok_per_s"], on_disk["modes"]["on"]["4"]["output_tok_per_s"])
    assert on_disk["ratio_to_best_static"]["dynspec:random"]["4"] == pytest.approx(
        on_disk["modes"]["dynspec:random"]["4"]["output_tok_per_s"] / best, rel=1e-3)
    assert on_disk["flags"]["dynspec:random"]["env"]["SGLANG_DYNSPEC_POLICY"] == "random"
    assert "--speculative-algorithm" in on_disk["flags"]["on"]["args"]
    assert "--speculative-algorithm" not in on_disk["flags"]["off"]["args"]
    assert on_disk["phase_times_s"]["start_wave0"] > 0 and "start:on" in on_disk["phase_times_s"]
    assert on_disk["server_stats"]["dynspec:random"]["dynspec_stats"]["policy"] == "random"
    assert rec["topk"] == 1 and rec["num_draft_tokens"] == 3
    table = report.report(on_disk, "t.json")
    assert "dynspec:random" in table and f"| on | 6 / 6 | {', '.join([str(FLIP)] * 6)} |" in table


def test_deadline_skips_but_still_writes(tmp_path, shim_env):
    rec = Sweep(_cfg(tmp_path, deadline=time.monotonic() - 1)).run()
    assert rec["modes"] == {}
    assert {s["mode"] for s in rec["skipped"]} == {"off", "on", "dynspec:random"}
    assert json.loads((tmp_path / "out" / "t.json").read_text())["skipped"]


def test_failed_server_is_reported_and_others_measured(tmp_path, shim_env, monkeypatch):
    def factory(spec, log_dir):
        if spec.name == "on":
            spec.env["FAKE_SGLANG_DIE_IF_FLAG"] = "--speculative-algorithm"
        return _factory(spec, log_dir)

    rec = Sweep(_cfg(tmp_path, waves=[["off", "on"]], concurrency=[2], server_factory=factory)).run()
    assert "on" not in rec["modes"] and "2" in rec["modes"]["off"]
    assert "unrecognized arguments" in rec["errors"]["on"]["start"]


def test_validate_names_the_bad_field():
    rec = {"kind": "sweep"}
    with pytest.raises(ValueError, match="sglang_version|required"):
        validate(rec)


def test_config_and_cli_errors_name_the_field(tmp_path, capsys):
    with pytest.raises(ValueError, match="twice"):
        _cfg(tmp_path, waves=[["off"], ["off"]])
    with pytest.raises(ValueError, match="concurrency"):
        _cfg(tmp_path, concurrency=[0])
    with pytest.raises(ValueError, match="kind must be"):
        _cfg(tmp_path, waves=[["fast"]])
    with pytest.raises(SystemExit):
        cli.main(["sweep", "-C", "1,x"])
    with pytest.raises(SystemExit, match="--policy-args"):
        cli.main(["sweep", "--modes", "off", "--policy-args", "{bad", "--out-dir", str(tmp_path)])
    for bad in ("512,32", "32", "0,5", "a,b"):
        with pytest.raises(SystemExit):
            cli.main(["sweep", "--modes", "off", "--output-len-range", bad, "--out-dir", str(tmp_path)])
    with pytest.raises(SystemExit, match="--add-trace"):
        cli.main(["sweep", "--modes", "off", "--add-trace", "2,25,8", "--out-dir", str(tmp_path)])
    # The added trace's own sampling: bad values are refused naming the option; without
    # --add-trace the options would do nothing, so they are refused too.
    for opt, bad in (("--add-trace-temperature", "-1"), ("--add-trace-temperature", "hot"),
                     ("--add-trace-temperature", "nan"), ("--add-trace-output-len-range", "256,32"),
                     ("--add-trace-output-len-range", "0,5"), ("--add-trace-output-len-range", "32")):
        with pytest.raises(SystemExit):
            cli.main(["sweep", "--modes", "off", "--add-trace", "2,25,8,3", opt, bad, "--out-dir", str(tmp_path)])
        assert opt in capsys.readouterr().err
    for opt, val in (("--add-trace-temperature", "0"), ("--add-trace-output-len-range", "32,256")):
        with pytest.raises(SystemExit, match=f"{opt}: only with --add-trace"):
            cli.main(["sweep", "--modes", "off", opt, val, "--out-dir", str(tmp_path)])
    with pytest.raises(ValueError, match="add_trace"):
        _cfg(tmp_path, trace=([0.0], None), add_trace=sweep_mod.TracePlan(1, 2, 1, 1, min_phase_s=1))


def test_cli_sweep_through_real_launcher(tmp_path, shim_env):
    rc = cli.main(["sweep", "--modes", "off", "-C", "2", "--output-len", "6", "--input-len", "8",
                   "--correctness-prompts", "2", "--out-dir", str(tmp_path), "--name", "c", "--min-requests", "20",
                   "--base-port", str(free_port()), "--stats-root", str(tmp_path / "s")])
    assert rc == 0
    rec = json.loads((tmp_path / "c.json").read_text())
    assert rec["modes"]["off"]["2"]["requests"] == 20  # max(--min-requests, 8 × C)
    assert "--max-total-tokens" in rec["flags"]["off"]["args"]
    assert rec["command"].endswith("--stats-root " + results.portable_text(str(tmp_path / "s")))  # <tmp>/...
    assert not os.environ.get("DYNSPEC_COMMAND")


def test_pair_accept_pass_and_manifest(tmp_path, shim_env):
    man = tmp_path / "pair.json"
    man.write_text(json.dumps({"config": {"pad_layers": 48}, "phase_seconds": {"target": 120, "draft": 60},
                               "repeated_4gram_share": {"target_greedy": 0.7, "held_out": 0.1}}))
    cfg = _cfg(tmp_path, waves=[["off", "on", "on@topk4"]], concurrency=[2], kind="pair",
               accept_temperatures=[0.0, 0.7], accept_only=["on@topk4"], accept_requests=6, accept_concurrency=3,
               pair_manifest=str(man))
    rec = Sweep(cfg, argv=["sweep"]).run()
    validate(rec)
    assert set(rec["modes"]) == {"off", "on"}  # accept-only modes get no levels
    assert set(rec["accept_pass"]) == {"on", "on@topk4"}
    for mode in ("on", "on@topk4"):
        assert set(rec["accept_pass"][mode]) == {"0", "0.7"}
        assert rec["accept_pass"][mode]["0"]["requests"] == 6
    assert rec["accept_length"] == {"topk1": pytest.approx(2.0, abs=0.3), "topk4": pytest.approx(2.0, abs=0.3)}
    assert set(rec["accept_length_sampled"]["topk4"]) == {"0.7"}
    assert rec["build_minutes"] == 3.0 and rec["padded"] is True
    assert rec["repeated_4gram_share"]["held_out"] == 0.1
    with pytest.raises(ValueError, match="accept_only"):
        _cfg(tmp_path, accept_only=["on@topk4"], accept_temperatures=[0.0])


def test_servers_start_as_their_weights_appear(tmp_path, shim_env):
    """A builder still writing: `off` launches once the target exists, `on` once the draft does too,
    and the manifest (finished last) is read when the sweep ends."""
    import threading

    target, draft, man = tmp_path / "target", tmp_path / "draft", tmp_path / "pair.json"
    target.mkdir()
    draft.mkdir()
    man.write_text(json.dumps({"phase_seconds": {"target": 1}}))  # incomplete at start

    def builder():
        time.sleep(1.0)
        (target / "model.safetensors").write_bytes(b"w")
        time.sleep(1.5)
        (draft / "model.safetensors").write_bytes(b"w")
        man.write_text(json.dumps({"phase_seconds": {"target": 120, "draft": 60}}))

    th = threading.Thread(target=builder)
    th.start()
    server = ServerConfig(model=str(target), draft=str(draft), stats_root=str(tmp_path / "stats"),
                          max_total_tokens=4096, wait_for_weights_s=30)
    rec = Sweep(_cfg(tmp_path, waves=[["off", "on"]], concurrency=[2], server=server, pair_manifest=str(man)),
                argv=["sweep"]).run()
    th.join()
    waits = rec["phase_times_s"]
    assert 0.8 < waits["wait:off"] < 2.3 and waits["wait:on"] > waits["wait:off"] + 1.0
    assert rec["modes"]["off"]["2"]["failed"] == 0 and rec["modes"]["on"]["2"]["failed"] == 0
    assert rec["build_minutes"] == 3.0  # the finished manifest, not the one present at start


def test_failed_builder_ends_the_wait(tmp_path, shim_env):
    (tmp_path / "target").mkdir()
    (tmp_path / "target" / "model.safetensors").write_bytes(b"w")
    (tmp_path / "BUILD_FAILED").write_text("build_pair exit 1")
    server = ServerConfig(model=str(tmp_path / "target"), draft=str(tmp_path / "draft"),
                          stats_root=str(tmp_path / "stats"), max_total_tokens=4096, wait_for_weights_s=30,
                          wait_abort_file=str(tmp_path / "BUILD_FAILED"))
    t0 = time.monotonic()
    rec = Sweep(_cfg(tmp_path, waves=[["off", "on"]], concurrency=[2], server=server), argv=["sweep"]).run()
    assert time.monotonic() - t0 < 25  # no 30 s wait
    assert "BUILD_FAILED appeared" in rec["errors"]["on"]["start"]
    assert rec["modes"]["off"]["2"]["failed"] == 0  # the target's server still measured


def test_level_major_varied_lengths_then_added_trace(tmp_path, shim_env, capsys):
    """GPU 1's suite: every mode at one C before the next, per-request lengths drawn once for all
    modes, then the open-loop low/high trace on the same servers and its per-phase summary."""
    from benchmarks.dynspec_bench.loadgen import output_lengths
    from benchmarks.dynspec_bench.sweep import TracePlan

    plan = TracePlan(low_rate=5.0, high_rate=60.0, phase_s=0.5, cycles=2, min_phase_s=0.5, overhead_s=1.0)
    cfg = _cfg(tmp_path, concurrency=[1, 3], level_order="level", output_len_range=(3, 20), temperature=0.7,
               seed=5, add_trace=plan, deadline=time.monotonic() + 600)
    rec = Sweep(cfg, argv=["sweep"]).run()
    validate(rec)
    assert rec["settings"]["output_len_range"] == [3, 20] and rec["settings"]["output_len_seed"] == 5
    assert rec["settings"]["level_order"] == "level"
    for ci, c in enumerate([1, 3]):
        n = cfg.requests_for(c)
        want = sum(output_lengths(n, 3, 20, seed=5 * 1_000_003 + 1 + ci))
        for mode in ("off", "on", "dynspec:random"):
            lv = rec["modes"][mode][str(c)]
            assert lv["failed"] == 0 and lv["completion_tokens"] == want  # ignore_eos: exact lengths
    # Level-major: all three modes at C=1 are logged before any mode at C=3; each level starts one
    # mode later than the one before (no mode always follows the same one).
    lines = [ln for ln in capsys.readouterr().out.splitlines() if " C=" in ln and "tok/s" in ln]
    assert [ln.split()[2] + ln.split()[3] for ln in lines] == [
        "offC=1", "onC=1", "dynspec:randomC=1", "onC=3", "dynspec:randomC=3", "offC=3"]
    added = rec["settings"]["added_trace"]
    assert added["phase_s"] == 0.5 and added["phases"] == ["low0", "high0", "low1", "high1"]
    assert added["temperature"] == 0.7 and added["output_len_range"] == [3, 20]  # the run's own
    tokens = set()
    for mode in ("off", "on", "dynspec:random"):
        tr = rec["modes"][mode]["trace"]
        assert tr["requests"] == added["arrivals"] and tr["failed"] == 0
        assert set(tr["phases"]) == {"low0", "high0", "low1", "high1"}
        for ph in tr["phases"].values():
            assert ph["tpot_p50_ms"] > 0 and ph["ttft_p50_ms"] > 0 and ph["output_tok_per_s"] > 0
        tokens.add(tr["completion_tokens"])
        assert rec["phase_times_s"][f"trace:{mode}"] > 0 and rec["phase_times_s"][f"measure:{mode}"] > 0
    assert len(tokens) == 1  # the same lengths for every mode
    assert rec["modes"]["dynspec:random"]["trace"]["decode_steps"] == tokens.pop()  # fake: a step per token
    summ = rec["trace_phase_summary"]
    assert summ["phases"] == ["low0", "high0", "low1", "high1"] and summ["dynspec_modes"] == ["dynspec:random"]
    dyn = summ["dynspec:random"]
    assert dyn["tpot_p50_best_single_static"] in ("off", "on")
    assert dyn["tpot_p50_best_single_static_over_dynspec_geomean_higher_is_better"] > 0
    assert dyn["ttft_p50_phases_used"] == summ["phases"]
    ph = summ["per_phase"]["high1"]
    better = ph["tpot_p50_better_static"]
    assert ph["dynspec:random"]["tpot_p50_dynspec_over_better_static_lower_is_better"] == pytest.approx(
        rec["modes"]["dynspec:random"]["trace"]["phases"]["high1"]["tpot_p50_ms"]
        / rec["modes"][better]["trace"]["phases"]["high1"]["tpot_p50_ms"], rel=1e-3)
    assert not rec["skipped"]
    pytest.importorskip("matplotlib")
    from benchmarks.dynspec_bench.plot import trace_phase_series

    phases, by_mode = trace_phase_series(rec)  # the PNG's third panel
    assert phases == summ["phases"] and set(by_mode) == {"off", "on", "dynspec:random"}
    assert by_mode["on"][1] == rec["modes"]["on"]["trace"]["phases"]["high0"]["tpot_p50_ms"]
    assert (tmp_path / "out" / "t.png").stat().st_size > 1000


def test_added_trace_sends_its_own_temperature_and_lengths(tmp_path, shim_env):
    """--add-trace-temperature / --add-trace-output-len-range: the levels keep the run's sampling,
    the trace's requests (as the servers receive them) carry the trace's, the same for every mode."""
    from benchmarks.dynspec_bench.loadgen import output_lengths
    from benchmarks.dynspec_bench.sweep import TracePlan

    def factory(spec, log_dir):
        spec.env["FAKE_SGLANG_REQUEST_LOG"] = str(tmp_path / f"requests-{spec.name.replace(':', '_')}.jsonl")
        return _factory(spec, log_dir)

    plan = TracePlan(low_rate=5.0, high_rate=60.0, phase_s=0.5, cycles=1, min_phase_s=0.5, overhead_s=1.0,
                     temperature=0.0, output_len_range=(2, 5))
    cfg = _cfg(tmp_path, waves=[["off", "dynspec:random"]], concurrency=[2], level_order="level",
               output_len_range=(6, 20), temperature=0.7, seed=5, add_trace=plan,
               deadline=time.monotonic() + 600, server_factory=factory)
    rec = Sweep(cfg, argv=["sweep"]).run()
    validate(rec)
    added = rec["settings"]["added_trace"]
    assert added["temperature"] == 0.0 and added["output_len_range"] == [2, 5]
    assert rec["settings"]["temperature"] == 0.7 and rec["settings"]["output_len_range"] == [6, 20]
    n_level, n_trace = cfg.requests_for(2), added["arrivals"]
    level_lens = output_lengths(n_level, 6, 20, seed=5 * 1_000_003 + 1)
    trace_lens = output_lengths(n_trace, 2, 5, seed=5 * 1_000_003 + 30_000)
    assert max(level_lens) > 5  # the ranges tell the two request sets apart
    for mode in ("off", "dynspec:random"):
        assert rec["modes"][mode]["2"]["completion_tokens"] == sum(level_lens)
        assert rec["modes"][mode]["trace"]["completion_tokens"] == sum(trace_lens)
        assert rec["modes"][mode]["trace"]["failed"] == 0
        sent = [json.loads(ln) for ln in
                (tmp_path / f"requests-{mode.replace(':', '_')}.jsonl").read_text().splitlines()]
        trace_sent = sent[-n_trace:]  # the trace runs last on each server
        assert {p["temperature"] for p in trace_sent} == {0.0}
        assert sorted(p["max_new_tokens"] for p in trace_sent) == sorted(trace_lens)
        level_sent = [p for p in sent[:-n_trace] if p["temperature"] == 0.7 and p["max_new_tokens"] > 4]
        assert sorted(p["max_new_tokens"] for p in level_sent)[-n_level:] == sorted(level_lens)


def test_added_trace_is_skipped_first_when_time_runs_short(tmp_path, shim_env):
    """Levels have priority: with too little time left for every mode's trace, it is skipped (and
    recorded), never run for only some modes. 60 s for 2 modes: (30 - 10) / 6 < 5 s phases."""
    from benchmarks.dynspec_bench.sweep import TracePlan

    plan = TracePlan(low_rate=2.0, high_rate=25.0, phase_s=8.0, cycles=3, min_phase_s=5.0, overhead_s=10.0)
    cfg = _cfg(tmp_path, waves=[["off", "dynspec:random"]], concurrency=[2], level_order="level",
               add_trace=plan, deadline=time.monotonic() + 60, wave_margin_s=1, level_margin_s=1)
    rec = Sweep(cfg, argv=["sweep"]).run()
    assert rec["modes"]["off"]["2"]["failed"] == 0 and rec["modes"]["dynspec:random"]["2"]["failed"] == 0
    assert "trace" not in rec["modes"]["off"] and "trace_phase_summary" not in rec
    skipped = [s for s in rec["skipped"] if s["C"] == "trace"]
    assert {s["mode"] for s in skipped} == {"off", "dynspec:random"}
    assert "deadline" in skipped[0]["why"] and rec["settings"]["added_trace"]["phase_s"] is None


def test_requests_per_level_floor_factor_and_cap(tmp_path):
    cfg = _cfg(tmp_path, requests_factor=8, min_requests=32, max_requests=600)
    assert [cfg.requests_for(c) for c in (1, 2, 5, 10, 70, 100, 250)] == [32, 32, 40, 80, 560, 600, 600]
    assert _cfg(tmp_path, min_requests=32, max_requests=16).requests_for(1) == 16  # the cap wins


def test_level_needs_twice_the_longest_time_that_c_took(tmp_path, shim_env):
    sw = Sweep(_cfg(tmp_path, level_margin_s=25.0, deadline=time.monotonic() + 40))
    assert sw._level_time_needed(100) == 25.0  # nothing measured at C=100 yet: the margin
    sw._level_wall[100] = 30.0
    assert sw._level_time_needed(100) == 60.0
    sw._run_level(parse_mode("on"), None, 0, 100)  # 40 s left < 60 s: skipped before touching the server
    assert sw.record["skipped"] == [{"mode": "on", "C": 100, "why": "deadline"}]
