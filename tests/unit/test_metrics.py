"""Stats file, decision trace and Prometheus export of the controller's numbers."""

import json
import os
import subprocess
import sys
import textwrap

import pytest

from sglang_dynspec.controller import Controller
from sglang_dynspec.metrics import StatsWriter, TraceObserver
from sglang_dynspec.policies import build_policy


def test_stats_writer_rate_limited_and_atomic(tmp_path):
    w = StatsWriter(tmp_path, {"policy": "x"}, interval=3600)
    w.maybe_write(lambda: {"decode_steps": 1})
    w.maybe_write(lambda: {"decode_steps": 2})  # within the interval: skipped
    data = json.loads(w.path.read_text())
    assert data["decode_steps"] == 1 and data["policy"] == "x" and data["pid"] == os.getpid()
    w.maybe_write(lambda: {"decode_steps": 3}, force=True)
    assert json.loads(w.path.read_text())["decode_steps"] == 3
    assert not list(tmp_path.glob("*.tmp"))


def test_trace_observer_bounded(tmp_path):
    import pluggy

    from sglang_dynspec import hookspecs

    pm = pluggy.PluginManager("sglang_dynspec")
    pm.add_hookspecs(hookspecs)
    obs = TraceObserver(tmp_path / "trace.jsonl", max_bytes=2000)
    pm.register(obs)
    idle = TraceObserver(tmp_path / "idle" / "trace.jsonl", max_bytes=2000)
    idle.close()
    assert not (tmp_path / "idle").exists()  # a process that never decides leaves no file
    c = Controller(build_policy("threshold", {"n": 4}), hook=pm.hook)
    for i in range(200):
        c.on_decode(1 + i % 8)
    obs.close()
    lines = obs.path.read_text().splitlines()
    assert 0 < len(lines) < 200 and obs.path.stat().st_size <= 2000
    first = json.loads(lines[0])
    assert first["step"] == 0 and first["bs"] == 1 and first["on"] is True
    assert json.loads(lines[4])["on"] is False  # bs 5 > n
    assert "greedy" not in first  # the batches did not say


def test_trace_records_each_steps_sampling_regime(tmp_path):
    import pluggy

    from sglang_dynspec import hookspecs
    from sglang_dynspec.tracereplay import redrive

    pm = pluggy.PluginManager("sglang_dynspec")
    pm.add_hookspecs(hookspecs)
    obs = TraceObserver(tmp_path / "trace.jsonl", max_bytes=1 << 20)
    pm.register(obs)
    c = Controller(build_policy("goodput", {}), hook=pm.hook)
    for i in range(40):
        greedy = i >= 20
        c.step_mode(2, 2, 0, greedy=greedy)
        c.on_result(2, 4 if greedy else 1, greedy=greedy)
    obs.close()
    rows = [json.loads(line) for line in obs.path.read_text().splitlines()]
    assert [r["greedy"] for r in rows] == [False] * 20 + [True] * 20
    # the re-drive gives each regime its own acceptance, as the server did
    steps = redrive(rows, "goodput").steps
    assert [s.why for s in steps[:8]] == ["learn on"] * 8 and steps[20].why == "learn on"


class Explaining:
    name = "explaining"

    def decide(self, x):
        return x.decode_bs < 4

    def explain(self):
        return {"on_tok_s": 120.5, "off_tok_s": 99.0, "why": "model"}


def test_policy_estimates_reach_the_trace_and_the_stats(tmp_path):
    import pluggy

    from sglang_dynspec import hookspecs

    pm = pluggy.PluginManager("sglang_dynspec")
    pm.add_hookspecs(hookspecs)
    obs = TraceObserver(tmp_path / "trace.jsonl", max_bytes=10_000)
    pm.register(obs)
    c = Controller(Explaining(), hook=pm.hook)
    for bs in (1, 8):
        c.on_decode(bs)
    obs.close()
    line = json.loads(obs.path.read_text().splitlines()[1])
    assert line["on"] is False and line["on_tok_s"] == 120.5 and line["off_tok_s"] == 99.0 and line["why"] == "model"
    assert c.snapshot()["estimates"] == {"on_tok_s": 120.5, "off_tok_s": 99.0, "why": "model"}
    c.failed = "gone"  # safe mode: the policy's figures no longer explain anything
    assert c.snapshot()["estimates"] is None


def test_prometheus_multiprocess_export(tmp_path):
    pytest.importorskip("prometheus_client")
    code = textwrap.dedent("""
        from sglang_dynspec.controller import Controller
        from sglang_dynspec.metrics import PrometheusExporter
        from sglang_dynspec.policies import build_policy
        c = Controller(build_policy("threshold", {"n": 4}))
        exp = PrometheusExporter({"tp_rank": "0"})
        for bs in [1, 8, 1, 8, 8]:
            c.on_decode(bs)
        c.on_result(4, 6)
        snap = c.snapshot()
        snap["estimates"] = {"on_tok_s": 812.0, "off_tok_s": 640.5, "demand_tok_s": 700.0, "why": "model"}
        exp.update(snap, draft_tokens_per_step=2)
        exp.update(snap, draft_tokens_per_step=2)  # no double counting
        from prometheus_client import CollectorRegistry, generate_latest
        from prometheus_client.multiprocess import MultiProcessCollector
        reg = CollectorRegistry(); MultiProcessCollector(reg)
        print(generate_latest(reg).decode())
    """)
    env = dict(os.environ, PROMETHEUS_MULTIPROC_DIR=str(tmp_path))
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    text = out.stdout
    assert 'sglang_dynspec_decode_steps_total{mode="on",tp_rank="0"} 2.0' in text
    assert 'sglang_dynspec_decode_steps_total{mode="off",tp_rank="0"} 3.0' in text
    assert 'sglang_dynspec_switches_total{tp_rank="0"} 3.0' in text
    assert 'sglang_dynspec_wasted_draft_tokens_total{tp_rank="0"} 2.0' in text  # 4 rows x 2 drafted - 6
    assert "sglang_dynspec_accept_length" in text
    assert 'sglang_dynspec_estimated_output_tokens_per_second{mode="on",tp_rank="0"} 812.0' in text
    assert 'sglang_dynspec_estimated_output_tokens_per_second{mode="off",tp_rank="0"} 640.5' in text
    assert 'sglang_dynspec_demand_output_tokens_per_second{tp_rank="0"} 700.0' in text


def test_trace_says_what_was_prefilled_before_each_step(tmp_path):
    # Refill costs decide the default policy; each line says how many requests were admitted
    # since the previous decode step and how long from the first prefill batch to this step.
    import pluggy

    from sglang_dynspec import hookspecs

    class Clock:
        t = 0.0

        def __call__(self):
            return self.t

    clock = Clock()
    pm = pluggy.PluginManager("sglang_dynspec")
    pm.add_hookspecs(hookspecs)
    obs = TraceObserver(tmp_path / "trace.jsonl", max_bytes=10_000)
    pm.register(obs)
    c = Controller(build_policy("never", {}), hook=pm.hook, clock=clock)
    c.on_decode(4)
    clock.t += 0.004
    c.on_other(3)
    clock.t += 0.030
    c.on_decode(7)
    clock.t += 0.004
    c.on_decode(7)
    obs.close()
    lines = [json.loads(x) for x in obs.path.read_text().splitlines()]
    assert [x["new"] for x in lines] == [0, 3, 0]
    assert [x["prefill_ms"] for x in lines] == [0.0, pytest.approx(30.0), 0.0]
