"""Load generator against the fake SGLang server: timing figures, token ids, failures, traces."""

import asyncio

import pytest

pytest.importorskip("aiohttp")

from benchmarks.dynspec_bench import loadgen  # noqa: E402
from benchmarks.dynspec_bench.prompts import random_prompts  # noqa: E402
from benchmarks.dynspec_bench.testing.fake_server import token_for  # noqa: E402
from benchmarks.dynspec_bench.testing.fixtures import start_fake  # noqa: E402

DELAY = 0.01


@pytest.fixture(scope="module")
def plain(tmp_path_factory):
    srv = start_fake("plain", tmp_path_factory.mktemp("logs"), {"FAKE_SGLANG_TOKEN_DELAY_S": str(DELAY)})
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def spec(tmp_path_factory):
    srv = start_fake("spec", tmp_path_factory.mktemp("logs"),
                     {"FAKE_SGLANG_TOKEN_DELAY_S": "0.001", "FAKE_SGLANG_ACCEPT": "2.5"}, spec=True)
    yield srv
    srv.stop()


def test_closed_loop_rates_and_ids(plain):
    n_tok, c, n_req = 20, 4, 16
    prompts = random_prompts(n_req, 32, seed=3)
    res, wall = asyncio.run(loadgen.closed_loop(plain.base_url, prompts, c, loadgen.sampling_params(n_tok)))
    s = loadgen.summarize(res, wall)
    assert s["requests"] == n_req and s["failed"] == 0
    # Each request needs >= n_tok delays (prefill + n_tok-1 gaps): tok/s cannot exceed C / delay.
    upper = c / DELAY
    assert 0.3 * upper <= s["output_tok_per_s"] <= upper * 1.02
    assert DELAY * 1000 * 0.9 <= s["tpot_p50_ms"] <= DELAY * 1000 * 3
    assert s["tpot_p99_ms"] >= s["tpot_p50_ms"]
    assert s["ttft_p50_ms"] >= DELAY * 1000 * 0.9
    assert s["accept_length"] is None  # no speculation on this server
    by_index = sorted(res, key=lambda r: r.index)
    for r, p in zip(by_index, prompts):
        assert r.output_ids == [token_for(p, i) for i in range(n_tok)]


def test_concurrency_scales_throughput(plain):
    prompts = random_prompts(8, 16, seed=4)
    p = loadgen.sampling_params(10)
    r1, w1 = asyncio.run(loadgen.closed_loop(plain.base_url, prompts, 1, p))
    r8, w8 = asyncio.run(loadgen.closed_loop(plain.base_url, prompts, 8, p))
    assert loadgen.summarize(r8, w8)["output_tok_per_s"] > 3 * loadgen.summarize(r1, w1)["output_tok_per_s"]


def test_accept_length_from_meta_info(spec):
    res, wall = asyncio.run(loadgen.closed_loop(spec.base_url, random_prompts(4, 8, seed=5), 2,
                                                loadgen.sampling_params(20)))
    s = loadgen.summarize(res, wall)
    # fake server: verify count = ceil(20 / 2.5) = 8 -> 20 / 8
    assert s["accept_length"] == pytest.approx(20 / 8)
    assert {r.spec_correct_drafts for r in res} == {20 - 8}  # meta_info's accepted drafts, parsed
    assert spec.avg_spec_accept_length() == pytest.approx(20 / 8)


def test_failures_counted(tmp_path):
    srv = start_fake("flaky", tmp_path, {"FAKE_SGLANG_FAIL_EVERY": "3", "FAKE_SGLANG_TOKEN_DELAY_S": "0.001"})
    try:
        res, wall = asyncio.run(loadgen.closed_loop(srv.base_url, random_prompts(9, 8, seed=6), 1,
                                                    loadgen.sampling_params(5)))
    finally:
        srv.stop()
    s = loadgen.summarize(res, wall)
    assert s["requests"] == 9 and s["failed"] == 3
    assert all("HTTP 500" in e for e in loadgen.first_errors(res))
    assert s["output_tok_per_s"] == pytest.approx(6 * 5 / wall, rel=1e-3)


def test_unreachable_server_fails_cleanly():
    from benchmarks.dynspec_bench.testing.fixtures import free_port
    res, wall = asyncio.run(loadgen.closed_loop(f"http://127.0.0.1:{free_port()}", [[1, 2]], 1,
                                                loadgen.sampling_params(4)))
    assert loadgen.summarize(res, wall)["failed"] == 1


def test_open_loop_respects_arrivals(plain):
    arrivals, phases = loadgen.alternating_trace(20, 60, 0.3, 1, seed=2)
    prompts = random_prompts(len(arrivals), 8, seed=7)
    res, wall = asyncio.run(loadgen.open_loop(plain.base_url, prompts, arrivals, loadgen.sampling_params(3), phases))
    assert len(res) == len(arrivals) and all(r.ok for r in res)
    for r in res:
        assert r.start_s >= arrivals[r.index] - 0.01
    by_phase = loadgen.summarize_by_phase(res, wall)
    assert set(by_phase) == set(phases)
    assert sum(v["requests"] for v in by_phase.values()) == len(arrivals)


def test_trace_generation_seeded_and_phased():
    a1, p1 = loadgen.alternating_trace(2, 40, 5, 2, seed=1)
    a2, _ = loadgen.alternating_trace(2, 40, 5, 2, seed=1)
    a3, _ = loadgen.alternating_trace(2, 40, 5, 2, seed=2)
    assert a1 == a2 and a1 != a3
    assert a1 == sorted(a1) and all(0 <= t < 20 for t in a1)
    high = sum(1 for p in p1 if p.startswith("high"))
    low = sum(1 for p in p1 if p.startswith("low"))
    assert high > 5 * low  # 40/s vs 2/s over equal durations


def test_load_trace_validates(tmp_path):
    f = tmp_path / "t.json"
    f.write_text('{"arrivals_s": [0.5, 0.1], "phases": ["b", "a"]}')
    assert loadgen.load_trace(f) == ([0.1, 0.5], ["a", "b"])
    f.write_text('{"arrivals_s": [0.5, -1]}')
    with pytest.raises(ValueError, match="arrivals_s"):
        loadgen.load_trace(f)
    f.write_text('{"arrivals_s": [0.5], "phases": ["a", "b"]}')
    with pytest.raises(ValueError, match="phases"):
        loadgen.load_trace(f)


def test_percentile_and_summary_pure():
    assert loadgen.percentile([], 50) is None
    assert loadgen.percentile([3.0], 99) == 3.0
    assert loadgen.percentile([1, 2, 3, 4, 5], 50) == 3
    assert loadgen.percentile(list(range(101)), 99) == pytest.approx(99)
    rs = [loadgen.RequestResult(index=i, ok=True, ttft_s=0.1, latency_s=0.1 + 0.01 * 9, completion_tokens=10,
                                spec_verify_ct=5) for i in range(4)]
    rs.append(loadgen.RequestResult(index=4, ok=False, error="x"))
    s = loadgen.summarize(rs, 2.0)
    assert s["output_tok_per_s"] == 20.0 and s["failed"] == 1 and s["requests"] == 5
    assert s["tpot_p50_ms"] == pytest.approx(10.0) and s["accept_length"] == 2.0


def test_accept_length_counts_speculative_verifies_only():
    # 128 tokens, 20 speculative verifies accepting 28 drafts (48 tokens), 80 tokens from plain
    # batches: SGLang's own completion_tokens / spec_verify_ct says 6.4, the drafts say 2.4.
    mixed = loadgen.RequestResult(index=0, ok=True, completion_tokens=128, spec_verify_ct=20, spec_correct_drafts=28)
    assert loadgen.accept_length(mixed) == pytest.approx(2.4)
    older = loadgen.RequestResult(index=1, ok=True, completion_tokens=128, spec_verify_ct=20)  # no drafts reported
    assert loadgen.accept_length(older) == pytest.approx(6.4)
    plain = loadgen.RequestResult(index=2, ok=True, completion_tokens=128, spec_verify_ct=0)
    assert loadgen.accept_length(plain) is None
    assert loadgen.mean_accept_length([mixed, plain]) == pytest.approx(2.4)
    assert loadgen.mean_accept_length([plain]) is None


def test_sampling_params_rejects_bad_values():
    with pytest.raises(ValueError, match="max_new_tokens"):
        loadgen.sampling_params(0)
    with pytest.raises(ValueError, match="temperature"):
        loadgen.sampling_params(4, temperature=-1)
    assert loadgen.sampling_params(4) == {"max_new_tokens": 4, "ignore_eos": True, "temperature": 0.0}


def test_idle_connections_are_dropped_before_the_servers_keep_alive_ends():
    # SGLang closes a connection idle for 5 s (SGLANG_TIMEOUT_KEEP_ALIVE); a request sent on one it is
    # closing fails ("Server disconnected").  The client must not reuse one idle that long.
    from aiohttp import web

    assert loadgen.KEEPALIVE_S < 5.0

    async def scenario():
        ports = []

        async def handler(request):
            ports.append(request.transport.get_extra_info("peername")[1])
            return web.Response(text="ok")

        app = web.Application()
        app.router.add_get("/", handler)
        runner = web.AppRunner(app, keepalive_timeout=60)  # this server would keep them open
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        url = f"http://127.0.0.1:{site._server.sockets[0].getsockname()[1]}/"
        try:
            async with loadgen._session(0, 10) as session:
                for pause in (0.0, 0.1, loadgen.KEEPALIVE_S + 0.5):
                    await asyncio.sleep(pause)
                    async with session.get(url) as resp:
                        await resp.text()
        finally:
            await runner.cleanup()
        return ports

    ports = asyncio.run(scenario())
    assert ports[0] == ports[1]  # reused while fresh
    assert ports[2] != ports[1]  # a new connection after the idle gap
