"""Replay on decision traces recorded on the H200: the policy design loop (issue: default policy)."""

import gzip
import io
import json
from pathlib import Path

import pytest

from benchmarks.dynspec_bench.traceset import read_logs
from sglang_dynspec.cli import main
from sglang_dynspec.config import DynspecSettings
from sglang_dynspec.errors import ConfigError
from sglang_dynspec.tracereplay import load_trace_set, replay_policy, replay_static, report

DEFAULT_POLICY = DynspecSettings.model_fields["policy"].default


@pytest.fixture(scope="module")
def pair():
    return load_trace_set("h200-pair-0512")


def test_the_builtin_set_covers_the_measured_levels(pair):
    assert sorted(pair.levels) == [1, 2, 5, 10, 30, 70, 100]
    assert pair.incomplete == ["C=250 on", "C=250 off"]  # its traces were cut short on the GPU
    assert pair.meta["sglang_version"] == "0.5.12"


def test_static_modes_reproduce_their_measured_throughput_within_5_percent(pair):
    for c, modes in pair.levels.items():
        for mode, lv in modes.items():
            assert replay_static(lv) == pytest.approx(lv.measured_tok_s, rel=0.05), (c, mode)


def test_default_policy_ranks_the_modes_as_measured_at_every_level(pair):
    """Fails when the default policy would mostly run the mode that measured slower at some C,
    or would land below 0.97x of the better static mode in the projection."""
    by_c = {r.concurrency: r for r in replay_policy(pair, DEFAULT_POLICY)}
    assert sorted(by_c) == sorted(pair.levels)
    for c, modes in pair.levels.items():
        on_wins = modes["on"].measured_tok_s > modes["off"].measured_tok_s
        r = by_c[c]
        assert (r.share_on > 0.5) == on_wins, (c, r.share_on, on_wins)
        best = max(replay_static(modes["on"]), replay_static(modes["off"]))
        assert r.tok_s / best >= 0.97, (c, r.tok_s / best)


def test_a_decode_only_cost_model_would_fail_that_test(pair):
    """The trap the traces show: per decode step, speculation wins up to bs 30 on this pair; only
    the prefills it scatters make it lose from C=5.  `threshold` at n=30 follows decode costs."""
    by_c = {r.concurrency: r for r in replay_policy(pair, "threshold", {"n": 30})}
    wrong = [c for c, m in pair.levels.items()
             if (by_c[c].share_on > 0.5) != (m["on"].measured_tok_s > m["off"].measured_tok_s)]
    assert wrong == [5, 10, 30]


def test_report_and_cli(pair, tmp_path, capsys):
    rows = report(pair, ["never"])
    assert rows[10]["dynspec:never"]["share_on"] == 0.0
    assert rows[10]["dynspec:never"]["ratio_to_best_static"] == pytest.approx(1.0, abs=0.01)
    out_json = tmp_path / "r.json"
    assert main(["replay", "--json", str(out_json)]) == 0
    out = capsys.readouterr().out
    assert f"dynspec:{DEFAULT_POLICY}" in out and "max |error|" in out and "left out" in out
    assert json.loads(out_json.read_text())["levels"]["30"]["off"]["measured"] == pytest.approx(5860.9)


def test_png(tmp_path):
    pytest.importorskip("matplotlib")
    png = tmp_path / "r.png"
    assert main(["replay", "--png", str(png)]) == 0
    assert png.read_bytes()[:4] == b"\x89PNG"


def test_bad_trace_set(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text('{"levels": {"1": {"on": {"steps": 3}}}}')
    with pytest.raises(ConfigError, match="not a trace set"):
        load_trace_set(str(bad))
    with pytest.raises(ConfigError, match="not a built-in"):
        load_trace_set(str(tmp_path / "missing.json"))


def test_policy_args_need_exactly_one_policy(capsys):
    assert main(["replay", "--policy", "goodput", "--policy", "never", "--policy-args", "{}"]) == 2
    assert "exactly one --policy" in capsys.readouterr().err


@pytest.mark.parametrize("level, step, seconds", [(1, 3, 0.419), (1, 0, 0.217)])
def test_a_compiling_first_step_does_not_lock_speculation_out(pair, level, step, seconds, monkeypatch):
    """On the H200 the first speculative steps at a new batch size compiled kernels (419 ms among
    6 ms steps; a first prefill 217 ms): the default policy then stayed plain at C=1 and C=2 for
    the whole run (pairx2-*-row1.json).  Replayed with that step injected, it must speculate."""
    import copy

    ts = copy.deepcopy(pair)
    ts.levels[level]["on"].steps[step].seconds = seconds
    by_c = {r.concurrency: r for r in replay_policy(ts, DEFAULT_POLICY)}
    assert by_c[1].share_on > 0.5 and by_c[2].share_on > 0.5


def _traced_run(tmp_path, policy="goodput"):
    """A server's decode loop on a simulated clock, traced by the real observer: loads of 2, 30 and
    2 requests with mode-dependent step times, random acceptance and output lengths, prefills when
    requests finish (so both modes, trials and switches occur)."""
    import random

    import pluggy

    from sglang_dynspec import hookspecs
    from sglang_dynspec.controller import Controller, StepMode
    from sglang_dynspec.metrics import TraceObserver
    from sglang_dynspec.policies import build_policy
    from sglang_dynspec.replay import SimClock

    pm = pluggy.PluginManager("sglang_dynspec")
    pm.add_hookspecs(hookspecs)
    obs = TraceObserver(tmp_path / "trace.jsonl", max_bytes=10**8)
    pm.register(obs)
    clock, rng = SimClock(), random.Random(7)
    clock.t = 1000.0
    ctl = Controller(build_policy(policy, {}), clock=clock, hook=pm.hook, deadline_s=float("inf"), verify_rows=3)
    for load in (2, 30, 2):
        left = [rng.randint(20, 200) for _ in range(load)]
        ctl.on_other(load)
        clock.t += 0.020 + 0.004 * load
        for _ in range(1500):
            bs = len(left)
            mode = ctl.step_mode(bs, bs, 0)
            on = mode is StepMode.ON
            clock.t += (0.0060 + 0.00030 * bs) if on else (0.0033 + 0.00004 * bs)
            made = [1 + (rng.randint(0, 2) if on else 0) for _ in left]
            if on and bs > 1 and ctl.step % 37 == 0:
                # two results before the next step (as around a prefill): two acceptance samples
                ctl.on_result(1, made[0] - 1)
                ctl.on_result(bs - 1, sum(made[1:]) - (bs - 1))
            elif on:
                ctl.on_result(bs, sum(made) - bs)
            left = [n - m for n, m in zip(left, made)]
            done = sum(n <= 0 for n in left)
            left = [n for n in left if n > 0] + [rng.randint(20, 200) for _ in range(done)]
            if done:
                ctl.on_other(done)
                clock.t += 0.020 + 0.004 * done
        clock.t += 5.0  # idle between loads
    obs.close()
    return obs.path, ctl


def test_a_server_trace_redriven_with_its_policy_gives_its_decisions(tmp_path):
    """The trace holds every input the policy saw (clock, prefills, results): re-driven through the
    same policy it reproduces each decision, switches included."""
    from sglang_dynspec.tracereplay import load_server_trace, redrive

    path, ctl = _traced_run(tmp_path)
    rows = load_server_trace(str(path))
    assert len(rows) == ctl.stats["decode_steps"] and rows[0]["t"] == pytest.approx(1000.0 + 0.028)
    # the first line alone carries the controller's verify rows, which the re-drive takes from it
    assert rows[0]["vr"] == 3 and not any("vr" in r for r in rows[1:])
    # steps after two results carry each of them, the others only their sums
    split = [r for r in rows if "res" in r]
    assert split and all(len(r["res"]) == 2 and sum(x[0] for x in r["res"]) == r["res_rows"] for r in split)
    res = redrive(rows, "goodput")
    assert res.exact_acceptance and res.agreement == 1.0
    # ... and the same figures behind each decision, not only the same decisions
    keys = ("on_tok_s", "off_tok_s", "why")
    assert [{k: r.get(k) for k in keys} for r in rows] == [{k: s.estimates.get(k) for k in keys} for s in res.steps]
    assert ctl.stats["switches"] >= 2 and sum(s.decided for s in res.steps) == ctl.stats["steps_on"]
    assert [len(r) for r in res.runs()] == [1500, 1500, 1500]  # the idle gaps split the loads
    # another policy at the same inputs: what it would have decided there
    never = redrive(rows, "never")
    assert not any(s.decided for s in never.steps) and never.agreement == pytest.approx(
        1 - ctl.stats["steps_on"] / len(rows))


def test_server_trace_cli_and_its_errors(tmp_path, capsys):
    path, ctl = _traced_run(tmp_path)
    out_json = tmp_path / "redrive.json"
    assert main(["replay", "--server-trace", str(path), "--policy", "goodput", "--json", str(out_json)]) == 0
    out = capsys.readouterr().out
    assert "decisions equal to the recorded ones: 100.00%" in out
    data = json.loads(out_json.read_text())
    assert [r["steps"] for r in data["runs"]] == [1500, 1500, 1500]
    # each run counts the switches within it; one on a run's first step is the previous run's to its
    # successor (a fresh batch after the idle gap may be probed)
    from sglang_dynspec.tracereplay import load_server_trace

    rec = [r["on"] for r in load_server_trace(str(path))]
    at_starts = sum(rec[i] != rec[i - 1] for i in (1500, 3000))
    assert sum(r["switches_redriven"] for r in data["runs"]) == ctl.stats["switches"] - at_starts
    # a trace from before the verify rows were recorded: refused unless they are given
    lines = path.read_text().splitlines(keepends=True)
    old = tmp_path / "old.jsonl"
    old.write_text(lines[0].replace(',"vr":3', "") + "".join(lines[1:]))
    assert main(["replay", "--server-trace", str(old)]) == 2
    assert "give --verify-rows" in capsys.readouterr().err
    assert main(["replay", "--server-trace", str(old), "--verify-rows", "3"]) == 0
    assert "decisions equal to the recorded ones: 100.00%" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        main(["replay", "--server-trace", str(old), "--verify-rows", "0"])
    assert "--verify-rows: the value must be >= 1" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["replay", "--server-trace", str(old), "--verify-rows", "3,4"])
    assert "--verify-rows: expected one integer" in capsys.readouterr().err
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"bs": 1, "t": 0.5}\n')
    assert main(["replay", "--server-trace", str(bad)]) == 2
    assert "line 1 lacks running, waiting, on, acc" in capsys.readouterr().err
    assert main(["replay", "--server-trace", str(path), "--policy", "never", "--policy", "always"]) == 2
    assert "one --policy at a time" in capsys.readouterr().err
    with pytest.raises(ConfigError, match="no steps"):
        from sglang_dynspec.tracereplay import load_server_trace

        (tmp_path / "empty.jsonl").write_text("")
        load_server_trace(str(tmp_path / "empty.jsonl"))


H200_C250 = Path(__file__).resolve().parents[2] / "benchmarks/results/pair1i-hi-row1-logs.tar.xz"


def _server_trace(tarball: Path) -> list[dict]:
    """The one dynspec server's decision trace in a run's logs tarball."""
    traces, _ = read_logs(tarball)
    (rows,) = traces.values()
    return rows


def test_speculation_is_not_extrapolated_into_a_large_batch():
    """H200, SGLang 0.5.12, pair1i-hi C=250: the server had timed speculation only at bs <= 8, its
    fit there was flat (~6.5 ms per step whatever the batch), and after a plain trial at bs 250 it
    switched to speculation (~30 ms steps), scattered the finishing times and ended at 0.64x of
    plain decode.  Re-driven with the server's 3 verify rows per request, the policy keeps plain
    decode at every large-batch step up to and including the one where the server switched."""
    from sglang_dynspec.tracereplay import redrive

    rows = _server_trace(H200_C250)
    first_on = next(i for i, r in enumerate(rows) if r["bs"] >= 150 and r["on"])
    large = [i for i in range(first_on + 1) if rows[i]["bs"] >= 150]
    assert len(large) > 150  # the trial at bs ~250 and the step after it
    fixed = redrive(rows[: first_on + 1], "goodput", verify_rows=3).steps
    assert not any(fixed[i].decided for i in large)
    # the estimates at the server's own costs (re-driven freely, the path there differs)
    est = redrive(rows[: first_on + 1], "goodput", verify_rows=3, follow=True).steps[first_on].estimates
    assert est["off_tok_s"] > 1.2 * est["on_tok_s"]
    # without the verify rows speculation's estimate there is its flat fit's, well above (left to
    # itself that policy speculates at bs ~250 first, and times it)
    unbounded = redrive(rows[: first_on + 1], "goodput", follow=True).steps
    assert unbounded[first_on].estimates["on_tok_s"] > 1.1 * est["on_tok_s"]


def test_following_the_recorded_decisions_keeps_the_servers_costs(tmp_path, capsys):
    """--follow-recorded: a policy whose answers differ still sees the server's own costs, so its
    estimates at each modelled step are the recorded ones; re-driven freely, they drift away."""
    from sglang_dynspec.tracereplay import load_server_trace, redrive

    path, ctl = _traced_run(tmp_path)
    rows = load_server_trace(str(path))
    same = redrive(rows, "goodput", follow=True)
    assert same.agreement == 1.0  # its own policy: the same answers either way
    other = {"margin": 0.6, "persist": 1}
    free = redrive(rows, "goodput", other)
    followed = redrive(rows, "goodput", other, follow=True)
    assert free.agreement < 1.0 and followed.agreement < 1.0  # the other arguments answer otherwise

    def modelled(res):
        keys = ("on_tok_s", "off_tok_s")
        return [(i, tuple(s.estimates.get(k) for k in keys)) for i, s in enumerate(res.steps)
                if s.why == "model" and rows[i].get("why") == "model"]

    recorded = {i: (rows[i]["on_tok_s"], rows[i]["off_tok_s"]) for i, _ in modelled(followed)}
    assert len(recorded) > 100 and dict(modelled(followed)) == recorded
    assert any(recorded.get(i, e) != e for i, e in modelled(free))
    assert main(["replay", "--server-trace", str(path), "--policy", "goodput", "--policy-args",
                 json.dumps(other), "--follow-recorded"]) == 0
    assert "the recorded decisions applied" in capsys.readouterr().out
    assert main(["replay", "--follow-recorded"]) == 2
    assert "--follow-recorded: only applies with --server-trace" in capsys.readouterr().err


H200_ROWS34 = Path(__file__).resolve().parents[2] / "benchmarks/results/pair1q-rows34-logs.tar.xz"


def test_a_fresh_batch_after_another_workload_is_probed():
    """H200, SGLang 0.5.12, pair1q-rows34: after row 3 (temperature 0.7, acceptance 1.79) the server
    stayed plain through row 4's greedy low phases, where speculation was 1.3x faster: at bs 1
    speculation looked 20 % slower on the old acceptance, too far for a near-tie probe, and the
    hopeful probe waited for 2,000 plain steps.  Asked at the same inputs, the policy now probes
    the first batch of row 4 (it began afresh after the server drained), and never the large
    batches of the high phases."""
    from sglang_dynspec.tracereplay import redrive

    rows = _server_trace(H200_ROWS34)
    res = redrive(rows, "goodput", follow=True)
    trace = res.runs()[-1]  # row 4, after the idle gap that ended row 3
    first = trace[0]
    assert first.bs == 1 and not first.recorded and first.decided and first.why == "fresh"
    fresh = [s for s in res.steps if s.why == "fresh"]
    assert fresh and max(s.bs for s in fresh) <= 10
    assert not any(s.why == "fresh" for s in trace if s.bs >= 30)


H200_ROWS34_R = Path(__file__).resolve().parents[2] / "benchmarks/results/pair1r-rows34-logs.tar.xz"


def test_warm_up_steps_no_longer_hide_speculation_in_the_low_phases():
    """H200, SGLang 0.5.12, pair1r-rows34: the server's first bs-1 speculative steps were warm-ups
    (676 and 117 ms), their median set the bs-1 estimate to 62 ms, and the policy saw speculation at
    28 tokens/s where it delivers ~300: plain through every low phase of row 4, no probe (none looked
    hopeful).  Re-driven at the same inputs, speculation's bs-1 estimate is a step's again and the
    first low phase's fresh batches are probed."""
    from sglang_dynspec.tracereplay import redrive

    rows = _server_trace(H200_ROWS34_R)
    recorded_low = [r for r in rows if r["bs"] == 1 and r.get("on_tok_s") is not None][-200:]
    assert max(r["on_tok_s"] for r in recorded_low) < 50  # what the server saw
    res = redrive(rows, "goodput", follow=True)
    row4 = res.runs()[-1]
    low0 = [s for s in row4[: next(i for i, s in enumerate(row4) if s.bs >= 20)] if s.bs == 1]
    assert min(s.estimates["on_tok_s"] for s in low0) > 200
    assert any(s.why == "fresh" and s.decided for s in low0)
    assert not any(s.recorded for s in low0)  # where the server stayed plain


H200_C30 = Path(__file__).resolve().parents[2] / "benchmarks/results/pair1t-row1-logs.tar.xz"


def test_plain_waves_are_not_lent_to_speculation():
    """H200, SGLang 0.5.12, pair1t-row1 C=30 (128 tokens, closed loop): after a plain trial whose
    refills came 29 at a time, the server switched to speculation (its estimate 5990 tok/s against
    5702 for plain decode) and the level ended at 0.81x of a plain server (`off` 5874, `on` 3344).
    Speculation had no prefill history at that load and was lent plain decode's waves.  Re-driven,
    the policy keeps plain decode through the level up to that step, with speculation's estimate
    below plain decode's."""
    from sglang_dynspec.tracereplay import redrive

    rows = _server_trace(H200_C30)
    switch = next(i for i, r in enumerate(rows) if r["bs"] >= 25 and r["on"] and not rows[i - 1]["on"])
    assert rows[switch]["on_tok_s"] > rows[switch]["off_tok_s"]  # what the server estimated
    steps = redrive(rows[: switch + 1], "goodput").steps
    level = [s for s in steps if s.bs >= 25]
    assert len(level) > 300 and not any(s.decided for s in level)
    est = steps[switch].estimates
    assert est["off_tok_s"] > 1.5 * est["on_tok_s"]


RESULTS = Path(__file__).resolve().parents[2] / "benchmarks/results"


def test_a_greedy_phase_after_a_sampled_load_learns_its_own_acceptance():
    """H200, SGLang 0.5.12, pair1u-rows34: row 4's first low phase (greedy) ran plain on row 3's
    temperature-0.7 acceptance (1.76) where speculation accepted 2.4 and was 1.4x faster.  Its trace
    predates the "greedy" field: row 4's steps (after the last idle gap) are marked greedy here,
    row 3's sampled.  Asked at the same inputs, the policy learns the greedy acceptance at row 4's
    first step."""
    from sglang_dynspec.tracereplay import redrive

    rows = _server_trace(RESULTS / "pair1u-rows34-logs.tar.xz")
    row4_start = len(rows) - len(redrive(rows, "goodput", follow=True).runs()[-1])
    marked = [dict(r, greedy=i >= row4_start) for i, r in enumerate(rows)]
    row4 = redrive(marked, "goodput", follow=True).runs()[-1]
    low0 = row4[: next(i for i, s in enumerate(row4) if s.bs >= 8)]  # up to the first high phase
    assert len(low0) > 500 and not any(s.recorded for s in low0)  # the server stayed plain there
    assert low0[0].decided and low0[0].why == "learn on"


def test_results_whose_batch_does_not_say_teach_the_decisions_regime():
    """H200, SGLang 0.5.12, pair1v-rows34 (commit a6f3082): the results' regime was read from a batch
    copy without sampling info, no result taught the regime of the decisions, and the server stayed
    in "learn on" for all 3377 steps.  Re-driven on its recorded inputs (the same results, now taught
    to the previous decision's regime), the policy is done learning either regime within a few
    dozen steps and asks for plain decode, which that server never timed."""
    from sglang_dynspec.tracereplay import redrive

    rows = _server_trace(RESULTS / "pair1v-rows34-logs.tar.xz")
    assert {r["why"] for r in rows} == {"learn on"} and {r["greedy"] for r in rows} == {True, False}
    steps = redrive(rows, "goodput", follow=True).steps
    learning = [s for s in steps if s.why == "learn on"]
    assert len(learning) < 40
    assert sum(s.why == "learn off" for s in steps) > 3000


def test_a_switch_to_speculation_for_a_slower_plain_step_looks_back_at_plain_decode():
    """H200, SGLang 0.5.12, pair1w-rows34 (commit c321d65), row 3 at C=1 (temperature 0.7): a burst
    of 5-9 ms plain steps among 3.5 ms ones raised the bs-1 plain estimate and the server switched
    to speculation at step 1562, for good: one later step at bs 1 ran plain (a high phase's drained
    tail), none in the low phases of row 4 (its plain estimate stayed at ~130 tok/s where `off`
    delivered ~280).  Asked at the
    same inputs, the policy owes plain decode a look ``reprobe_near`` (256) steps after that switch."""
    from sglang_dynspec.tracereplay import redrive

    rows = _server_trace(RESULTS / "pair1w-rows34-logs.tar.xz")
    switch = 1562
    assert rows[switch]["on"] and not rows[switch - 1]["on"] and rows[switch]["why"] == "model"
    assert sum(not r["on"] for r in rows[switch:] if r["bs"] == 1) == 1
    steps = redrive(rows, "goodput", follow=True).steps
    # (since the arrival rate entered the estimates, the same switch comes one step sooner, and two
    # probes before it are judged 4 steps sooner: PROBE_DECISIONS)
    redriven = next(i for i in range(switch - 8, switch + 8) if steps[i].decided)
    assert redriven in (switch - 1, switch)
    differ = sum(s.decided != r["on"] for s, r in zip(steps[:redriven], rows[:redriven]))
    assert differ <= 8
    rechecks = [i for i, s in enumerate(steps) if s.why == "recheck off"]
    assert rechecks == [redriven + 256] and steps[rechecks[0]].bs == 1 and not steps[rechecks[0]].decided


@pytest.mark.parametrize("run, step", [("pair1x-rows34", 3191), ("pair1w-rows34", 2280)])
def test_a_trial_at_a_size_speculation_never_ran_ends_plain_on_a_toss_up(run, step):
    """H200, SGLang 0.5.12, row 4's first high phase: a plain trial at bs 150-160 ended in
    speculation on a toss-up whose speculative figure came from batches of 8 or fewer, and the server
    speculated for 2-3 s where `off` was 1.4x faster.  Asked at the same inputs, the policy stays plain."""
    from sglang_dynspec.tracereplay import redrive

    rows = _server_trace(RESULTS / f"{run}-logs.tar.xz")
    assert rows[step]["on"] and not rows[step - 1]["on"] and rows[step - 1]["why"] == "trial"
    assert rows[step]["bs"] >= 150
    s = redrive(rows, "goodput", follow=True).steps[step]
    assert not s.decided and s.why == "model"


def _goodput_trace(tarball: Path) -> list[dict]:
    """The trace of the run's dynspec server that switched (goodput beside never)."""
    traces, _ = read_logs(tarball)
    (rows,) = [r for r in traces.values() if len({s["on"] for s in r}) == 2]
    return rows


def test_speculation_in_an_open_high_phase_is_left_and_not_probed():
    """H200, SGLang 0.5.12, pair1z-rows34 (commit 97b757f), row 4: a near-tie probe at bs 40 in the
    second high phase (40 requests/s) found the modes tied and stayed, and speculation ran through it
    and the third (bs 40-120) at TPOT 13-14 ms where plain decode's was 7.5-8.7.  Plain decode's
    prefills were priced at a 15-step dwell's 1.33 requests per batch and at speculation's batch
    times.  Asked at the same inputs, the policy leans to plain decode at most of those steps and
    probes speculation at no batch of 40 or more after the first high phase."""
    from sglang_dynspec.tracereplay import redrive

    rows = _goodput_trace(RESULTS / "pair1z-rows34-logs.tar.xz")
    row4 = redrive(rows, "goodput", follow=True).runs()[-1]
    t0 = row4[0].t
    late = [s for s in row4 if s.t - t0 > 20 and s.bs >= 40 and s.recorded]
    assert len(late) > 300
    leaning_off = sum(not s.decided or s.why == "persist" for s in late)
    assert leaning_off > 0.6 * len(late)  # was 5 of 322
    assert not [s for s in row4 if s.t - t0 > 15 and s.bs >= 40 and s.why in ("probe", "fresh", "recheck")]
    # the low phases between: speculation at one request
    low = [s for s in row4 if 15 < s.t - t0 < 20 and s.bs == 1]
    assert len(low) > 100 and all(s.decided for s in low)


def test_speculations_prefill_ratio_from_an_earlier_load_keeps_a_high_phase_plain():
    """H100, SGLang 0.5.12, pair2d-rows34 (commit 32f6da3, which restarted the comparison of the modes'
    prefill batches at every burst): after the plain trial that opened the second high phase, the
    server speculated at bs 46 on estimates of 5435 against 4354 tok/s.  Its prefills there took ~18 ms
    per request against plain decode's ~10 and its steps stalled for 100-400 ms; the batch grew to 126
    in 1.9 s and the phase's TPOT p50 came out at 1.8x `off`'s.  Speculation's prefills had been priced
    at plain decode's, with no batch of its own in that load yet.  Re-driven, the ratio the modes'
    batches showed in earlier loads stays, and the end of the trial stays plain."""
    from sglang_dynspec.tracereplay import redrive

    rows = _goodput_trace(RESULTS / "pair2d-rows34-logs.tar.xz")
    res = redrive(rows, "goodput", follow=True)
    t0 = res.runs()[-1][0].t
    (i,) = [k for k in range(1, len(rows)) if rows[k]["on"] and rows[k - 1]["why"] == "trial"
            and 24.0 < rows[k]["t"] - t0 < 27.0]
    assert rows[i]["bs"] >= 40 and rows[i]["on_tok_s"] > 1.2 * rows[i]["off_tok_s"]  # what the server saw
    s = res.steps[i]
    assert not s.decided and s.estimates["off_tok_s"] > s.estimates["on_tok_s"]
    # and at the inputs of the speculative step that followed, it leaves it at once (later steps
    # follow the server's switch, which this policy did not make: its dwell would hold them)
    assert not res.steps[i + 1].decided and res.steps[i + 1].why == "model"


def test_no_plain_trial_where_plain_decode_is_timed_below_and_above_the_batch():
    """H100, SGLang 0.5.15, topk 4 / 16 draft tokens, pair2e-row2 (commit 170f8a7), C=5: plain decode
    had been timed at bs 1 and 8 but had one sample at bs 5, and that alone started a plain trial of
    173 steps, 2.24 s of the level's 4.5 s, where speculation led by 1.37x even against plain decode
    with free prefills (0.927x of `on@topk4`; every row-2 run, H200 or H100, had `on@topk4` 1.16-1.56x
    `off` at C=5).  An estimate between timed sizes is an interpolation: no trial for it.  Above the
    largest timed size (C=30 here) the trial stays: an extrapolated plain step was 1.3x too slow in the
    H200 traces."""
    from sglang_dynspec.tracereplay import redrive

    rows = _goodput_trace(RESULTS / "pair2e-row2-logs.tar.xz")
    res = redrive(rows, "goodput", follow=True)
    c5 = next(i for i, r in enumerate(rows) if r["bs"] == 5 and r["why"] == "trial")
    c30 = next(i for i, r in enumerate(rows) if r["bs"] == 30)
    assert rows[c5 + 150]["why"] == "trial" and not rows[c5 + 150]["on"]  # what the server did
    assert res.steps[c5].decided and res.steps[c5].why == "model"
    assert rows[c30]["why"] == "trial" and res.steps[c30].why == "trial" and not res.steps[c30].decided


def test_the_first_fresh_batch_of_a_low_phase_is_probed_at_once():
    """H200, SGLang 0.5.12, pair2a-rows34 (commit 86eb720), row 4's first low phase (1 request/s,
    greedy): the greedy acceptance the server held (1.93) came from the harness's correctness
    requests, other prompts at bs 8, and it ran plain decode for the phase's first 3.0 s until a
    fresh-batch probe after reprobe_near plain steps measured ~2.4 (goodput's TPOT p50 there 1.17x
    `on`'s).  A fresh batch is all new requests: the policy now probes at the phase's first one."""
    from sglang_dynspec.tracereplay import redrive

    rows = _goodput_trace(RESULTS / "pair2a-rows34-logs.tar.xz")
    row4 = redrive(rows, "goodput", follow=True).runs()[-1]
    t0 = row4[0].t
    low0 = [s for s in row4 if s.t - t0 < 8.0]
    first_recorded = next(s.t - t0 for s in low0 if s.recorded)
    assert first_recorded > 2.5  # what the server did
    first = next(s for s in low0 if s.decided)
    assert first.t - t0 < 0.1 and first.why == "fresh"


def test_probes_refuted_at_temperature_0_7_do_not_hold_the_first_greedy_low_phase_plain():
    """H100, SGLang 0.5.12, pair2g-rows34 (commit b537d26): row 3's C=1 level at temperature 0.7
    (where `on` was 0.86x `off`) refuted four fresh-batch probes, which backed the next probe off
    to reprobe_near x 8 / 4 plain steps; row 4's first low phase (greedy, 1 request/s) then ran plain
    decode for its first 3.0 s on the greedy acceptance of the harness's correctness requests (1.84),
    and its TPOT p50 came out at 1.34x `on`'s.  Back-off is now per sampling regime: re-driven, the
    phase's first greedy request is probed."""
    from sglang_dynspec.tracereplay import redrive

    rows = _goodput_trace(RESULTS / "pair2g-rows34-logs.tar.xz")
    res = redrive(rows, "goodput", follow=True)
    row4 = res.runs()[-1]
    t0 = row4[0].t
    assert row4[0].bs == 1 and rows[0]["t"] < t0  # the trace's first request after row 3's pause
    low0 = [s for s in row4 if s.t - t0 < 6.0]
    first_recorded = next(s.t - t0 for s in low0 if s.recorded)
    assert first_recorded > 2.5  # what the server did
    first = next(s for s in low0 if s.decided)
    assert first.t - t0 < 0.01 and first.why == "fresh"


H200_ROWS34_2K = Path(__file__).resolve().parents[2] / "benchmarks/results/pair2k-rows34-logs.tar.xz"


def test_an_open_load_the_running_mode_falls_behind_is_judged_at_its_demand():
    """H200, pair2k-rows34, row 4's high2 (40 requests/s): the server speculated for its first ~7 s
    at bs 18-70 on estimates within the margin (e.g. 4765 / 4713 tokens/s), and `on`'s TPOT p50 in
    that phase was 2x `off`'s.  Re-driven on the server's own costs, the policy judges the growing
    batch at the demand of the arrivals (~5,000 tokens/s) and answers plain decode within 2 s of
    the phase's start, where plain decode's estimate leads by more than 1.5x; through the low
    phases (bs <= 2) it speculates where the server did."""
    from sglang_dynspec.tracereplay import redrive

    rows = _server_trace(H200_ROWS34_2K)
    res = redrive(rows, "goodput", follow=True)
    t0 = rows[0]["t"]
    high2 = [s for s in res.steps if 61.0 <= s.t - t0 < 68.0]
    assert sum(s.recorded for s in high2) > 250  # the server speculated through most of it
    first_off = next(s for s in high2 if s.recorded and not s.decided)
    assert first_off.t - t0 < 63.0 and first_off.why == "model"
    e = first_off.estimates
    assert e["off_tok_s"] > 1.5 * e["on_tok_s"] and e["demand_tok_s"] > 4500
    low = [s for s in res.steps if s.bs <= 2 and s.recorded and s.why == "model"]
    assert len(low) > 300 and all(s.decided for s in low)


def test_a_trial_only_for_an_untimed_batch_ends_once_plain_decode_is_timed_there():
    """H100, SGLang 0.5.15, topk 4 / 16 draft tokens, pair3d-row2 (commit 6974c4e), C=5: plain decode
    had been timed only at bs 7-8 (the harness's warm-up; C=1 speculated throughout), so the burst at
    bs 5 started a plain trial, 176 steps of which 0.6 s fell in the 3.7 s level (0.811x `on@topk4`;
    the same level in `pair3d-r2b-row2`, plain timed at bs 1 by then, had no trial: 1.052x).  Even
    with free prefills plain decode lost there by 1.6x.  Re-driven, the trial ends at the step where
    bs 5 has been timed, and the model then speculates; C=30's trial, which plain decode could win,
    runs as before."""
    from sglang_dynspec.tracereplay import redrive

    rows = _goodput_trace(RESULTS / "pair3d-row2-logs.tar.xz")
    res = redrive(rows, "goodput", follow=True)
    c5 = next(i for i, r in enumerate(rows) if r["bs"] == 5 and r["why"] == "trial")
    assert all(r["why"] == "trial" for r in rows[c5:c5 + 170])  # what the server did
    end = next(k for k in range(c5, c5 + 170) if res.steps[k].why != "trial")
    assert end - c5 <= 20 and res.steps[end].decided and res.steps[end].why == "model"
    c30 = next(i for i, r in enumerate(rows) if r["bs"] == 30)
    assert rows[c30]["why"] == "trial"
    assert all(s.why == "trial" and not s.decided for s in res.steps[c30:c30 + 150])


def test_no_plain_trial_that_plain_decode_could_win_only_with_free_prefills():
    """H100, SGLang 0.5.15, topk 4 / 16 draft tokens, pair3f-r2-row2 (commit fda655e), C=5: the burst
    started a 166-step plain trial because plain decode with free prefills (0.755 ms per token) beat
    speculation refilling one request at a time (0.837); a batch of five took 56 ms to prefill, so
    even refilled all at once plain decode made 0.90 ms per token, and `on@topk4` was 1.5x `off`
    there (goodput 0.771x).  Re-driven, the burst's step speculates; C=30's trial stays."""
    from sglang_dynspec.tracereplay import redrive

    rows = _goodput_trace(RESULTS / "pair3f-r2-row2-logs.tar.xz")
    res = redrive(rows, "goodput", follow=True)
    c5 = next(i for i, r in enumerate(rows) if r["bs"] == 5 and r["why"] == "trial")
    assert all(r["why"] == "trial" for r in rows[c5:c5 + 160])  # what the server did
    assert res.steps[c5].decided and res.steps[c5].why == "model"
    c30 = next(i for i, r in enumerate(rows) if r["bs"] == 30)
    assert rows[c30]["why"] == "trial"
    assert all(s.why == "trial" and not s.decided for s in res.steps[c30:c30 + 120])


def test_a_fresh_batchs_probe_is_judged_on_its_own_acceptance():
    """H100, SGLang 0.5.12, pair3c-r4-rows34 (commit 29dbb6a), row 4's first low phase (1 request/s,
    greedy): the server held an acceptance of 1.63-1.89 learnt on other requests, and its second
    fresh-batch probe (66 request-steps whose drafts gave 2.05 tokens a step) was judged on an
    average still at 1.89, which left speculation short of the lead a probe needs to stay (254.9
    against 253.9 tok/s); the phase ran plain for 3.1 s more (goodput's TPOT p50 1.24x `on`'s).
    A switch to speculation at a fresh batch now restarts the acceptance average: re-driven, the
    probe's end keeps speculation, and the first probe (its requests gave 1.81) is still turned
    back."""
    from sglang_dynspec.tracereplay import redrive

    rows = _goodput_trace(RESULTS / "pair3c-r4-rows34-logs.tar.xz")
    res = redrive(rows, "goodput", follow=True)
    t0 = rows[0]["t"]
    first, second = [i for i, r in enumerate(rows) if r["why"] == "fresh" and r["t"] - t0 < 17][:2]
    for start, kept in ((first, False), (second, True)):
        end = next(k for k in range(start, len(rows)) if not rows[k]["on"])  # where the server left it
        assert res.steps[end].decided is kept and res.steps[end].why == "model"


def test_a_probe_cut_short_leaves_the_acceptance_it_had():
    """H100, SGLang 0.5.12, pair3f-r1-row1 (commit fda655e), row 1: a `fresh` probe at C=70's first
    request was cut short by the level's burst (a plain trial) after one bs-1 step that accepted
    nothing.  The restarted acceptance average became that sample (2.46 -> 1.00), and plain decode,
    which measures none, kept it to the end of the run: the bs-1 batches of the later levels' first
    requests were priced at ~131 tok/s speculating against ~285 plain, where `on` led at C=1.  The
    restart now keeps the old figure as a few samples' worth."""
    from sglang_dynspec.tracereplay import redrive

    rows = _goodput_trace(RESULTS / "pair3f-r1-row1-logs.tar.xz")
    t0 = rows[0]["t"]
    late = [s for s in redrive(rows, "goodput", follow=True).steps if s.t - t0 > 200 and s.bs == 1]
    assert len(late) >= 10
    assert all(s.estimates["on_tok_s"] > 250 for s in late)
    assert any(s.decided for s in late)
