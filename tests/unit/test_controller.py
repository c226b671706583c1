"""The controller: timing, acceptance, switch counting, safe mode, TP agreement."""

import logging
import math

import pytest

from sglang_dynspec.controller import Controller, StepMode
from sglang_dynspec.policies import build_policy


class Clock:
    def __init__(self):
        self.t = 0.0

    def __call__(self):
        return self.t


class Scripted:
    name = "scripted"

    def __init__(self, fn):
        self.fn = fn

    def decide(self, x):
        return self.fn(x)


def test_counts_switches_and_modes():
    c = Controller(build_policy("threshold", {"n": 4}))
    for bs in [1, 2, 8, 8, 2, 9]:
        c.on_decode(bs)
    s = c.snapshot()
    assert s["decode_steps"] == 6 and s["steps_on"] == 3 and s["steps_off"] == 3
    assert s["switches"] == 3


def test_step_costs_measured_from_intervals_and_agreed():
    clock = Clock()
    c = Controller(build_policy("always", {}), clock=clock, sync_interval=4)
    for i in range(40):
        c.on_decode(8)
        clock.t += 0.010
    assert c.view is not None
    assert c.view.estimate(True, 8) == pytest.approx(0.010)
    assert c.view.estimate(False, 8) is None


def test_prefill_time_is_charged_per_request_to_the_previous_mode_idle_time_is_not():
    clock = Clock()
    c = Controller(build_policy("always", {}), clock=clock, sync_interval=1)
    for _ in range(6):  # speculative steps of 10 ms, 3 tokens each (2 drafts accepted of 1 row)
        c.on_decode(1)
        c.on_result(1, 2)
        clock.t += 0.010
    assert c.costs.count[1][1] == 5 and c.costs.estimate_local(True, 1) == pytest.approx(0.010)
    c.on_other(2)  # a prefill of two requests, 20 ms, between two decode steps
    clock.t += 0.020
    c.on_other(1)  # a second one: still the same interval
    clock.t += 0.010
    c.on_decode(1)
    clock.t += 0.010
    c.on_decode(1)
    # the decode steps around the prefill are no samples; the 30 ms are one prefill of 3 requests
    # after an `on` step, recorded one step late (the step after it may carry some of its cost)
    assert c.costs.count[1][1] == 5 and c.costs.estimate_local(True, 1) == pytest.approx(0.010)
    assert c.prefill.hist_req[1] == 3 and c.prefill.hist_batches[1] == 1 and c.prefill.hist_batches[0] == 0
    c._refresh_view()
    assert c.view.prefill_history(True) == pytest.approx(0.010)
    # 3 requests admitted after 6 steps x 3 tokens
    assert c.prefill.rate_req / c.prefill.rate_tok == pytest.approx(3 / 18)
    # An idle gap before new requests arrive (decode part 50x the estimate): neither part is a cost.
    c.on_result(1, 2)
    clock.t += 0.5
    c.on_other(4)
    clock.t += 0.040
    c.on_decode(1)
    clock.t += 0.010
    c.on_decode(1)
    assert c.costs.count[1][1] == 5
    assert c.prefill.hist_req[1] == 3  # the admission after the idle gap is no mode's
    assert c.prefill.count[4] == 1  # but its time tells what a batch of 4 costs
    # A new run after idling: no interval spans it.
    c.on_idle()
    clock.t += 0.003
    c.on_decode(1)
    assert c.costs.count[1][1] == 5


def test_decode_steps_slowed_by_a_prefill_are_charged_to_it_not_to_decode():
    """H200 pair, plain decode at bs 5 (pair1i-row1 trace, steps 3004-3005): 3.4 ms steps, then a
    prefill of the 5 requests that replaced a finished cohort (74 ms), whose interrupted step took
    9.9 ms and the next 5.9 ms.  As decode samples those raised the bs-5 estimate to 4.1 ms just as
    the plain trial ended and was judged, and the policy speculated where plain decode made 11 %
    more.  Their excess over the estimate belongs to the prefill."""
    clock = Clock()
    c = Controller(build_policy("never", {}), clock=clock, sync_interval=1)
    for _ in range(40):
        c.on_decode(5)
        clock.t += 0.0034
    clock.t += 0.0099 - 0.0034  # the interrupted step
    c.on_other(5)
    clock.t += 0.074
    c.on_decode(5)
    clock.t += 0.0059  # the step after it
    c.on_decode(5)
    for _ in range(5):
        clock.t += 0.0034
        c.on_decode(5)
    assert c.costs.estimate_local(False, 5) == pytest.approx(0.0034)
    assert c.prefill.time[5] == pytest.approx(0.074 + (0.0099 - 0.0034) + (0.0059 - 0.0034))
    assert c.prefill.stretch_req[0] == 5
    # While a batch size has fewer than MIN_SAMPLES samples, every interval is one (nothing to
    # compare with): a load that prefills at every step still gets its decode steps timed.  After
    # that, its disturbed steps are not samples.
    c2 = Controller(build_policy("never", {}), clock=clock, sync_interval=1)
    for _ in range(7):
        c2.on_decode(7)
        clock.t += 0.003
        c2.on_other(1)
        clock.t += 0.020
    assert c2.costs.samples(False, 7) == 3


def test_off_steps_count_their_tokens_and_a_burst_that_grows_the_batch_restarts_the_plain_stretch():
    clock = Clock()
    c = Controller(build_policy("never", {}), clock=clock, sync_interval=1)
    for _ in range(10):
        c.on_decode(8)
        clock.t += 0.004
    c.on_other(2)  # two requests: no new load (2 < 4)
    clock.t += 0.020
    c.on_decode(8)
    clock.t += 0.004
    c.on_decode(8)  # a prefill is recorded at the step after the one it preceded
    assert c.prefill.stretch_req[0] == 2 and c.prefill.rate_tok == 88
    clock.t += 0.004
    c.on_other(8)  # the whole batch replaced: a refill of the same load, the stretch goes on
    clock.t += 0.040
    c.on_decode(8)
    clock.t += 0.004
    c.on_decode(8)
    assert c.prefill.stretch_req[0] == 10 and c.prefill.stretch_batches[0] == 2
    assert c.prefill.hist_req[0] == pytest.approx(2 * (1 - 1 / 32) + 8)
    clock.t += 0.004
    c.on_other(8)  # eight more at once: the batch doubles, a burst, the plain stretch restarts with it
    clock.t += 0.040
    c.on_decode(16)
    clock.t += 0.004
    c.on_decode(16)
    assert c.prefill.stretch_req[0] == 8 and c.prefill.stretch_batches[0] == 1
    c.on_decode(16)
    # batches of 2 (20 ms) and 8 (40 ms): 8 at once cost 5 ms each
    assert c.view.prefill_stretch(False) == pytest.approx(0.005)


def test_a_compiling_first_prefill_is_clipped_and_batch_costs_are_shared_by_the_modes():
    """The first prefill of a new shape compiles kernels (217 ms for one request on the H200,
    then ~20 ms).  It must not keep its mode looking expensive: batch times are learnt from every
    batch, clipped once a size has history, and the modes differ only in how they batch."""
    clock = Clock()
    c = Controller(build_policy("always", {}), clock=clock, sync_interval=1)
    c.on_decode(1)
    clock.t += 0.006
    c.on_other(1)
    clock.t += 0.217  # compiling
    for i in range(200):
        c.on_decode(1)
        c.on_result(1, 1)
        clock.t += 0.006
        if i % 50 == 49:
            c.on_other(1)
            clock.t += 0.020
    c.on_decode(1)
    assert c.view.prefill_history(True) == pytest.approx(0.020, rel=0.1)


def test_acceptance_estimate():
    c = Controller(build_policy("always", {}))
    for _ in range(200):
        c.on_result(decode_bs=4, accepted_drafts=6)  # 1.5 drafts per row
    assert c.accept_length == pytest.approx(2.5)
    assert c.snapshot()["accept_samples"] == 200


@pytest.mark.parametrize(
    "fn, reason",
    [
        (lambda x: 1 / 0, "raised ZeroDivisionError"),
        (lambda x: "yes", "returned 'yes'"),
        (lambda x: None, "returned None"),
    ],
)
def test_bad_policy_falls_back_to_safe_mode_once(fn, reason, caplog):
    c = Controller(Scripted(fn), safe_mode_on=False)
    with caplog.at_level(logging.ERROR, logger="sglang_dynspec"):
        out = [c.on_decode(8) for _ in range(5)]
    assert out == [False] * 5
    assert c.failed and reason in c.failed
    assert c.snapshot()["policy_errors"] == 1
    assert sum("disabled for the rest of the run" in r.message for r in caplog.records) == 1


def test_hanging_policy_is_replaced_at_once_single_rank():
    clock = Clock()

    def slow(x):
        clock.t += 0.5  # 50x the deadline: a hang
        return False

    c = Controller(Scripted(slow), clock=clock, deadline_s=0.01, safe_mode_on=True)
    assert c.on_decode(8) is True
    assert "deadline" in c.failed


def test_one_late_call_is_a_hiccup_three_in_a_row_a_failure():
    clock = Clock()
    late_steps = {3, 10, 11, 20, 21, 22}

    def sometimes_late(x):
        clock.t += 0.02 if x.step in late_steps else 0.0  # 2x the deadline
        return False

    c = Controller(Scripted(sometimes_late), clock=clock, deadline_s=0.01, deadline_strikes=3)
    out = [c.on_decode(8) for _ in range(25)]
    # steps 3 and 10-11 are late but not three in a row; 20-22 are: the third fails the policy
    assert out[:22] == [False] * 22 and out[22:] == [True] * 3
    assert "3 late in a row" in c.failed and c.stats["policy_errors"] == 1


def test_slow_policy_waits_for_agreement_with_several_ranks():
    clock = Clock()

    def slow(x):
        clock.t += 0.5 if x.step == 2 else 0.0
        return False

    sums = []

    def agree(vec):
        sums.append(vec[-1])
        return vec  # a single rank's vector; the flag survives the SUM

    c = Controller(Scripted(slow), clock=clock, deadline_s=0.01, tp_size=2, agree=agree, sync_interval=4)
    out = [c.on_decode(8) for _ in range(6)]
    # steps 0..3 follow the policy; the miss at step 2 takes effect at the agreement of step 4
    assert out[:4] == [False] * 4 and out[4:] == [True, True]
    assert sums == [1.0]


def test_failure_on_other_rank_reaches_this_rank():
    def agree(vec):
        vec = list(vec)
        vec[-1] += 1.0  # the other rank missed its deadline
        return vec

    c = Controller(build_policy("never", {}), tp_size=2, agree=agree, sync_interval=2)
    out = [c.on_decode(8) for _ in range(4)]
    assert out == [False, False, True, True]
    assert "another rank" in c.failed


def test_observers_through_pluggy():
    import pluggy

    from sglang_dynspec import hookspecs

    pm = pluggy.PluginManager("sglang_dynspec")
    pm.add_hookspecs(hookspecs)
    seen = {"decisions": 0, "switches": 0}

    class Obs:
        @hookspecs.hookimpl
        def dynspec_decision(self, record):
            seen["decisions"] += 1

        @hookspecs.hookimpl
        def dynspec_switch(self, record):
            seen["switches"] += 1

    pm.register(Obs())
    c = Controller(build_policy("threshold", {"n": 4}), hook=pm.hook)
    for bs in [1, 8, 1, 1]:
        c.on_decode(bs)
    assert seen == {"decisions": 4, "switches": 2}


def test_lockstep_prefill_bursts_give_a_steady_cost_per_token():
    """Lockstep batches: every 128 steps of 5 ms all 32 requests finish and one 150 ms prefill
    runs.  Per request the prefill costs the same every time, so the cost per output token
    (decode + prefill share) must sit at 5/32 + 150/(32*128) ms right after a burst and between
    bursts, or a policy would flip mode for the steps that follow it."""
    clock = Clock()
    c = Controller(build_policy("never", {}), clock=clock, sync_interval=1)
    truth = 0.005 / 32 + 0.150 / (32 * 128)
    worst = 0.0
    for step in range(128 * 20):
        c.on_decode(32)
        clock.t += 0.005
        if step % 128 == 127:
            c.on_other(32)
            clock.t += 0.150
        if step > 128 * 2:
            v = c.view
            per_token = v.estimate(False, 32) / 32 + v.prefill_stretch(False) * v.requests_per_token()
            worst = max(worst, abs(per_token / truth - 1.0))
    assert worst < 0.02


def test_acceptance_averages_over_request_steps_not_decode_steps():
    # One request per step: a hard prompt's few bad steps are a few samples, not a trend (a dip at
    # C=1 once decided "off", and acceptance is not measured while off).  Many rows per step: the
    # estimate follows quickly.
    c = Controller(build_policy("always", {}))
    for _ in range(400):
        c.on_result(1, 2)  # 3.0 tokens per step
    for _ in range(10):
        c.on_result(1, 0)  # 1.0
    assert c.accept_length > 2.8
    for _ in range(3):
        c.on_result(128, 0)
    assert c.accept_length < 1.3


def test_prefill_batch_time_is_interpolated_between_measured_sizes():
    from sglang_dynspec.costs import CostTable, CostView, PrefillMeter

    # H200 pair shape: one request ~30 ms, ten ~50 ms, seventy ~150 ms, two hundred ~190 ms.
    m = PrefillMeter()
    for n, ms in ((1, 30.0), (10, 50.0), (70, 150.0), (200, 190.0)):
        for _ in range(5):
            m.add_tokens(128 * n)
            m.observe(True, ms / 1e3, n)
    v = CostView.from_table(CostTable(), m)
    assert v.batch_seconds(1) == pytest.approx(0.030)
    assert v.batch_seconds(5.5) == pytest.approx(0.040)
    assert v.batch_seconds(70) == pytest.approx(0.150)
    # a line through them all would charge one request about twice its time (the bug this fixes)
    a, slope = v.batch_fit
    assert a + slope > 0.045
    # beyond the measured sizes: the last point plus the line's slope
    assert v.batch_seconds(300) == pytest.approx(0.190 + slope * 100)
    n = v.batch_size_history(True)
    assert v.prefill_history(True) == pytest.approx(v.batch_seconds(n) / n)


def test_a_whole_batch_wave_is_priced_between_timed_sizes_and_free_beyond_them():
    from sglang_dynspec.costs import CostTable, CostView, PrefillMeter

    m = PrefillMeter()
    assert CostView.from_table(CostTable(), m).wave_per_request(5) == 0.0  # nothing timed yet
    for n, ms in ((1, 33.0), (5, 56.0)):
        for _ in range(5):
            m.add_tokens(128 * n)
            m.observe(False, ms / 1e3, n)
    v = CostView.from_table(CostTable(), m)
    assert v.wave_per_request(1) == pytest.approx(0.033)
    assert v.wave_per_request(3) == pytest.approx(v.batch_seconds(3) / 3)  # interpolated
    assert v.wave_per_request(5) == pytest.approx(0.0112)
    # beyond the largest batch timed the extra requests cost nothing (an exploring bound), where
    # the line through sizes 1 and 5 would add 5.75 ms for each
    assert v.wave_per_request(10) == pytest.approx(0.0056)
    assert v.batch_seconds(10) / 10 > 1.5 * v.wave_per_request(10)


def test_a_resume_step_is_an_on_decision_run_and_charged_as_an_off_step():

    clock = Clock()
    seen = []

    class Hook:
        def dynspec_decision(self, record):
            seen.append(record.speculate)

        def dynspec_switch(self, record):
            pass

    c = Controller(build_policy("always", {}), clock=clock, sync_interval=1, hook=Hook())
    assert c.step_mode(4, resume_pending=True) is StepMode.RESUME
    clock.t += 0.030  # the resume step's interval: an off-step cost
    assert c.step_mode(4) is StepMode.ON
    clock.t += 0.010
    assert c.step_mode(4, resume_pending=False) is StepMode.ON
    assert c.costs.estimate_local(False, 4) == pytest.approx(0.030)
    assert c.costs.estimate_local(True, 4) == pytest.approx(0.010)
    s = c.snapshot()
    assert s["steps_resume"] == 1 and s["steps_on"] == 3 and s["steps_off"] == 0 and s["switches"] == 0
    assert seen == [True, True, True]  # observers see the policy's decision
    never = Controller(build_policy("never", {}))
    assert never.step_mode(4, resume_pending=True) is StepMode.OFF  # nothing to resume into
    assert never.stats["steps_resume"] == 0
    assert c.on_decode(4) is True  # on_decode: the on/off view of step_mode


def _serve(ctl, clock, policy, steps, reqs, arrivals=None):
    """Closed loop of 128-token requests: speculative steps 6.7 ms (2.3 tokens per request), plain
    3.55 ms; every prefill costs 22 ms per request, batched or not (plain decode gains nothing from
    refilling together here).  ``arrivals``: {step: requests added on top}.  Returns the steps at
    which a plain trial started."""
    trials, why_prev, pending = [], None, 0
    for i in range(steps):
        extra = (arrivals or {}).get(i, 0)
        new = pending + extra
        if new:
            ctl.on_other(new)
            clock.t += 0.022 * new
            reqs.extend([128.0] * extra)
        mode = ctl.step_mode(len(reqs))
        why = policy.explain()["why"]
        if why == "trial" and why_prev != "trial":
            trials.append(i)
        why_prev = why
        on = mode is StepMode.ON
        clock.t += 0.0067 if on else 0.00355
        if on:
            ctl.on_result(len(reqs), round(1.3 * len(reqs)))
        left = [r - (2.3 if on else 1.0) for r in reqs]
        pending = sum(1 for r in left if r <= 0)
        reqs[:] = [r if r > 0 else 128.0 for r in left]  # finished ones are replaced
    return trials


def test_a_refill_is_not_a_new_load_so_a_trial_does_not_start_the_next_one():
    # A plain trial makes the batch finish together; its successors arrive as one burst a lifetime
    # later.  That refill is the same load: counted as a new one it started the next trial, every
    # lifetime (H200 row 2, C=5: half the level in the slower mode).
    clock = Clock()
    pol = build_policy("goodput", {})
    ctl = Controller(pol, clock=clock)
    reqs = [128.0 - 13 * k for k in range(10)]  # staggered, as under speculation
    ctl.on_other(10)
    assert _serve(ctl, clock, pol, 400, reqs) == []  # learning; no burst after the first admission
    del reqs[2:]  # a load of 2 ...
    trials = _serve(ctl, clock, pol, 1800, reqs, arrivals={300: 8})  # ... then 8 more arrive together
    assert trials == [300]
    assert ctl.stats["switches"] >= 2 and ctl.prev is True  # tried plain, went back to speculating
    # a load of another size is a new question
    assert _serve(ctl, clock, pol, 10, reqs, arrivals={3: 14}) == [3]


def _costs_like_the_h200_pair():
    """Speculation timed at bs 1-8 only (CPU-bound, flat ~6.4 ms); plain decode at bs 1-256,
    3.4 ms + 0.037 ms per row (pair1i-hi, SGLang 0.5.12 on the H200)."""
    from sglang_dynspec.costs import CostTable

    t = CostTable()
    for bs in range(1, 9):
        for _ in range(6):
            t.observe(True, bs, 0.0064 + 0.00001 * (bs % 2))
    for bs in (1, 2, 4, 8, 16, 32, 64, 128, 256):
        for _ in range(6):
            t.observe(False, bs, 0.0034 + 0.000037 * bs)
    return t


def test_speculation_above_its_timed_batches_costs_verify_rows_times_a_plain_row():
    from sglang_dynspec.costs import CostView

    t = _costs_like_the_h200_pair()
    bounded = CostView.from_table(t, verify_rows=3)
    top = bounded.estimate(True, 8)  # measured: unchanged
    assert top == pytest.approx(0.0064, abs=2e-5)
    # bs 250: its time at bs 8 plus 3 x 0.037 ms for each of the 242 extra requests (~33 ms)
    assert bounded.estimate(True, 250) == pytest.approx(top + 3 * 0.000037 * 242, rel=0.02)
    assert bounded.estimate(True, 250) > 2 * bounded.estimate(False, 250)
    # at and below its timed batches, and for plain decode, nothing changes
    unbounded = CostView.from_table(t)
    for on, bs in ((True, 1), (True, 5), (True, 8), (False, 250), (False, 3)):
        assert bounded.estimate(on, bs) == unbounded.estimate(on, bs)
    # without verify rows the flat fit stands: speculation at bs 250 looked 5x cheaper than it ran
    assert unbounded.estimate(True, 250) < 0.007
    # one timed batch size is enough for the bound (no fit of its own yet); a 16-row tree is charged
    # 4 plain rows per request up to 4x that size (bs 32), all 16 beyond
    one = CostView.from_table(_one_on_bucket(), verify_rows=16)
    assert one.estimate(True, 4) is None
    assert one.estimate(True, 64) == pytest.approx(0.0064 + 0.000037 * (4 * 24 + 16 * 32), rel=0.02)


def test_a_tree_verify_near_its_timed_batches_is_not_charged_every_row():
    # H100, SGLang 0.5.15, topk 4 / 16 draft tokens (pair2h-row2's trace): speculation timed at
    # bs 1-8 (5.6-6.4 ms), plain decode 3.7 ms + 0.040 ms per row.  At bs 30 `on` beat `off` 1.12x
    # and speculation took 11.35 ms a step (median in pair2i-row2's trace, same host and pair);
    # 16 rows x 0.040 ms per request priced it at ~20.5 ms.
    from sglang_dynspec.costs import CostTable, CostView

    t = CostTable()
    for bs, ms in ((1, 5.62), (5, 6.6), (8, 6.38)):
        for _ in range(6):
            t.observe(True, bs, ms / 1e3)
    for bs in (1, 8, 21, 30, 79, 100):
        for _ in range(6):
            t.observe(False, bs, 0.0037 + 0.00004 * bs)
    v = CostView.from_table(t, verify_rows=16)
    at30 = v.estimate(True, 30)
    assert at30 < 0.01135  # a floor: below what it measured
    assert at30 == pytest.approx(0.00638 + 4 * 0.00004 * 22, rel=0.02)
    # with 2.9 tokens per step it leads plain decode there, as it did
    assert 30 * 2.9 / at30 > 1.1 * 30 / v.estimate(False, 30)
    # far above (4x bs 8 and up) every row counts again: at bs 100 plain decode stays ahead
    # (`off` 9953 tok/s, `on` 5927 on that run)
    at100 = v.estimate(True, 100)
    assert at100 == pytest.approx(0.00638 + 0.00004 * (4 * 24 + 16 * 68), rel=0.02)
    assert 100 * 2.9 / at100 < 100 / v.estimate(False, 100)
    # a chain of 3 rows is charged in full everywhere (the H200 pair's bs-250 floor above)
    chain = CostView.from_table(t, verify_rows=3)
    assert chain.estimate(True, 30) == pytest.approx(0.00638 + 3 * 0.00004 * 22, rel=0.02)


def _one_on_bucket():
    from sglang_dynspec.costs import CostTable

    t = CostTable()
    for _ in range(6):
        t.observe(True, 8, 0.0064)
    for bs in (1, 8, 64):
        for _ in range(6):
            t.observe(False, bs, 0.0034 + 0.000037 * bs)
    return t


def test_verify_rows_reach_the_agreed_view_and_the_trace_record():
    clock = Clock()
    seen = []

    class Relay:
        def dynspec_decision(self, record):
            seen.append(record)

        def dynspec_switch(self, record):
            pass

    c = Controller(build_policy("always", {}), clock=clock, tp_size=2, agree=lambda vec: [2 * x for x in vec],
                   verify_rows=16, sync_interval=1, hook=Relay())
    for _ in range(4):
        clock.t += 0.01
        c.step_mode(4, 4, 0)
    assert c.view is not None and c.view.verify_rows == 16
    assert seen and all(r.verify_rows == 16 for r in seen)


def test_speculation_after_a_long_plain_stretch_restarts_the_acceptance_average():
    # Acceptance is not measured while off: after a long plain stretch the average may be another
    # workload's.  One request per step forgets slowly (see above), so the average restarts.
    on_at = {0, 300}
    c = Controller(Scripted(lambda x: x.step in on_at or x.step > 300))
    assert c.step_mode(1) is StepMode.ON
    for _ in range(200):
        c.on_result(1, 0)  # 1.0 token per step: a hard workload
    for _ in range(299):
        assert c.step_mode(1) is StepMode.OFF
    assert c.step_mode(1) is StepMode.ON  # after 299 plain steps
    for _ in range(64):  # a probe's rows at bs 1 (goodput.PROBE_ROWS)
        c.on_result(1, 2)  # 3.0: greedy now
    # the old average is worth ACCEPT_RESTART_PRIOR samples: 4 of 68
    assert c.accept_length == pytest.approx((4 * 1.0 + 64 * 3.0) / 68)
    assert c.accept_samples == 264  # still known: no second learning phase for the policy
    # a short plain stretch keeps the average
    d = _speculating_after_19_plain_steps(bs=1, admitted=0)
    for _ in range(10):
        d.on_result(1, 2)
    assert d.accept_length < 1.2


def _speculating_after_19_plain_steps(bs: int, admitted: int) -> Controller:
    """A controller that learnt 1.0 token per step at ``bs``, ran 19 plain steps, then admitted
    ``admitted`` requests and resumed speculation."""
    c = Controller(Scripted(lambda x: x.step % 20 == 0))
    c.step_mode(bs)
    for _ in range(200):
        c.on_result(bs, 0)
    for _ in range(19):
        c.step_mode(bs)
    if admitted:
        c.on_other(new_rows=admitted)
    assert c.step_mode(bs) is StepMode.ON
    return c


def test_speculation_at_a_fresh_batch_restarts_the_acceptance_average():
    # Every request of a fresh batch is new to the average, which was learnt on requests gone: after
    # a short plain stretch too, speculation starting there is judged on its own samples (and the
    # old figure as ACCEPT_RESTART_PRIOR of them).
    d = _speculating_after_19_plain_steps(bs=1, admitted=1)  # the request finished, a new one came
    for _ in range(64):
        d.on_result(1, 2)  # 3.0 on the new request
    assert d.accept_length == pytest.approx((4 * 1.0 + 64 * 3.0) / 68)
    assert d.accept_samples == 264
    # a refill (one new among four) is not fresh: the average goes on
    e = _speculating_after_19_plain_steps(bs=4, admitted=1)
    for _ in range(10):
        e.on_result(4, 8)
    assert e.accept_length < 2.0


def test_a_restarted_acceptance_average_is_not_one_sample():
    # A probe cut short after one step (a burst started a plain trial) must not leave that step's
    # sample as the average: nothing measures acceptance while plain decode runs.
    c = Controller(Scripted(lambda x: x.step % 20 == 0))
    c.step_mode(1)
    for _ in range(200):
        c.on_result(1, 2)  # 3.0
    for _ in range(19):
        c.step_mode(1)
    c.on_other(new_rows=1)
    assert c.step_mode(1) is StepMode.ON  # fresh: the average restarts
    c.on_result(1, 0)  # one step that accepted nothing
    assert c.accept_length == pytest.approx((4 * 3.0 + 1.0) / 5)


def test_a_batch_that_drained_and_began_again_is_fresh():
    seen = []
    c = Controller(Scripted(lambda x: seen.append(x.fresh_batch) or False))
    c.on_other(new_rows=2)
    c.step_mode(2)  # both rows admitted since the previous step (none before)
    c.step_mode(2)
    c.on_other(new_rows=1)
    c.step_mode(3)  # one new among three: a refill, not fresh
    c.on_other(new_rows=1)
    c.step_mode(1)  # the three finished, one new request
    assert seen == [True, False, False, True]


def test_warm_up_steps_do_not_set_a_buckets_time():
    """H200, pair1r-rows34: a server's first four bs-1 speculative steps took 676, 117, 6.7 and 6.2 ms
    (the first two warm-ups); their median, 62 ms, stayed the bs-1 estimate all run.  The fastest
    sample anchors the estimate; a bucket whose samples agree keeps their median."""
    from sglang_dynspec.costs import CostTable, first_estimate

    t = CostTable()
    for ms in (675.65, 117.18, 6.69, 6.24):
        t.observe(True, 1, ms / 1e3)
    assert t.estimate_local(True, 1) == pytest.approx((6.69 + 6.24) / 2e3)
    # one warm-up among several steps was already harmless, and stays so
    assert first_estimate([0.419, 0.0064, 0.0066, 0.0065, 0.0063]) == pytest.approx(0.00645)
    # samples within 5x of each other are all steps: the median, as before
    assert first_estimate([0.010, 0.030, 0.011]) == pytest.approx(0.011)
    # an interval of zero (a clock's rounding) anchors nothing
    assert first_estimate([0.0, 0.0066, 0.0064]) == pytest.approx(0.0065)
    # after the first samples the average moves as before (EMA), so a real slowdown still shows
    for _ in range(40):
        t.observe(True, 1, 0.012)
    assert t.estimate_local(True, 1) > 0.011


def test_speculation_without_a_batching_history_gets_its_steady_state_not_plain_waves():
    """H200 pair, pair1t-row1, C=30: plain decode's refills came 29 at a time (~2.4 ms per request),
    speculation had run no prefill at that load.  Lent plain decode's figure, speculation's prefills
    looked as cheap; its own refills (one request at a time) took ~16 ms each."""
    from sglang_dynspec.costs import CostTable, CostView, PrefillMeter

    m = PrefillMeter()
    for n, ms in ((1, 16.0), (6, 46.0), (29, 70.0)):
        for _ in range(5):
            m.add_tokens(128 * n)
            m.observe(False, ms / 1e3, n)
    v = CostView.from_table(CostTable(), m)
    assert v.batch_size_history(True) is None
    assert v.prefill_per_request(False) < 0.006  # plain decode's waves
    # 30 requests x 2.33 tokens per step, 1/128 requests per token: 0.55 finish per step, and a
    # step with any holds 1.3 of them (Poisson)
    lam = 30 * 2.33 / 128
    n = lam / (1 - math.exp(-lam))
    assert v.prefill_per_request(True, 30, 2.33) == pytest.approx(v.batch_seconds(n) / n)
    assert v.prefill_per_request(True, 30, 2.33) > 0.012
    # at a larger batch more finish per step and they batch better
    assert v.prefill_per_request(True, 250, 2.33) < v.prefill_per_request(True, 30, 2.33)
    assert v.refill_per_request(0.0) == pytest.approx(v.batch_seconds(1))
    # with a history of its own, speculation keeps it
    m.observe(True, 0.046, 6)
    v = CostView.from_table(CostTable(), m)
    assert v.prefill_per_request(True, 30, 2.33) == pytest.approx(v.batch_seconds(6) / 6)
    # nothing timed yet: no figure at all
    assert CostView.from_table(CostTable(), PrefillMeter()).prefill_per_request(True, 30, 2.0) == 0.0


def test_acceptance_is_kept_per_sampling_regime_and_the_policy_sees_the_batchs():
    """H200 pair, pair1u-rows34: after row 3 (temperature 0.7, acceptance 1.76) the first greedy low
    phase of row 4 ran plain at bs 1, where speculation (acceptance 2.4) was 1.4x faster: one average
    held the sampled acceptance, and acceptance is not measured while off.  Each regime now has its
    own, and a regime that never speculated is unknown to the policy."""
    seen = []
    c = Controller(Scripted(lambda x: seen.append((x.accept_length, x.accept_samples)) or True))
    c.step_mode(4, greedy=False)
    for _ in range(20):
        c.on_result(4, 3, greedy=False)  # 1.75 tokens per row per step
    c.step_mode(4, greedy=True)  # a greedy batch: nothing known of its regime
    assert seen[-1] == (0.0, 0)
    for _ in range(20):
        c.on_result(4, 6, greedy=True)  # 2.5
    c.step_mode(4, greedy=True)
    assert seen[-1] == (pytest.approx(2.5), 20)
    c.step_mode(4, greedy=False)
    assert seen[-1] == (pytest.approx(1.75), 20)
    assert c.accept_length == pytest.approx(1.75)  # the last step's regime (stats, trace)
    assert c.snapshot()["accept_by_sampling"] == {"greedy": {"accept_length": 2.5, "samples": 20},
                                                  "sampled": {"accept_length": 1.75, "samples": 20}}
    # a release that does not say (None) keeps one average of its own
    c.step_mode(4)
    assert seen[-1] == (0.0, 0)
    # a result whose batch does not say teaches the regime of the last decision (pair1v-rows34:
    # results of unknown regime taught none, and the policy learnt "on" for 3377 steps)
    c.step_mode(4, greedy=False)
    c.on_result(4, 0)  # 1.0
    c.step_mode(4, greedy=False)
    assert seen[-1][1] == 21 and seen[-1][0] < 1.75


def test_goodput_learns_a_new_regimes_acceptance_even_while_plain_decode_wins_the_old_one():
    c = Controller(build_policy("goodput", {}), clock=(clock := Clock()))
    decisions = []

    def step(greedy, on_ms=6.0, off_ms=3.4, drafts=0):
        mode = c.step_mode(1, 1, 0, greedy=greedy)
        decisions.append((mode is StepMode.ON, (c.estimates() or {}).get("why")))
        clock.t += (on_ms if mode is StepMode.ON else off_ms) / 1e3
        if mode is StepMode.ON:
            c.on_result(1, drafts, greedy=greedy)

    for _ in range(400):
        step(False, drafts=0)  # sampled: speculation accepts nothing, 6 ms for 1 token
    assert decisions[-1] == (False, "model")
    step(True, drafts=2)  # greedy requests arrive: their acceptance is unknown
    assert decisions[-1] == (True, "learn on")
    for _ in range(100):
        step(True, drafts=2)  # 3 tokens per 6 ms against 1 per 3.4 ms
    assert decisions[-1][0] is True


def test_each_mode_prefill_ratio_to_a_line_through_both_modes_batches():
    from sglang_dynspec.costs import CostTable, CostView, PrefillMeter

    # speculation's prefill batches take 1.5x plain decode's at every size (draft extend and drafts)
    m = PrefillMeter()
    for n in (1, 2, 3, 4, 6):
        for _ in range(3):
            m.observe(False, (4.0 + 10.0 * n) / 1e3, n)
            m.observe(True, 1.5 * (4.0 + 10.0 * n) / 1e3, n)
    off, on = CostView.from_table(CostTable(), m).mode_factor
    assert on / off == pytest.approx(1.5, rel=0.02)
    assert off < 1.0 < on
    # each mode's figure per request carries its ratio; a mode with fewer than 4 batches has none
    m2 = PrefillMeter()
    for _ in range(3):
        m2.observe(True, 0.030, 1)
    assert CostView.from_table(CostTable(), m2).mode_factor == [1.0, 1.0]


def test_an_estimate_is_timed_around_a_batch_between_two_timed_sizes():
    from sglang_dynspec.costs import MIN_SAMPLES, CostTable, CostView

    t = CostTable()
    for _ in range(MIN_SAMPLES):
        t.observe(False, 1, 0.0035)
        t.observe(False, 8, 0.0040)
        t.observe(True, 4, 0.0060)
    t.observe(False, 5, 0.0038)  # one sample: not timed
    v = CostView.from_table(t)
    assert v.timed_around(False, 8) and v.timed_around(False, 5) and v.timed_around(False, 2)
    assert not v.timed_around(False, 10)  # beyond the largest timed size
    assert v.timed_around(True, 4) and not v.timed_around(True, 2) and not v.timed_around(True, 5)


def test_the_arrival_rate_counts_idle_time():
    from sglang_dynspec.costs import PrefillMeter

    m = PrefillMeter()
    assert m.arrival_rate(0.0) is None
    t = 0.0
    for _ in range(200):  # 40 requests a second for 5 s
        t += 0.025
        m.admit(1, t)
    assert m.arrival_rate(t) == pytest.approx(40.0, rel=0.05)
    assert m.arrival_rate(t + 3.0) < 40.0 * math.exp(-2.9)  # nothing came for 3 s
    m2 = PrefillMeter()  # a fresh average is not biased low: 10 requests in the first 0.5 s
    for k in range(10):
        m2.admit(1, 0.05 * (k + 1))
    assert m2.arrival_rate(0.5) == pytest.approx(20.0, rel=0.25)


def test_a_plain_step_shortened_by_the_prefill_before_it_refunds_the_prefill():
    """With the overlap scheduler the plain step after a prefill ran partly during it (2-3 ms where
    steps take 6 on the H200 pair): the prefill's time is charged net of that."""
    clock = Clock()
    c = Controller(build_policy("never", {}), clock=clock, sync_interval=1)
    for _ in range(10):
        c.on_decode(8)
        clock.t += 0.006
    c.on_decode(8)
    clock.t += 0.006  # the decode step, then a 20 ms prefill of one request
    c.on_other(1)
    clock.t += 0.020
    c.on_decode(8)
    clock.t += 0.002  # the next step took 2 ms where 6 were expected
    c.on_decode(8)
    assert c.prefill.time[1] == pytest.approx(0.016, abs=1e-6)
    # at most half the measured time is refunded
    clock.t += 0.006
    c.on_other(1)
    clock.t += 0.004
    c.on_decode(8)
    clock.t += 0.0001
    c.on_decode(8)
    assert sorted(c.prefill._recent[1]) == pytest.approx([0.002, 0.016], abs=1e-6)


def test_a_switch_ends_the_stretch_of_the_mode_left():
    """pair1z-rows34 (H200 pair): a 15-step plain dwell admitted 4 requests in 3 batches, and its
    1.33 per batch priced plain prefills through the whole speculative high phase after it."""
    clock = Clock()
    decisions = iter([False] * 20 + [True] * 5)
    c = Controller(Scripted(lambda x: next(decisions)), clock=clock, sync_interval=1)
    c.on_decode(8)
    for k in range(19):
        clock.t += 0.005
        if k % 5 == 0:
            c.on_other(1)
            clock.t += 0.01
        c.on_decode(8)
    assert c.prefill.stretch_req[0] >= 3
    clock.t += 0.005
    c.on_decode(8)  # speculation from here
    assert c.prefill.stretch_req == [0.0, 0.0]
