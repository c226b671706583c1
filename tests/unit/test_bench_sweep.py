"""Sweep driver end to end against fake servers launched as `python -m sglang.launch_server`."""

import json
import os
import sys
import time
from pathlib import Path

import pytest

pytest.importorskip("aiohttp")
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from benchmarks import report  # noqa: E402
from benchmarks.dynspec_bench import cli, results, sweep as sweep_mod  # noqa: E402
from benchmarks.dynspec_bench.modes import ServerConfig  # noqa: E402
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


def test_config_and_cli_errors_name_the_field(tmp_path):
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


def test_cli_sweep_through_real_launcher(tmp_path, shim_env):
    rc = cli.main(["sweep", "--modes", "off", "-C", "2", "--output-len", "6", "--input-len", "8",
                   "--correctness-prompts", "2", "--out-dir", str(tmp_path), "--name", "c",
                   "--base-port", str(free_port()), "--stats-root", str(tmp_path / "s")])
    assert rc == 0
    rec = json.loads((tmp_path / "c.json").read_text())
    assert rec["modes"]["off"]["2"]["requests"] == 16
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
