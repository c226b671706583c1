"""`fuzz --workload faults` against fake SGLang servers: case mix, aborts, opt-outs, stops, mismatches."""

import asyncio
import json
import socket
import time

import pytest

pytest.importorskip("aiohttp")

from benchmarks.dynspec_bench import cli, faults as flt, fuzz, loadgen  # noqa: E402
from benchmarks.dynspec_bench.modes import ServerConfig  # noqa: E402
from benchmarks.dynspec_bench.prompts import random_prompts  # noqa: E402
from benchmarks.dynspec_bench.results import validate  # noqa: E402
from benchmarks.dynspec_bench.server import ServerProcess, http_get  # noqa: E402
from benchmarks.dynspec_bench.testing.fake_server import token_for  # noqa: E402
from benchmarks.dynspec_bench.testing.fixtures import free_port, start_fake, use_fake_servers  # noqa: E402

# Opt-outs and aborts far more often than the GPU default so a short CPU run surely has them.
TEST_MIX = dict(p_optout=0.15, p_abort=0.2, p_stop=0.2, long_prompt_len=600, prefix_len=64, suffix_len=8,
                input_len=32, output_lens=(1, 2, 7, 33, 64), abort_len=200, stop_lens=(16, 33))


# ---- the case mix (pure) -----------------------------------------------------------------------
def test_cases_are_seeded_and_cover_every_fault():
    mix = flt.FaultMix()
    src = flt.CaseSource(mix, seed=3)
    assert src.case(17) == flt.CaseSource(mix, seed=3).case(17)
    assert src.case(17) != flt.CaseSource(mix, seed=4).case(17)
    cases = [src.case(i) for i in range(4000)]
    tags = {t for c in cases for t in c.tags}
    assert {"long", "prefix", "repeat", "stop", "abort", "abort_disconnect", "abort_endpoint", "optout",
            "len1"} <= tags
    assert {c.max_new_tokens for c in cases} >= set(flt.OUTPUT_LENS)
    for c in cases:
        p = c.params([5]) if c.stop_at is not None else c.params()
        assert p["temperature"] == 0.0 and p["max_new_tokens"] == c.max_new_tokens
        if "long" in c.tags:
            assert len(c.prompt) == 1500
        if "prefix" in c.tags:
            assert any(c.prompt[:mix.prefix_len] == pre for pre in src.prefixes)
            assert len(c.prompt) == mix.prefix_len + (0 if "repeat" in c.tags else mix.suffix_len)
        if c.stop_at is not None:
            assert 1 <= c.stop_at < c.max_new_tokens
            assert p["stop_token_ids"] == [5] and p["ignore_eos"] is False  # ignore_eos would skip the check
        else:
            assert "stop_token_ids" not in p and p["ignore_eos"] is True
        if "optout" in c.tags:
            assert p["custom_params"] == {"dynspec": "off"} and c.max_new_tokens in mix.optout_lens + (300,)
        if c.abort:
            assert c.max_new_tokens >= mix.abort_len and 1 <= c.abort_after <= mix.abort_after_max
    share = sum("optout" in c.tags for c in cases) / len(cases)
    assert 0.002 < share < 0.03  # rare: a C=256 batch must not hold one all the time
    with pytest.raises(ValueError, match="p_abort"):
        flt.FaultMix(p_abort=1.5)
    with pytest.raises(ValueError, match="p_long"):
        flt.FaultMix(p_long=0.7, p_prefix=0.5)
    assert flt.kv_tokens_needed(256) == 204800 and flt.kv_tokens_needed(1) == 32768


# ---- loadgen abort support and the fake server's new behaviour ---------------------------------
@pytest.fixture(scope="module")
def fake(tmp_path_factory):
    srv = start_fake("faults-fake", tmp_path_factory.mktemp("logs"), {"FAKE_SGLANG_TOKEN_DELAY_S": "0.002"})
    yield srv
    srv.stop()


def _one(url, prompt, params, **kw):
    async def go():
        async with loadgen._session(0, 60) as s:
            return await loadgen.send_one(s, url, 0, prompt, params, time.perf_counter(), **kw)
    return asyncio.run(go())


def _aborted_count(url):
    return [v for k, v in loadgen_metrics(url).items() if k.startswith("sglang:num_aborted_requests_total")][0]


def loadgen_metrics(url):
    from benchmarks.dynspec_bench.server import parse_prometheus
    status, body = http_get(url + "/metrics")
    assert status == 200
    return parse_prometheus(body.decode())


def test_send_one_aborts_by_disconnect_and_by_endpoint(fake):
    p = random_prompts(1, 16, seed=9)[0]
    before = _aborted_count(fake.base_url)
    r = _one(fake.base_url, p, loadgen.sampling_params(200), abort_after_chunks=3)
    assert r.aborted and r.abort_landed and not r.ok and r.error is None
    assert r.output_ids == [token_for(p, i) for i in range(3)]
    r2 = _one(fake.base_url, p, loadgen.sampling_params(200), abort_after_chunks=2, abort_via="endpoint",
              rid="rid-test-1")
    assert r2.aborted and r2.abort_landed and r2.finish_reason == "abort" and r2.error is None
    assert 2 <= r2.completion_tokens < 200
    deadline = time.time() + 5
    while _aborted_count(fake.base_url) < before + 2 and time.time() < deadline:
        time.sleep(0.05)
    assert _aborted_count(fake.base_url) == before + 2  # the server saw both aborts
    # finished before k chunks: an intended abort that did not land
    r3 = _one(fake.base_url, p, loadgen.sampling_params(2), abort_after_chunks=5)
    assert r3.aborted and r3.abort_landed is False and r3.error is None
    with pytest.raises(ValueError, match="rid"):
        _one(fake.base_url, p, loadgen.sampling_params(4), abort_after_chunks=1, abort_via="endpoint")


def test_fake_honours_stop_ids_and_reports_cache_hits(fake):
    p = random_prompts(1, 40, seed=10)[0]
    stop = token_for(p, 5)
    r = _one(fake.base_url, p, loadgen.sampling_params(30, stop_token_ids=[stop], ignore_eos=False))
    assert r.ok and r.finish_reason == "stop" and r.output_ids == [token_for(p, i) for i in range(6)]
    r = _one(fake.base_url, p, loadgen.sampling_params(30, stop_token_ids=[stop]))  # ignore_eos: no stop
    assert r.ok and r.finish_reason == "length" and r.completion_tokens == 30
    assert r.cached_tokens == 32  # the same prompt again: its block-aligned prefix is cached


# ---- the whole fault run on fake servers --------------------------------------------------------
@pytest.fixture
def shim_env(monkeypatch):
    use_fake_servers(monkeypatch, 0.001)
    monkeypatch.setattr(fuzz, "STATS_SETTLE_S", 0.4)


def _factory(flip_dyn: bool = False):
    def factory(spec, log_dir):
        spec.port = free_port()
        if flip_dyn and spec.name.startswith("dynspec"):
            spec.env["FAKE_SGLANG_FLIP_AT"] = "0"  # corrupt the first token of every dynspec output
        return ServerProcess(spec, log_dir, grace_s=5)
    return factory


def _cfg(tmp_path, **kw):
    base = dict(server=ServerConfig(model="m", draft="d", stats_root=str(tmp_path / "s")), workload="faults",
                concurrency=[8], min_decode_steps=1500, max_seconds_per_c=60, out_dir=str(tmp_path), name="flt",
                server_factory=_factory(), fault_mix=flt.FaultMix(**TEST_MIX), drain_s=10, poll_s=0.2, seed=1)
    base.update(kw)
    return fuzz.FuzzConfig(**base)


def test_faults_run_counts_everything_and_matches(tmp_path, shim_env):
    rec = fuzz.run_fuzz(_cfg(tmp_path, concurrency=[4, 16]), argv=["fuzz", "--workload", "faults"])
    validate(rec)
    on_disk = json.loads((tmp_path / "flt.json").read_text())
    assert on_disk["kind"] == "fuzz" and on_disk["workload"] == "faults" and not on_disk["errors"]
    assert set(on_disk["flags"]) == {"off", "dynspec:random"}  # no static `on` server here
    for mode in on_disk["flags"].values():
        args = mode["args"]
        assert args[args.index("--chunked-prefill-size") + 1] == "512" and "--enable-metrics" in args
    assert on_disk["settings"]["chunked_prefill_size"] == 512
    for c in ("4", "16"):
        lv = on_disk["per_C"][c]
        assert lv["stop_reason"] == "decode_steps" and lv["decode_steps"] >= 1500 and lv["switches"] > 0
        assert lv["crashed"] is False and lv["leak_reports"] == 0
        assert lv["errors"] == 0 and lv["reference_errors"] == 0, (lv["error_samples"], lv["reference_error_samples"])
        assert lv["aborted"] > 0 and lv["abort_landed"] > 0
        assert lv["steps_forced_off"] > 0  # the fake counts opt-out requests' steps as forced off
        assert lv["compared"] > 0 and lv["mismatched"] == 0 and lv["mismatch_samples"] == []
        assert lv["stopped"] > 0 and lv["finish_reasons"].get("stop", 0) >= lv["stopped"]
        assert lv["cache_hit_requests"] > 0
        tags = lv["requests_by_tag"]
        for t in ("long", "prefix", "stop", "abort", "optout", "len1"):
            assert tags.get(t, 0) > 0, t
        assert lv["requests"] == lv["compared"] + lv["aborted"]
        assert lv["accept_length_static_on"] is None
    assert on_disk["metrics_scrape_status"] == 200
    assert any(ln.startswith('sglang_dynspec_decode_steps_total{mode="off"') for ln in on_disk["metrics_scrape"])
    assert all(ln.startswith("sglang_dynspec_") for ln in on_disk["metrics_scrape"])
    total_aborted = sum(on_disk["per_C"][c]["aborted"] for c in ("4", "16"))
    assert on_disk["server_aborted_requests"] >= total_aborted * 0.5  # landed ones; some may end first
    assert on_disk["server_stats"]["dynspec:random"]["dynspec_stats"]["steps_forced_off"] > 0


def test_faults_run_detects_a_corrupted_token(tmp_path, shim_env):
    rec = fuzz.run_fuzz(_cfg(tmp_path, min_decode_steps=600, server_factory=_factory(flip_dyn=True)))
    lv = rec["per_C"]["8"]
    assert lv["compared"] > 0 and lv["mismatched"] == lv["compared"]
    assert lv["mismatch_samples"] and all(s["first_mismatch"] == 0 for s in lv["mismatch_samples"])
    assert lv["aborted"] > 0 and lv["errors"] == 0  # aborts are counted, never compared


def test_faults_deadline_skips_and_still_writes(tmp_path, shim_env):
    rec = fuzz.run_fuzz(_cfg(tmp_path, deadline=time.monotonic() + 5))  # less than drain + margin left
    assert rec["per_C"] == {} and rec["skipped"] == [{"C": 8, "why": "deadline"}]
    assert json.loads((tmp_path / "flt.json").read_text())["workload"] == "faults"


def test_faults_level_stops_at_its_time_budget(tmp_path, shim_env):
    t0 = time.monotonic()
    rec = fuzz.run_fuzz(_cfg(tmp_path, min_decode_steps=10**9, max_seconds_per_c=3, drain_s=2))
    lv = rec["per_C"]["8"]
    assert lv["stop_reason"] == "time" and lv["requests"] > 0
    assert time.monotonic() - t0 < 40


def _two_free_ports() -> int:
    """A port P with P and P+1 both free (the CLI puts `off` on P and the dynspec server on P+1)."""
    for _ in range(200):
        p = free_port()
        try:
            with socket.socket() as a, socket.socket() as b:
                a.bind(("127.0.0.1", p))
                b.bind(("127.0.0.1", p + 1))
            return p
        except OSError:
            continue
    raise RuntimeError("no two adjacent free ports")


def test_cli_faults_through_real_launcher(tmp_path, shim_env):
    rc = cli.main(["fuzz", "--workload", "faults", "-C", "4", "--min-decode-steps", "300", "--input-len", "16",
                   "--long-prompt-len", "600", "--out-dir", str(tmp_path), "--name", "cf", "--drain-s", "5",
                   "--base-port", str(_two_free_ports()), "--stats-root", str(tmp_path / "s"),
                   "--policy-args", '{"seed": 0}'])
    rec = json.loads((tmp_path / "cf.json").read_text())
    assert rc == 0, rec.get("errors")
    assert rec["workload"] == "faults" and rec["settings"]["mix"]["long_prompt_len"] == 600
    lv = rec["per_C"]["4"]
    assert lv["decode_steps"] >= 300 and lv["crashed"] is False and lv["mismatched"] == 0
    args = rec["flags"]["dynspec:random"]["args"]
    assert args[args.index("--max-total-tokens") + 1] == "32768"
    assert rec["flags"]["dynspec:random"]["env"]["SGLANG_DYNSPEC_POLICY_ARGS"] == '{"seed": 0}'


def test_switch_workload_defaults_unchanged():
    args = cli.build_parser().parse_args(["fuzz"])
    assert args.workload == "switch" and args.concurrency is None
    assert cli.FUZZ_DEFAULTS["switch"] == {"concurrency": [1, 8, 32, 128], "min_decode_steps": 2000,
                                           "max_seconds_per_c": 120.0}
    cfg = fuzz.FuzzConfig(server=ServerConfig(model="m"))
    assert cfg.workload == "switch" and cfg.concurrency == [1, 8, 32, 128] and cfg.min_decode_steps == 2000
    with pytest.raises(ValueError, match="workload"):
        fuzz.FuzzConfig(server=ServerConfig(model="m"), workload="chaos")
