"""Pure pieces of the harness: mode grammar, stats files, comparisons, prompts; fuzz/offstep on fakes."""

import json

import pytest


from benchmarks.dynspec_bench import correctness as corr  # noqa: E402
from benchmarks.dynspec_bench.modes import (  # noqa: E402
    ServerConfig, build_server_spec, parse_mode, worker_path_guess,
)
from benchmarks.dynspec_bench.prompts import PromptSource, load_prompts, random_prompts  # noqa: E402
from benchmarks.dynspec_bench.server import parse_prometheus  # noqa: E402
from benchmarks.dynspec_bench.stats import delta, read_stats, stage_latency  # noqa: E402


def test_mode_grammar():
    m = parse_mode("dynspec:random@topk4+nooverlap")
    assert (m.kind, m.policy, m.shape["topk"], m.overlap) == ("dynspec", "random", 4, False)
    assert parse_mode("off").shape is None
    for bad, msg in [("", "non-empty"), ("on@topk9", "unknown variant"), ("off@topk4", "nooverlap"),
                     ("dynspec:", "policy name"), ("fast", "kind must be"), ("on@topk1+topk4", "exclude")]:
        with pytest.raises(ValueError, match=msg):
            parse_mode(bad)


def test_worker_path_rules():
    assert worker_path_guess(parse_mode("on"), "0.5.12") == "spec_v2"
    assert worker_path_guess(parse_mode("on@topk4"), "0.5.12") == "v1"
    assert worker_path_guess(parse_mode("on@nooverlap"), "0.5.12") == "v1"
    assert worker_path_guess(parse_mode("on@topk4"), "0.5.15") == "spec_v2"
    assert worker_path_guess(parse_mode("off"), "0.5.12") is None


def test_server_spec_flags_and_env():
    cfg = ServerConfig(model="/m", draft="/d", max_total_tokens=5000, policy_args={"seed": 7}, stats_root="/s")
    off = build_server_spec(parse_mode("off@nooverlap"), cfg, 31000)
    assert "--disable-overlap-schedule" in off.args and "--speculative-algorithm" not in off.args
    assert off.args[off.args.index("--max-total-tokens") + 1] == "5000" and off.env == {}
    dyn = build_server_spec(parse_mode("dynspec:threshold@topk4"), cfg, 31001)
    a = dyn.args
    assert a[a.index("--speculative-eagle-topk") + 1] == "4"
    assert a[a.index("--speculative-num-draft-tokens") + 1] == "16"
    assert dyn.env["SGLANG_DYNSPEC_ENABLED"] == "1" and dyn.env["SGLANG_DYNSPEC_POLICY"] == "threshold"
    assert json.loads(dyn.env["SGLANG_DYNSPEC_POLICY_ARGS"]) == {"seed": 7}
    assert dyn.env["SGLANG_DYNSPEC_STATS_DIR"].startswith("/s/")
    assert dyn.optional_flags == ["--disable-piecewise-cuda-graph", "--sleep-on-idle"]
    assert a[-2:] == ["--disable-piecewise-cuda-graph", "--sleep-on-idle"]
    bare = build_server_spec(parse_mode("dynspec:always@bare"), cfg, 31002)
    assert bare.env["SGLANG_DYNSPEC_METRICS"] == "0" and bare.env["SGLANG_DYNSPEC_TRACE_FILE"] is None
    assert "SGLANG_DYNSPEC_STATS_DIR" not in bare.env and bare.args == build_server_spec(
        parse_mode("dynspec:always"), cfg, 31002).args
    with pytest.raises(ValueError, match="for dynspec modes"):
        parse_mode("on@bare")
    both = build_server_spec(parse_mode("dynspec:goodput@nographs+eagerprefill"), cfg, 31003)
    assert both.env["SGLANG_DYNSPEC_OFFSTEP_GRAPHS"] == "0" and both.env["SGLANG_DYNSPEC_TARGET_PREFILL_GRAPH"] == "0"
    assert both.env["SGLANG_DYNSPEC_STATS_DIR"].startswith("/s/") and "SGLANG_DYNSPEC_METRICS" not in both.env
    from sglang_dynspec.config import validate

    graphs = {k: v for k, v in both.env.items() if "GRAPH" in k}
    settings = validate({"SGLANG_DYNSPEC_ENABLED": "1", **graphs}).settings  # how the server reads them
    assert settings.offstep_graphs is False and settings.target_prefill_graph is False
    with pytest.raises(ValueError, match="for dynspec modes"):
        parse_mode("off@eagerprefill")
    with pytest.raises(ValueError, match="draft"):
        build_server_spec(parse_mode("on"), ServerConfig(model="/m"), 1)
    with pytest.raises(ValueError, match="model"):
        build_server_spec(parse_mode("off"), ServerConfig(model=""), 1)


def test_stats_sum_rank0_and_skip_broken(tmp_path):
    assert read_stats(tmp_path) is None
    (tmp_path / "stats-1.json").write_text(json.dumps(
        {"pid": 1, "tp_rank": 0, "decode_steps": 10, "steps_on": 4, "steps_off": 6, "switches": 3,
         "policy_errors": 0, "policy": "random", "worker_path": "v1"}))
    (tmp_path / "stats-2.json").write_text(json.dumps({"pid": 2, "tp_rank": 1, "decode_steps": 10, "switches": 3}))
    (tmp_path / "stats-3.json").write_text("{half a file")
    s = read_stats(tmp_path)
    assert s["decode_steps"] == 10 and s["switches"] == 3 and s["processes"] == 1 and s["worker_path"] == "v1"
    later = dict(s, decode_steps=25, switches=9)
    d = delta(s, later)
    assert d["decode_steps"] == 15 and d["switches"] == 6
    assert delta(s, None) is None


def test_compare_finds_first_mismatch():
    ref = [[1, 2, 3], [4, 5, 6], [7, 8], [1]]
    got = [[1, 2, 3], [4, 9, 6], [7, 8, 9], None]
    c = corr.compare(ref, got)
    assert c["first_mismatch"] == [None, 1, 2, 0] and c["mismatched"] == 3 and c["failed"] == 1
    with pytest.raises(ValueError, match="outputs"):
        corr.compare(ref, got[:2])


def test_prompts_seeded_distinct_and_in_range(tmp_path):
    a = random_prompts(3, 50, seed=1)
    assert a == random_prompts(3, 50, seed=1) and a != random_prompts(3, 50, seed=2)
    assert all(1000 <= t < 30000 for p in a for t in p) and all(len(p) == 50 for p in a)
    src = PromptSource(16, seed=0)
    assert src.take(2, salt=1) != src.take(2, salt=2)
    f = tmp_path / "p.json"
    f.write_text(json.dumps({"prompts": [[1, 2], [3]]}))
    assert load_prompts(f) == [[1, 2], [3]]
    assert PromptSource(path=str(f)).take(3, salt=0) == [[1, 2], [3], [1, 2]]
    f.write_text(json.dumps([[1, "x"]]))
    with pytest.raises(ValueError, match=r"prompts\[0\]"):
        load_prompts(f)


# ---- fuzz and offstep kinds on fake servers -----------------------------------------------------
@pytest.fixture
def fake_launch(monkeypatch):
    pytest.importorskip("aiohttp")
    from benchmarks.dynspec_bench.server import ServerProcess
    from benchmarks.dynspec_bench.testing.fixtures import free_port, use_fake_servers

    use_fake_servers(monkeypatch, 0.001)

    def factory(spec, log_dir):
        spec.port = free_port()
        return ServerProcess(spec, log_dir, grace_s=5)

    return factory


def test_fuzz_reaches_steps_and_records(tmp_path, fake_launch, monkeypatch):
    from benchmarks.dynspec_bench import fuzz
    from benchmarks.dynspec_bench.results import validate

    monkeypatch.setattr(fuzz, "STATS_SETTLE_S", 0.4)
    cfg = fuzz.FuzzConfig(server=ServerConfig(model="m", draft="d", stats_root=str(tmp_path / "s")),
                          concurrency=[2, 4], min_decode_steps=150, output_len=16, input_len=8,
                          out_dir=str(tmp_path), name="f", server_factory=fake_launch)
    rec = fuzz.run_fuzz(cfg, argv=["fuzz"])
    validate(rec)
    for c in ("2", "4"):
        lv = rec["per_C"][c]
        assert lv["decode_steps"] >= 150 and lv["switches"] > 0 and lv["policy_errors"] == 0
        assert lv["crashed"] is False and lv["leak_reports"] == 0 and lv["mismatched"] == 0
        assert lv["accept_length_static_on"] == pytest.approx(2.0)
    assert json.loads((tmp_path / "f.json").read_text())["policy"] == "random"


def test_offstep_ratio(tmp_path, fake_launch):
    from benchmarks.dynspec_bench import offstep
    from benchmarks.dynspec_bench.results import validate

    cfg = offstep.OffstepConfig(server=ServerConfig(model="m", draft="d"), batch_sizes=[1, 2], output_len=20,
                                input_len=8, out_dir=str(tmp_path), name="o", server_factory=fake_launch)
    rec = offstep.run_offstep(cfg, argv=["offstep"])
    validate(rec)
    for bs in ("1", "2"):
        x = rec["per_bs"][bs]
        assert x["ratio"] == pytest.approx(x["off_step_ms"] / x["plain_step_ms"], rel=1e-3)
        assert 0.3 < x["ratio"] < 3  # same fake per-token delay on both servers


def test_offstep_several_servers_and_profiles(tmp_path, fake_launch):
    from benchmarks.dynspec_bench import offstep
    from benchmarks.dynspec_bench.results import validate

    cfg = offstep.OffstepConfig(server=ServerConfig(model="m", draft="d", stats_root=str(tmp_path / "s")),
                                batch_sizes=[1, 2], output_len=20, input_len=8, variant=",topk4",
                                profile_bs=[2], profile_steps=6, out_dir=str(tmp_path), name="o",
                                server_factory=fake_launch)
    rec = offstep.run_offstep(cfg, argv=["offstep"])
    validate(rec)
    assert set(rec["per_mode"]) == {"dynspec:never", "dynspec:never@topk4"}
    assert rec["per_mode"]["dynspec:never"]["per_bs"] == rec["per_bs"]
    assert set(rec["per_mode"]["dynspec:never@topk4"]["per_bs"]) == {"1", "2"}
    assert rec["per_mode"]["dynspec:never@topk4"]["topk"] == 4
    prof = rec["profile"]
    assert set(prof) == {"off", "dynspec:never", "dynspec:never@topk4"} and all(set(v) == {"2"} for v in prof.values())
    plain, dyn = prof["off"]["2"], prof["dynspec:never"]["2"]
    # The fake's trace: 6 steps of 1 ms, one 0.5 ms kernel and one graph launch each.
    assert plain["steps"] == 6 and plain["gpu_busy_ms_per_step"] == pytest.approx(0.5)
    assert plain["graph_launches_per_step"] == 1.0 and plain["dynspec_ranges"] == {}
    assert dyn["dynspec_ranges"]["dynspec.offstep.target"] == {"cpu_us_per_step": 100.0, "gpu_us_per_step": 400.0,
                                                                "count": 6}


def test_offstep_prefill_level_and_prefill_windows(tmp_path, fake_launch):
    from benchmarks.dynspec_bench import offstep
    from benchmarks.dynspec_bench.results import validate

    cfg = offstep.OffstepConfig(server=ServerConfig(model="m", draft="d", stats_root=str(tmp_path / "s")),
                                batch_sizes=[1], output_len=8, input_len=8, prefill_c=2, prefill_requests=6,
                                prefill_out=(2, 4), prefill_profile_steps=9, out_dir=str(tmp_path), name="o",
                                server_factory=fake_launch)
    rec = offstep.run_offstep(cfg, argv=["offstep"])
    validate(rec)
    runs = rec["prefill_level"]["runs"]
    assert set(runs) == {"off", "dynspec:never"}
    assert all(len(v) == 2 and all(r["requests"] == 6 and r["failed"] == 0 for r in v) for v in runs.values())
    # The same seeded lengths for every server and round: the same tokens.
    assert len({r["completion_tokens"] for v in runs.values() for r in v}) == 1
    prof = rec["prefill_profile"]["dynspec:never"]
    # The fake's 9 steps: EXTEND after steps 1, 4, 7 -> 3 prefill windows, 5 plain decode windows of 1 ms.
    assert prof["extend_steps"] == 3
    assert prof["prefill"]["windows"] == 3 and prof["decode"]["windows"] == 5
    assert prof["decode"]["wall_ms_mean"] == pytest.approx(1.0) and prof["prefill"]["gpu_busy_ms_mean"] == pytest.approx(0.5)
    assert prof["prefill"]["ranges_ms_mean"]["step[EXTEND]"] == pytest.approx(0.2)
    assert "step[EXTEND]" not in prof["decode"]["ranges_ms_mean"]
    with pytest.raises(ValueError, match="prefill_out"):
        offstep.OffstepConfig(server=ServerConfig(model="m", draft="d"), prefill_out=(5, 2))


def test_analyze_trace_reads_a_real_torch_profiler_trace(tmp_path):
    torch = pytest.importorskip("torch")
    from benchmarks.dynspec_bench.profile import analyze_trace
    from sglang_dynspec.adapters.profiler_ranges import span

    x = torch.randn(64, 64)
    assert not torch.autograd._profiler_enabled()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        for _ in range(4):
            with span("dynspec.offstep.target"):
                for _ in range(3):
                    x = (x @ x).tanh()
            with span("dynspec.offstep.draft_sync"):
                x = x + 1
    path = tmp_path / "t.trace.json"
    prof.export_chrome_trace(str(path))
    res = analyze_trace(path, steps=4)
    ranges = res["dynspec_ranges"]
    assert set(ranges) == {"dynspec.offstep.target", "dynspec.offstep.draft_sync"}
    assert ranges["dynspec.offstep.target"]["count"] == 4 and ranges["dynspec.offstep.target"]["cpu_us_per_step"] > 0
    assert res["gpu_busy_ms_per_step"] == 0 and res["step_ms"] > 0
    names = {r["name"] for r in res["top_cpu_ops"]}
    assert "aten::mm" in names or "aten::matmul" in names
    # Outside a profiler the span is a shared no-op (no per-step cost).
    assert span("dynspec.offstep.target") is span("other")


def test_scheduler_thread_split_separates_forward_wait_and_scheduler_work(tmp_path):
    from benchmarks.dynspec_bench.profile import analyze_trace

    # Two 10 ms steps on thread 1: forward ranges 0-3 ms (a 1 ms memcpy wait inside), an event
    # sync 5-7 ms outside; thread 2's sync must not count.  Per step: forward 3-1 = 2 ms CPU,
    # waiting 1 + 2 = 3 ms, the rest 10 - 3 - 2 = 5 ms.
    evs = []
    for k in range(2):
        t = k * 10_000.0
        evs += [
            {"ph": "X", "cat": "user_annotation", "name": "dynspec.offstep.target", "tid": 1, "ts": t, "dur": 2_000.0},
            {"ph": "X", "cat": "user_annotation", "name": "step[DECODE bs=8]", "tid": 1, "ts": t + 500, "dur": 2_500.0},
            {"ph": "X", "cat": "cuda_runtime", "name": "cudaMemcpyAsync", "tid": 1, "ts": t + 1_000, "dur": 1_000.0},
            {"ph": "X", "cat": "cuda_runtime", "name": "cudaEventSynchronize", "tid": 1, "ts": t + 5_000, "dur": 2_000.0},
            {"ph": "X", "cat": "cuda_runtime", "name": "cudaStreamSynchronize", "tid": 2, "ts": t + 5_000, "dur": 4_000.0},
            {"ph": "X", "cat": "cpu_op", "name": "aten::add", "tid": 1, "ts": t + 9_990, "dur": 10.0},
        ]
    path = tmp_path / "t.trace.json"
    path.write_text(json.dumps({"traceEvents": evs}))
    split = analyze_trace(path, steps=2)["scheduler_thread"]
    outside = split.pop("outside_forward_top_ops")
    assert split == {"forward_cpu_us_per_step": 2000.0, "wait_us_per_step": 3000.0, "rest_cpu_us_per_step": 5000.0}
    # Outside the forward: the event sync and the add; the memcpy inside and thread 2's sync are not.
    assert outside == [{"name": "cudaEventSynchronize", "us_per_step": 2000.0, "calls_per_step": 1.0},
                       {"name": "aten::add", "us_per_step": 10.0, "calls_per_step": 1.0}]


def test_outside_forward_ops_count_only_outermost_calls(tmp_path):
    from benchmarks.dynspec_bench.profile import analyze_trace

    evs = [
        {"ph": "X", "cat": "user_annotation", "name": "step[DECODE bs=1]", "tid": 1, "ts": 0.0, "dur": 100.0},
        {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "tid": 1, "ts": 10.0, "dur": 50.0},  # in the forward
        {"ph": "X", "cat": "cpu_op", "name": "aten::to", "tid": 1, "ts": 200.0, "dur": 40.0},
        {"ph": "X", "cat": "cpu_op", "name": "aten::copy_", "tid": 1, "ts": 205.0, "dur": 30.0},  # inside aten::to
        {"ph": "X", "cat": "cuda_runtime", "name": "cudaStreamSynchronize", "tid": 1, "ts": 210.0, "dur": 20.0},
        {"ph": "X", "cat": "cpu_op", "name": "aten::to", "tid": 1, "ts": 300.0, "dur": 60.0},
    ]
    path = tmp_path / "t.trace.json"
    path.write_text(json.dumps({"traceEvents": evs}))
    outside = analyze_trace(path, steps=2)["scheduler_thread"]["outside_forward_top_ops"]
    assert outside == [{"name": "aten::to", "us_per_step": 50.0, "calls_per_step": 1.0}]


def test_python_functions_reported_when_the_trace_has_stacks(tmp_path):
    from benchmarks.dynspec_bench.profile import analyze_trace

    evs = [{"ph": "X", "cat": "python_function", "name": "sglang/srt/managers/scheduler.py(10): run_batch",
            "tid": 1, "ts": 0.0, "dur": 300.0},
           {"ph": "X", "cat": "python_function", "name": "threading.py(5): wait", "tid": 1, "ts": 400.0, "dur": 50.0},
           {"ph": "X", "cat": "python_function", "name": "sglang_dynspec/runtime.py(3): _forward",
            "tid": 1, "ts": 500.0, "dur": 100.0}]
    path = tmp_path / "t.trace.json"
    path.write_text(json.dumps({"traceEvents": evs}))
    top = analyze_trace(path, steps=1)["top_python"]
    assert [r["name"] for r in top] == ["sglang/srt/managers/scheduler.py(10): run_batch",
                                        "sglang_dynspec/runtime.py(3): _forward"]
    path.write_text(json.dumps({"traceEvents": evs[1:2]}))
    assert "top_python" not in analyze_trace(path, steps=1)


def test_optional_flags_and_piecewise_graphs_switch():
    from benchmarks.dynspec_bench import cli

    def optional(*extra):
        args = cli.build_parser().parse_args(["sweep", "--deterministic", "off", "--max-total-tokens", "40000", *extra])
        return cli._server_cfg(args, 8, "t").optional_flags

    assert optional() == ["--disable-piecewise-cuda-graph", "--sleep-on-idle"]
    assert optional("--piecewise-cuda-graph") == ["--sleep-on-idle"]  # SGLang's default prefill graphs
    assert optional("--no-optional-flags") == []


def _stage_text(prefill_sum: float, prefill_n: int, decode_n: int) -> str:
    # SGLang 0.5.12's histogram as /metrics prints it (labels abridged; buckets are skipped by the reader)
    lab = 'engine_type="unified",model_name="m",stage="{}",tp_rank="0"'
    return "\n".join([
        "# HELP sglang:per_stage_req_latency_seconds The latency of each stage of requests.",
        "# TYPE sglang:per_stage_req_latency_seconds histogram",
        f'sglang:per_stage_req_latency_seconds_bucket{{{lab.format("prefill_forward")},le="0.001"}} 0.0',
        f'sglang:per_stage_req_latency_seconds_sum{{{lab.format("prefill_forward")}}} {prefill_sum}',
        f'sglang:per_stage_req_latency_seconds_count{{{lab.format("prefill_forward")}}} {float(prefill_n)}',
        f'sglang:per_stage_req_latency_seconds_sum{{{lab.format("request_process")}}} 0.5',
        f'sglang:per_stage_req_latency_seconds_count{{{lab.format("request_process")}}} {float(decode_n)}',
        'sglang:num_requests_total{model_name="m"} 7.0',
    ]) + "\n"


def test_stage_latency_is_the_mean_of_the_requests_between_two_samples():
    before = parse_prometheus(_stage_text(0.2, 10, 4))
    after = parse_prometheus(_stage_text(0.2 + 0.45, 40, 4))
    got = stage_latency(before, after)
    # 30 prefills took 0.45 s together; request_process saw no request in between
    assert got == {"prefill_forward": {"requests": 30, "mean_ms": 15.0}}


def test_stage_latency_without_metrics_is_none():
    assert stage_latency({}, {}) is None
    assert stage_latency({}, parse_prometheus('sglang:num_requests_total{model_name="m"} 7.0\n')) is None


def test_pyspy_summary_splits_busy_scheduler_samples_into_prefill_gpu_and_verify_waits_and_the_rest(tmp_path):
    from benchmarks import pyspy_summary

    loop = "run_scheduler_process (scheduler.py:1);Scheduler.event_loop_overlap (scheduler.py:2)"
    raw = "\n".join([
        f"{loop};Scheduler.run_batch (scheduler.py:3);ModelRunner.forward_extend (model_runner.py:4) 30",
        f"{loop};Scheduler.run_batch (scheduler.py:3);_forward (sglang_dynspec/runtime.py:5);"
        f"forward_prefill_off (sglang_dynspec/adapters/spec_v2.py:6) 10",
        f"{loop};Scheduler.process_batch_result (scheduler.py:7);Event.synchronize (torch/cuda/streams.py:8) 40",
        f"{loop};Scheduler.run_batch (scheduler.py:3);forward_plain (sglang_dynspec/adapters/spec_v2.py:9) 15",
        f"{loop};Scheduler.get_next_batch_to_run (scheduler.py:10) 5",
        f"{loop};Scheduler.get_next_batch_to_run (scheduler.py:10);ScheduleBatch.filter_batch (schedule_batch.py:12);"
        f"ScheduleBatch.maybe_wait_verify_done (schedule_batch.py:13);Event.synchronize (torch/cuda/streams.py:8) 25",
        "run_scheduler_process (scheduler.py:1);ModelRunner.init (model_runner.py:11) 99",  # start-up: not serving
    ]) + "\n"
    (tmp_path / "sched-7.txt").write_text(raw)
    s = pyspy_summary.summarize(tmp_path / "sched-7.txt")
    assert s["busy"] == 125
    assert s["kinds"] == {"prefill": 40, "gpu wait": 40, "verify wait": 25, "decode and rest": 20}
    assert s["with_plugin_frame"] == 25
    assert s["loop_steps"]["run batch"] == 55 and s["loop_steps"]["next batch (schedule)"] == 30
    log = tmp_path / "server-off.log"
    log.write_text("[t] Prefill batch, #new-seq: 1\n[t] Decode batch, #running-req: 1\n" * 3)
    assert pyspy_summary.log_counts(log, 40) == (120, 3)
