"""Built-in policies decide from StepInputs as documented."""

import pytest

from sglang_dynspec.costs import CostTable, CostView, PrefillMeter
from sglang_dynspec.errors import ConfigError
from sglang_dynspec.policies import StepInputs, build_policy


def inputs(step=0, bs=1, prev=None, dwell=0, acc=0.0, samples=0, costs=None, new_load=False, fresh=False,
           greedy=None):
    return StepInputs(step, bs, bs, 0, acc, samples, prev, dwell, costs, new_load, fresh, greedy)


def run(policy, sizes, **kw):
    """Feed a sequence of batch sizes, threading previous decision and dwell like the controller."""
    prev, dwell, out = None, 0, []
    for i, bs in enumerate(sizes):
        d = policy.decide(inputs(step=i, bs=bs, prev=prev, dwell=dwell, **kw))
        dwell = dwell + 1 if d == prev else 1
        prev = d
        out.append(d)
    return out


def test_always_never():
    assert build_policy("always", {}).decide(inputs(bs=500)) is True
    assert build_policy("never", {}).decide(inputs(bs=1)) is False


def test_threshold_plain():
    p = build_policy("threshold", {"n": 5})
    assert run(p, [1, 5, 6, 10, 5, 3]) == [True, True, False, False, True, True]


def test_threshold_hysteresis_band():
    p = build_policy("threshold", {"n": 5, "band": 2})
    # off above 5; back on only at <= 3
    assert run(p, [4, 6, 5, 4, 3, 5]) == [True, False, False, False, True, True]


def test_threshold_min_dwell():
    p = build_policy("threshold", {"n": 5, "min_dwell": 3})
    assert run(p, [1, 9, 9, 9, 9, 1, 1, 1]) == [True, True, True, False, False, False, True, True]


def test_random_is_seeded_and_switches():
    a = run(build_policy("random", {"seed": 7}), [8] * 400)
    b = run(build_policy("random", {"seed": 7}), [8] * 400)
    c = run(build_policy("random", {"seed": 8}), [8] * 400)
    assert a == b and a != c
    switches = sum(x != y for x, y in zip(a, a[1:]))
    assert 120 < switches < 280  # a fair coin switches about half the time


def test_random_period():
    out = run(build_policy("random", {"seed": 1, "period": 4}), [8] * 64)
    for i in range(0, 64, 4):
        assert len(set(out[i:i + 4])) == 1


def view(on_ms, off_ms, sizes=(1, 2, 4, 8, 16, 32, 64, 128)):
    t = CostTable()
    for bs in sizes:
        for _ in range(5):
            t.observe(True, bs, on_ms(bs) / 1e3)
            t.observe(False, bs, off_ms(bs) / 1e3)
    return CostView.from_table(t)


def test_goodput_picks_faster_mode_per_batch_size():
    # spec: 6 ms + 0.2 ms/row; plain: 3 ms + 0.05 ms/row; accept 2.5 tokens.
    v = view(lambda b: 6 + 0.2 * b, lambda b: 3 + 0.05 * b)
    p = build_policy("goodput", {"min_dwell": 0, "persist": 1})
    for bs in (1, 4, 8):
        assert p.decide(inputs(bs=bs, prev=True, dwell=50, acc=2.5, samples=100, costs=v)) is True
    for bs in (64, 128):
        assert p.decide(inputs(bs=bs, prev=True, dwell=50, acc=2.5, samples=100, costs=v)) is False


def test_goodput_learns_unknown_costs_first():
    p = build_policy("goodput", {"min_dwell": 0})
    assert p.decide(inputs(bs=8)) is True  # nothing known: speculate (learn acceptance, t_on)
    t = CostTable()
    for _ in range(5):
        t.observe(True, 8, 0.006)
    v = CostView.from_table(t)
    assert p.decide(inputs(bs=8, prev=True, dwell=20, acc=2.0, samples=50, costs=v)) is False  # now learn t_off


def test_goodput_hysteresis_and_reprobe():
    v = view(lambda b: 10.0, lambda b: 5.0)  # break-even at accept 2.0
    p = build_policy("goodput", {"min_dwell": 0, "margin": 0.05, "reprobe_every": 100, "persist": 1})
    # inside the band: stay where we are
    assert p.decide(inputs(bs=4, prev=True, dwell=10, acc=1.95, samples=50, costs=v)) is True
    assert p.decide(inputs(bs=4, prev=False, dwell=10, acc=2.05, samples=50, costs=v)) is False
    # clearly better: switch
    assert p.decide(inputs(bs=4, prev=False, dwell=10, acc=2.3, samples=50, costs=v)) is True
    # long off: probe speculation again, if more acceptance could make it win
    assert p.decide(inputs(bs=4, prev=False, dwell=100, acc=1.8, samples=50, costs=v)) is True
    assert p.decide(inputs(bs=4, prev=False, dwell=100, acc=1.0, samples=50, costs=v)) is False


def prefill_view(on_ms, off_ms, on_batch, off_batch, stretch_off=None, tokens_per_request=128,
                 sizes=(1, 2, 4, 8, 16, 32, 64, 128), on_sizes=None):
    """Decode costs as functions of bs (speculation timed at ``on_sizes``, default ``sizes``);
    prefill batches as (requests, ms) after each mode."""
    t = CostTable()
    for bs in sizes:
        for _ in range(5):
            if on_sizes is None or bs in on_sizes:
                t.observe(True, bs, on_ms(bs) / 1e3)
            t.observe(False, bs, off_ms(bs) / 1e3)
    m = PrefillMeter()
    for on, (n, ms) in ((True, on_batch), (False, off_batch)):
        for _ in range(3):
            m.add_tokens(tokens_per_request * n)
            m.observe(on, ms / 1e3, n)
    m.new_stretch(False)
    if stretch_off is not None:
        n, ms = stretch_off
        m.observe(False, ms / 1e3, n)
    return CostView.from_table(t, m)


def test_goodput_counts_prefills_per_output_token():
    # Decode alone: at bs 10 speculation makes 23 tokens in 6.7 ms, plain 10 in 3.55 ms (on wins 1.2x).
    # A prefill batch costs 20 ms + 2.7 ms per request.  After speculative steps requests arrive
    # one at a time (22.7 ms each), after plain ones ten at once (4.7 ms each): plain wins,
    # 0.355 + 4.7/128 vs 0.29 + 22.7/128 ms per token.
    dec_on, dec_off = (lambda b: 6.2 + 0.05 * b), (lambda b: 3.5 + 0.005 * b)
    p = build_policy("goodput", {"min_dwell": 0, "persist": 1})
    x = dict(bs=10, prev=True, dwell=50, acc=2.3, samples=100)
    assert p.decide(inputs(**x, costs=prefill_view(dec_on, dec_off, (1, 0.0), (1, 0.0)))) is True
    assert p.decide(inputs(**x, costs=prefill_view(dec_on, dec_off, (1, 22.7), (10, 47.0)))) is False
    e = p.explain()
    assert e["why"] == "model" and e["off_tok_s"] > e["on_tok_s"] > 0
    # the same batching in both modes changes nothing: decode decides
    assert p.decide(inputs(**x, costs=prefill_view(dec_on, dec_off, (1, 22.7), (1, 22.7)))) is True
    # plain decode's current stretch outranks its history
    assert p.decide(inputs(**x, costs=prefill_view(dec_on, dec_off, (1, 22.7), (1, 22.7),
                                                   stretch_off=(10, 47.0)))) is False


def test_goodput_plain_trial_after_a_burst_until_its_successors_are_seen():
    dec_on, dec_off = (lambda b: 6.2 + 0.05 * b), (lambda b: 3.5 + 0.005 * b)
    p = build_policy("goodput", {"min_dwell": 0, "trial_lifetimes": 1.0})
    same = prefill_view(dec_on, dec_off, (1, 22.0), (1, 22.0))  # stretch empty: plain's batching unknown
    x = dict(bs=10, acc=2.3, samples=100, costs=same)
    # speculating; a burst arrives; plain decode could win only if its prefills batch: a trial
    assert p.decide(inputs(**x, prev=True, dwell=50, new_load=True)) is False
    assert p.explain()["why"] == "trial"
    for _ in range(200):  # ~1 lifetime (128 tokens) and then until 4 successors were prefilled
        assert p.decide(inputs(**x, prev=False, dwell=10)) is False
    seen = prefill_view(dec_on, dec_off, (1, 22.0), (1, 22.0), stretch_off=(4, 88.0))  # one at a time
    assert p.decide(inputs(bs=10, acc=2.3, samples=100, costs=seen, prev=False, dwell=10)) is False  # last trial step
    assert p.decide(inputs(bs=10, acc=2.3, samples=100, costs=seen, prev=False, dwell=10)) is True
    assert p.explain()["why"] == "model"
    # where plain decode loses even with free prefills (bs 1), a burst starts no trial
    assert p.decide(inputs(bs=1, acc=2.3, samples=100, costs=same, prev=True, dwell=50, new_load=True)) is True


def test_goodput_no_trial_where_plain_decode_loses_even_refilling_its_whole_batch_at_once():
    # bs 5: speculation makes 14.3 tokens in 6.45 ms and prefills one request at a time (36 ms each),
    # 0.73 ms per token; plain decode 5 tokens in 3.5 ms, 0.705 with free prefills, but a batch of
    # five takes 56 ms: refilled all at once (the most a batch of five can batch) 0.79.  No trial
    # (H100, pair3f-r2-row2, C=5: a 166-step trial where speculation led by 1.4x, 0.771x `on`).
    dec_on, dec_off = (lambda b: 6.2 + 0.05 * b), (lambda b: 3.5 + 0.005 * b)
    v = prefill_view(dec_on, dec_off, (1, 36.0), (5, 56.0))
    p = build_policy("goodput", {"min_dwell": 0})
    x = dict(bs=5, acc=2.86, samples=100, costs=v)
    _, _, c_free = p.seconds_per_token(inputs(**x))
    c_best = c_free + v.wave_per_request(5) * v.requests_per_token()
    assert c_free < p.seconds_per_token(inputs(**x), open_load=False)[0] < c_best
    assert p.decide(inputs(**x, prev=True, dwell=50, new_load=True)) is True
    assert p.explain()["why"] == "model"
    # at bs 10 a wave of ten is cheaper per request than any batch timed: it could win, a trial
    q = build_policy("goodput", {"min_dwell": 0})
    assert q.decide(inputs(bs=10, acc=2.86, samples=100, costs=v, prev=True, dwell=50, new_load=True)) is False
    assert q.explain()["why"] == "trial"


def test_goodput_plain_trial_whose_successors_are_never_seen_ends_after_twice_its_length():
    # A closed loop whose plain waves drain the batch refills after an idle gap, which no mode's
    # prefill figure counts: the trial waits for its successors as long again as it was planned,
    # no longer, and is then judged (H100: trials of 293-679 steps where 47-154 were planned).
    dec_on, dec_off = (lambda b: 6.2 + 0.05 * b), (lambda b: 3.5 + 0.005 * b)
    p = build_policy("goodput", {"min_dwell": 0, "trial_lifetimes": 1.0})
    same = prefill_view(dec_on, dec_off, (1, 22.0), (1, 22.0))  # plain's stretch stays empty
    planned = int(1.0 / same.requests_per_token()) + 1
    x = dict(bs=10, acc=2.3, samples=100, costs=same)
    assert p.decide(inputs(**x, prev=True, dwell=50, new_load=True)) is False
    trial_steps = 1
    while p.explain()["why"] == "trial" and trial_steps < 10 * planned:
        p.decide(inputs(**x, prev=False, dwell=10))
        trial_steps += 1
    assert p.explain()["why"] != "trial"
    assert trial_steps - 1 == 2 * planned  # the last decision was the judgment after it


def test_goodput_trial_for_an_untimed_batch_ends_once_timed_where_plain_decode_cannot_win():
    # Plain decode timed only at bs 16-32: at bs 10 its estimate is an extrapolation, so a burst starts
    # a trial although plain decode loses there even with free prefills (5.5 ms for 10 tokens against
    # speculation's 6.7 ms for 23 plus one 22 ms prefill per 128 tokens).  Once bs 10 is timed the
    # trial ends; a trial that plain decode could win (its batching unknown) runs on.
    dec_on, dec_off = (lambda b: 6.2 + 0.05 * b), (lambda b: 5.0 + 0.05 * b)
    untimed = prefill_view(dec_on, dec_off, (1, 22.0), (1, 22.0), sizes=(16, 32), on_sizes=(16, 32))
    timed = prefill_view(dec_on, dec_off, (1, 22.0), (1, 22.0), sizes=(8, 16, 32), on_sizes=(8, 16, 32))
    assert not untimed.timed_around(False, 10) and timed.timed_around(False, 10)
    p = build_policy("goodput", {"min_dwell": 0, "trial_lifetimes": 1.0})
    x = dict(bs=10, acc=2.3, samples=100)
    assert p.decide(inputs(**x, costs=untimed, prev=True, dwell=50, new_load=True)) is False
    for _ in range(20):  # not timed yet: the trial goes on
        assert p.decide(inputs(**x, costs=untimed, prev=False, dwell=10)) is False
        assert p.explain()["why"] == "trial"
    assert p.decide(inputs(**x, costs=timed, prev=False, dwell=10)) is False  # its last step
    assert p.decide(inputs(**x, costs=timed, prev=False, dwell=10)) is True
    assert p.explain()["why"] == "model"
    # plain decode 2.5x cheaper: it could win with free prefills, so timing it does not end the trial
    cheap = (lambda b: 2.0 + 0.02 * b)
    untimed = prefill_view(dec_on, cheap, (1, 22.0), (1, 22.0), sizes=(16, 32), on_sizes=(16, 32))
    timed = prefill_view(dec_on, cheap, (1, 22.0), (1, 22.0), sizes=(8, 16, 32), on_sizes=(8, 16, 32))
    p = build_policy("goodput", {"min_dwell": 0, "trial_lifetimes": 1.0})
    assert p.decide(inputs(**x, costs=untimed, prev=True, dwell=50, new_load=True)) is False
    for _ in range(50):
        assert p.decide(inputs(**x, costs=timed, prev=False, dwell=10)) is False
        assert p.explain()["why"] == "trial"


def test_goodput_dwell_holds_mode():
    v = view(lambda b: 10.0, lambda b: 1.0)
    p = build_policy("goodput", {"min_dwell": 8})
    assert p.decide(inputs(bs=4, prev=True, dwell=3, acc=1.0, samples=50, costs=v)) is True


@pytest.mark.parametrize(
    "name, args, needle",
    [
        ("threshold", {"n": -1}, "policy_args.n"),
        ("threshold", {"n": 2, "band": 3}, "band (3) must not exceed n (2)"),
        ("threshold", {"m": 2}, "policy_args.m: Extra inputs are not permitted"),
        ("random", {"p_on": 2}, "policy_args.p_on"),
        ("goodput", {"margin": 1.5}, "policy_args.margin"),
        ("always", {"x": 1}, "policy_args.x"),
        ("nonesuch", {}, "unknown policy; registered: always, goodput, never"),
        ("no.such.module:Thing", {}, "cannot import"),
        ("sglang_dynspec.costs:bucket", {}, "could not be created"),
        ("sglang_dynspec.costs:CostTable", {}, "has no decide(inputs) method"),
    ],
)
def test_bad_policy_config(name, args, needle):
    with pytest.raises(ConfigError) as e:
        build_policy(name, args)
    assert needle in str(e.value)


class Custom:
    def __init__(self, args):
        self.flip = args.get("flip", False)

    def decide(self, x):
        return (x.decode_bs % 2 == 0) ^ self.flip


def test_dotted_policy_spec():
    p = build_policy(f"{__name__}:Custom", {"flip": True})
    assert p.decide(inputs(bs=2)) is False and p.decide(inputs(bs=3)) is True
    assert p.name == f"{__name__}:Custom"


def test_goodput_switches_on_the_other_modes_average_lead_not_on_single_decisions():
    # At C=5 requests are replaced one at a time: the batch alternates 5/4 and with it the ranking
    # (speculation ~6 % ahead at 5, plain ~6 % ahead at 4 here).  Deciding on each step's batch
    # flapped between the modes every dwell.
    off_ms = {4: 4.3, 5: 4.8}
    v = view(lambda b: 10.0, lambda b: off_ms.get(b, 3.0 + 0.3 * b), sizes=(1, 2, 4, 5, 8, 16))
    probe = build_policy("goodput", {})
    c5 = probe.seconds_per_token(inputs(bs=5, acc=2.2, costs=v))
    c4 = probe.seconds_per_token(inputs(bs=4, acc=2.2, costs=v))
    assert c5[1] / c5[0] > 1.05 and c4[1] / c4[0] < 0.95  # each size alone would switch

    def switches(policy, sizes, prev=True, dwell=50):
        n = 0
        for bs in sizes:
            d = policy.decide(inputs(bs=bs, prev=prev, dwell=dwell, acc=2.2, samples=100, costs=v))
            n += d != prev
            dwell = dwell + 1 if d == prev else 1
            prev = d
        return n, prev

    p = build_policy("goodput", {"min_dwell": 0})
    n, prev = switches(p, [5, 4] * 100 + [5])
    assert n == 0 and prev is True
    # Runs of 8 in a row each way (a rule of "8 wins in a row" switched at every run) average out too.
    assert switches(build_policy("goodput", {"min_dwell": 0}), ([5] * 8 + [4] * 8) * 20)[0] == 0
    # A lasting change still switches: within a few persist-lengths, never before persist decisions.
    assert switches(p, [4] * 7, prev=True) == (0, True)
    n, prev = switches(p, [4] * 24, prev=True)
    assert n == 1 and prev is False
    fresh = build_policy("goodput", {"min_dwell": 0})
    steps = [switches(fresh, [4], prev=True)[0] for _ in range(8)]
    assert steps == [0] * 7 + [1]  # from a fresh average: at the 8th decision


def _trial_end(v, bs: int):
    """(chosen, tried): the decision at ``bs`` where plain decode is ~3 % ahead, from plain decode
    entered by choice, and at the end of a plain trial (each after its dwell)."""
    lo, hi = 1.0, 5.0  # the acceptance where plain decode is ~3 % ahead
    for _ in range(60):
        mid = (lo + hi) / 2
        c_on, c_off, _ = build_policy("goodput", {}).seconds_per_token(inputs(bs=bs, acc=mid, costs=v))
        lo, hi = (mid, hi) if c_on / c_off > 1.03 else (lo, mid)
    x = dict(bs=bs, samples=100, costs=v, acc=mid)
    chosen = build_policy("goodput", {"min_dwell": 0}).decide(inputs(**x, prev=False, dwell=50))
    tried = build_policy("goodput", {"min_dwell": 0, "trial_lifetimes": 0.01})
    assert tried.decide(inputs(**x, prev=True, dwell=50, new_load=True)) is False
    assert tried.explain()["why"] == "trial"
    while True:
        ended = tried.decide(inputs(**x, prev=False, dwell=10))
        if tried.explain()["why"] != "trial":
            break
        assert ended is False
    assert tried.explain()["why"] == "model"
    return chosen, ended


def test_goodput_end_of_a_trial_is_judged_without_the_incumbents_margin():
    # plain decode 3 % ahead: within the margin.  Entered by choice, plain stays; entered by a trial,
    # the toss-up goes to speculation.
    dec_on, dec_off = (lambda b: 6.2 + 0.05 * b), (lambda b: 3.5 + 0.005 * b)
    v = prefill_view(dec_on, dec_off, (1, 22.0), (1, 22.0), stretch_off=(4, 88.0))
    assert _trial_end(v, 10) == (False, True)


def test_goodput_end_of_a_trial_stays_plain_on_a_toss_up_where_speculation_was_never_timed():
    # The same costs, speculation timed up to bs 8 only: at bs 100 its estimate is a fit carried
    # beyond what was measured, and the toss-up stays with plain decode (row 4's high phases).
    dec_on, dec_off = (lambda b: 6.2 + 0.05 * b), (lambda b: 3.5 + 0.005 * b)
    v = prefill_view(dec_on, dec_off, (1, 22.0), (1, 22.0), stretch_off=(4, 88.0), on_sizes=(1, 2, 4, 8))
    assert v.speculation_extrapolated(100) and not v.speculation_extrapolated(32)
    assert _trial_end(v, 100) == (False, False)


def test_goodput_tries_plain_decode_where_it_was_never_timed():
    # Plain decode timed only at bs 1-2: its bs-10 figure is an extrapolation and says it loses even
    # with free prefills; a burst still gets a trial (on the H200 that extrapolation read 4.7 ms for
    # a 3.6 ms step).
    t = CostTable()
    for bs in (1, 2, 4, 8, 16):
        for _ in range(5):
            t.observe(True, bs, (6.0 + 0.05 * bs) / 1e3)
    for bs, ms in ((1, 3.4), (2, 3.6)):
        for _ in range(5):
            t.observe(False, bs, ms / 1e3)
    m = PrefillMeter()
    for _ in range(3):
        m.add_tokens(128)
        m.observe(True, 0.022, 1)
    v = CostView.from_table(t, m)
    p = build_policy("goodput", {"min_dwell": 0})
    x = inputs(bs=10, prev=True, dwell=50, acc=2.4, samples=100, costs=v, new_load=True)
    c_on, _, c_free = p.seconds_per_token(x)
    assert c_free > c_on  # by the extrapolation plain decode cannot win
    assert p.decide(x) is False and p.explain()["why"] == "trial"
    # once bs 10 has been timed (and is as slow as extrapolated), no trial
    for _ in range(5):
        t.observe(False, 10, (3.4 + 0.2 * 9) / 1e3)
    v2 = CostView.from_table(t, m)
    q = build_policy("goodput", {"min_dwell": 0})
    assert q.decide(inputs(bs=10, prev=True, dwell=50, acc=2.4, samples=100, costs=v2, new_load=True)) is True


def test_goodput_probes_a_near_tie_soon_and_a_clear_loss_late():
    v = view(lambda b: 10.0, lambda b: 5.0)  # break-even at accept 2.0
    p = build_policy("goodput", {"min_dwell": 0, "reprobe_near": 64, "reprobe_every": 1000})
    near = dict(bs=4, prev=False, acc=1.92, samples=50, costs=v)  # plain ~4 % ahead
    assert p.decide(inputs(**near, dwell=63)) is False
    assert p.decide(inputs(**near, dwell=64)) is True and p.explain()["why"] == "probe"
    clear = dict(near, acc=1.5)  # plain 33 % ahead: not before reprobe_every (and only if hopeful)
    assert p.decide(inputs(**clear, dwell=64)) is False
    assert p.decide(inputs(**clear, dwell=1000)) is True


def _drive(policy, sizes, acc, costs, start_prev=True, new_load_at=()):
    """Decisions over a sequence of batch sizes, threading step, previous decision and dwell like
    the controller; returns (decisions, whys)."""
    prev, dwell, out, whys = start_prev, 50, [], []
    for i, bs in enumerate(sizes):
        d = policy.decide(inputs(step=i, bs=bs, prev=prev, dwell=dwell, acc=acc, samples=100, costs=costs,
                                 new_load=i in new_load_at))
        dwell = dwell + 1 if d == prev else 1
        prev = d
        out.append(d)
        whys.append(policy.explain()["why"])
    return out, whys


def test_goodput_backs_off_near_tie_probes_the_model_turns_back():
    # plain ~7.5 % ahead: a near tie (within two margins), so probes come after reprobe_near plain
    # steps; each one the model turns back doubles the wait for the next, up to 8x.
    v = view(lambda b: 10.0, lambda b: 5.0)
    p = build_policy("goodput", {"min_dwell": 0, "reprobe_near": 64, "reprobe_every": 10**6})
    out, whys = _drive(p, [4] * 4000, 1.85, v, start_prev=False)
    probes = [i for i, w in enumerate(whys) if w == "probe"]
    gaps = [b - a for a, b in zip(probes, probes[1:])]
    assert len(probes) >= 5 and all(False in out[a:b] for a, b in zip(probes, probes[1:]))  # each turned back
    assert gaps[1] > 1.8 * gaps[0] and gaps[2] > 1.8 * gaps[1]
    assert max(gaps) < 8 * 64 + 100  # capped at 2**3 x reprobe_near (+ the time to turn back)
    # a new load forgets them: the next near-tie probe comes after reprobe_near again
    q = build_policy("goodput", {"min_dwell": 0, "reprobe_near": 64, "reprobe_every": 10**6})
    _drive(q, [4] * 2000, 1.85, v, start_prev=False)
    assert q._probe_misses == 3
    q.decide(inputs(step=2000, bs=4, prev=False, dwell=50, acc=1.85, samples=100, costs=v, new_load=True))
    assert q._probe_misses == 0


def test_goodput_backs_off_probes_per_sampling_regime():
    # Probes refuted on sampled requests back off the next sampled probe only: greedy requests have
    # their own acceptance, and their first fresh batch is probed as if nothing had been refuted.
    v = view(lambda b: 10.0, lambda b: 5.0)
    sampled = dict(bs=4, acc=1.85, samples=100, costs=v, greedy=False)

    def refuted_sampled_probes():
        p = build_policy("goodput", {"min_dwell": 0, "reprobe_near": 64, "reprobe_every": 10**6})
        prev, dwell = False, 50
        for i in range(2000):
            d = p.decide(inputs(**sampled, step=i, prev=prev, dwell=dwell))
            dwell, prev = (dwell + 1 if d == prev else 1), d
        assert p._probe_misses == 3 and not prev
        return p

    # the first greedy batch, 100 plain steps in: a fresh batch is probed after reprobe_near / 4 = 16
    greedy = dict(bs=1, prev=False, dwell=100, acc=1.85, samples=100, costs=v, fresh=True, greedy=True)
    p = refuted_sampled_probes()
    assert p.decide(inputs(step=2000, **greedy)) is True and p.explain()["why"] == "fresh"
    # the same batch had it been sampled: backed off to 8 x 64 / 4 = 128 plain steps
    q = refuted_sampled_probes()
    assert q.decide(inputs(step=2000, **dict(greedy, greedy=False))) is False
    # and the sampled regime's back-off is kept for when sampled requests come back
    p.decide(inputs(step=2001, **dict(greedy, prev=True, dwell=1, fresh=False)))
    p.decide(inputs(step=2002, **sampled, prev=False, dwell=200))
    assert p._probe_misses == 3


def test_goodput_judges_a_probe_after_it_measured_enough_request_steps():
    # pair1s-row1, C=1: a near-tie probe at bs 1 was turned back after 23 steps on a few noisy
    # samples.  A probe now speculates PROBE_ROWS request-steps first, however the estimates lean;
    # at bs 8 that is 8 steps, less than the dwell, which then decides as before.
    v = view(lambda b: 10.0, lambda b: 5.0)
    runs = {}
    for bs in (1, 8):
        p = build_policy("goodput", {"reprobe_near": 64, "reprobe_every": 10**6})
        out, whys = _drive(p, [bs] * 400, 1.85, v, start_prev=False)
        start = whys.index("probe")
        assert out[start] and not any(out[:start])
        runs[bs] = out[start:].index(False)
        held = whys[start + 1:start + runs[bs]]
        assert set(held) <= {"probing", "dwell", "persist"}
        assert held.count("probing") == 64 // bs - 1
    # judged after PROBE_DECISIONS model decisions, without the dwell (a probe's steps at a large
    # batch are costly: pair1z-rows34)
    assert runs[1] >= 64 and 8 <= runs[8] < 16


def test_goodput_a_switch_reversing_a_recent_one_waits_longer_in_a_tie():
    # runs of 40 steps at bs 5 (speculation ~6 % ahead) and 40 at bs 4 (plain ~6 % ahead): each run
    # outlasts `persist`, so a rule without memory switches at every run; with it the waits double.
    off_ms = {4: 4.3, 5: 4.8}
    v = view(lambda b: 10.0, lambda b: off_ms.get(b, 3.0 + 0.3 * b), sizes=(1, 2, 4, 5, 8, 16))
    sizes = ([4] * 40 + [5] * 40) * 30
    out, _ = _drive(build_policy("goodput", {"min_dwell": 0}), sizes, 2.2, v)
    n = sum(a != b for a, b in zip(out, out[1:]))
    assert 2 <= n <= 12, n  # not 60
    # a clear lead is followed after `persist` decisions even after flip-flops
    p = build_policy("goodput", {"min_dwell": 0})
    out, _ = _drive(p, sizes[:400], 2.2, v)
    assert p._flips >= 1
    prev = out[-1]
    clear = view(lambda b: 20.0 if prev else 2.0, lambda b: off_ms.get(b, 3.0 + 0.3 * b), sizes=(1, 2, 4, 5, 8, 16))
    decisions = [p.decide(inputs(step=400 + i, bs=5, prev=prev, dwell=50 + i, acc=2.2, samples=100, costs=clear))
                 for i in range(8)]
    assert (not prev) in decisions  # within `persist` decisions (sooner: its average already leaned)


def test_goodput_dwell_ends_when_the_batch_doubles_or_halves():
    v = view(lambda b: 6.0 + 0.3 * b, lambda b: 3.0 + 0.02 * b)
    p = build_policy("goodput", {"min_dwell": 16, "persist": 1})
    assert p.decide(inputs(bs=2, acc=2.4, samples=100, costs=v)) is True  # entered at bs 2
    assert p.decide(inputs(bs=3, prev=True, dwell=2, acc=2.4, samples=100, costs=v)) is True
    assert p.explain()["why"] == "dwell"
    assert p.decide(inputs(bs=64, prev=True, dwell=3, acc=2.4, samples=100, costs=v)) is False
    assert p.explain()["why"] == "model"


class _BsOneRun:
    """One goodput policy fed bs-1 steps, its decisions applied (the dwell counted as a server does)."""

    def __init__(self, speculating: bool):
        self.p = build_policy("goodput", {"reprobe_near": 64, "reprobe_every": 10**6})
        self.step, self.prev, self.dwell, self.whys = 0, speculating, 50, []

    def feed(self, costs, n, acc):
        out = []
        for _ in range(n):
            d = self.p.decide(inputs(step=self.step, bs=1, prev=self.prev, dwell=self.dwell, acc=acc, samples=100,
                                     costs=costs))
            self.dwell, self.prev, self.step = self.dwell + 1 if d == self.prev else 1, d, self.step + 1
            out.append(d)
            self.whys.append(self.p.explain()["why"])
        return out


def test_goodput_rechecks_speculation_soon_after_leaving_it_for_a_slower_step_only():
    # bs 1, accept 2.4: speculation at 7.3 ms a step (3.0 ms a token) beats plain decode at 4.8 ms,
    # until a burst of slow steps puts its estimate at 13 ms (5.5 ms a token; pair1k-row1, C=1).
    calm, slow = view(lambda b: 7.3, lambda b: 4.8), view(lambda b: 13.2, lambda b: 4.8)
    run = _BsOneRun(speculating=True)
    assert all(run.feed(calm, 40, 2.4))
    left = run.feed(slow, 40, 2.4)
    assert left[-1] is False  # the slow estimate loses: plain decode
    off_at = run.step - left[::-1].index(True)
    after = run.feed(slow, 100, 2.4)
    # one probe, reprobe_near plain steps after the switch, although plain still leads by 45 %
    assert run.whys.count("recheck") == 1 and after.index(True) + (run.step - 100) - off_at == 64
    # a switch decided by acceptance owes none: the step time did not move
    run = _BsOneRun(speculating=True)
    assert all(run.feed(calm, 40, 2.4))
    assert run.feed(calm, 40, 1.2)[-1] is False
    assert not any(run.feed(calm, 200, 1.2)) and "recheck" not in run.whys


def test_goodput_rechecks_plain_decode_soon_after_leaving_it_for_a_slower_step_only():
    # bs 1, accept 1.7 (sampled): plain decode at 3.5 ms a step beats speculation at 7.0 ms (4.1 ms a
    # token), until a burst of slow steps puts plain's estimate at 7.6 ms (pair1w-rows34, C=1).
    calm, slow = view(lambda b: 7.0, lambda b: 3.5), view(lambda b: 7.0, lambda b: 7.6)
    run = _BsOneRun(speculating=False)
    assert not any(run.feed(calm, 40, 1.7))
    left = run.feed(slow, 40, 1.7)
    assert left[-1] is True  # the slow estimate loses: speculation
    on_at = run.step - left[::-1].index(False)
    after = run.feed(slow, 100, 1.7)
    # one plain stretch, reprobe_near steps after the switch, although speculation still leads
    assert run.whys.count("recheck off") == 1 and after.index(False) + (run.step - 100) - on_at == 64
    # it lasts the dwell, then the model decides on what it measured (still slow here: back on once
    # speculation's lead held over `persist` decisions, the first of them the dwell's last step)
    assert after[after.index(False):].count(False) == 16 + 8 - 1 and after[-1] is True
    # a switch decided by acceptance owes none: the step time did not move
    run = _BsOneRun(speculating=False)
    assert not any(run.feed(calm, 40, 1.7))
    assert run.feed(calm, 40, 3.5)[-1] is True
    assert all(run.feed(calm, 200, 3.5)) and "recheck off" not in run.whys


def _prefill_view(off_batch: int, on_batch: int = 1):
    """Steps as in the near-tie test (break-even at accept 2.0); prefill batches of one request
    take 20 ms and of ``off_batch`` requests 30 ms; plain decode's stretch admits ``off_batch``
    per batch, speculation's history ``on_batch``."""
    t = CostTable()
    for bs in (1, 2, 4, 8, 16, 32, 64, 128):
        for _ in range(5):
            t.observe(True, bs, 10.0 / 1e3)
            t.observe(False, bs, 5.0 / 1e3)
    m = PrefillMeter()
    for _ in range(4):
        m.add_tokens(2000)
        m.observe(True, 0.020 if on_batch == 1 else 0.030, on_batch)
        m.add_tokens(2000)
        m.observe(False, 0.030 if off_batch > 1 else 0.020, off_batch)
    return CostView.from_table(t, m)


def test_goodput_does_not_probe_where_plain_refills_are_batched():
    # A near tie (plain a few % ahead), as in test_goodput_probes_a_near_tie_soon...: probed after
    # reprobe_near plain steps while both modes prefill one request at a time ...
    scattered = _prefill_view(off_batch=1)
    p = build_policy("goodput", {"min_dwell": 0, "reprobe_near": 64, "reprobe_every": 1000})
    c_on, c_off, _ = p.seconds_per_token(inputs(bs=4, acc=1.92, costs=scattered))
    assert 0.9 < c_off / c_on < 1.0
    assert p.decide(inputs(bs=4, prev=False, dwell=64, acc=1.92, samples=50, costs=scattered)) is True
    assert p.explain()["why"] == "probe"
    # ... but not while plain decode refills 8 at once (waves): a probe would stagger the
    # finishes for good.  At an acceptance that makes it a near tie again, no near-tie probe, no
    # hopeful one; only the stale probe after 4 x reprobe_every.  Also where speculation's own
    # history was measured in bursts (8 at once, as at a level's start): it is plain decode's
    # waves that a probe breaks.
    batched = _prefill_view(off_batch=8)
    assert batched.batch_size_stretch(False) == 8.0
    q = build_policy("goodput", {"min_dwell": 0, "reprobe_near": 64, "reprobe_every": 1000})
    lo, hi = 1.0, 6.0
    for _ in range(50):  # the acceptance where plain decode leads by ~4 %
        mid = (lo + hi) / 2
        c_on, c_off, _ = q.seconds_per_token(inputs(bs=4, acc=mid, costs=batched))
        lo, hi = (mid, hi) if c_on / c_off > 1.04 else (lo, mid)
    x = dict(bs=4, prev=False, acc=mid, samples=50, costs=batched)
    for dwell in (64, 128, 1000, 2000):
        assert q.decide(inputs(**x, dwell=dwell)) is False, dwell
    assert q.decide(inputs(**x, dwell=4000)) is True and q.explain()["why"] == "probe"
    both = _prefill_view(off_batch=8, on_batch=8)
    r = build_policy("goodput", {"min_dwell": 0, "reprobe_near": 64, "reprobe_every": 1000})
    c_on, c_off, _ = r.seconds_per_token(inputs(bs=4, acc=1.92, costs=both))
    assert 0.9 < c_off / c_on < 1.0
    assert r.decide(inputs(bs=4, prev=False, dwell=64, acc=1.92, samples=50, costs=both)) is False


def test_goodput_probes_when_a_fresh_batch_begins_if_more_acceptance_could_win():
    # Plain decode 33 % ahead at acceptance 1.5 (break-even 2.0): no near-tie probe, and the hopeful
    # probe only after reprobe_every plain steps; but when the batch drained and a new one began
    # (the workload may have changed: greedy after sampled requests), one after a quarter of
    # reprobe_near steps (its requests are all new), not sooner than the dwell.
    v = view(lambda b: 10.0, lambda b: 5.0)
    p = build_policy("goodput", {"min_dwell": 0, "reprobe_near": 64, "reprobe_every": 10**6})
    x = dict(bs=1, prev=False, acc=1.5, samples=50, costs=v)
    assert p.decide(inputs(**x, dwell=64)) is False
    assert p.decide(inputs(**x, dwell=15, fresh=True)) is False
    assert p.decide(inputs(**x, dwell=16, fresh=True)) is True and p.explain()["why"] == "fresh"
    d = build_policy("goodput", {"min_dwell": 24, "reprobe_near": 64, "reprobe_every": 10**6})
    assert d.decide(inputs(**x, dwell=23, fresh=True)) is False
    assert d.decide(inputs(**x, dwell=24, fresh=True)) is True
    # not where even 1.5x the acceptance would lose
    q = build_policy("goodput", {"min_dwell": 0, "reprobe_near": 64, "reprobe_every": 10**6})
    assert q.decide(inputs(**dict(x, acc=1.2), dwell=64, fresh=True)) is False


def test_goodput_fresh_probes_spare_refill_waves_but_a_small_batch_holds_none():
    batched = _prefill_view(off_batch=8)  # plain decode's refills come 8 at a time
    p = build_policy("goodput", {"min_dwell": 0, "reprobe_near": 64, "reprobe_every": 10**6})
    acc = 1.5
    hopeful_on, hopeful_off, _ = p.seconds_per_token(inputs(bs=8, acc=acc * 1.5, costs=batched))
    assert hopeful_on < hopeful_off  # more acceptance would win here ...
    x = dict(prev=False, acc=acc, samples=50, costs=batched, dwell=64, fresh=True)
    assert p.decide(inputs(bs=8, **x)) is False  # ... but a probe would break the waves
    hopeful_on, hopeful_off, _ = p.seconds_per_token(inputs(bs=2, acc=acc * 1.5, costs=batched))
    assert hopeful_on < hopeful_off
    assert p.decide(inputs(bs=2, **x)) is True and p.explain()["why"] == "fresh"  # two requests hold no wave


def test_goodput_per_token_charges_an_open_load_what_its_arrivals_stretch_the_step():
    from sglang_dynspec.policies.goodput import per_token

    # pair1z-rows34, a low phase at 1 request/s: speculation 6.9 ms steps at 2.5 tokens per request
    # and 26 ms per prefill, plain decode 3.3 ms and 8.5 ms, ~60 tokens per request, bs 2
    rho = 1 / 60
    on_refill = per_token(0.0069, 2 * 2.5, 0.026, rho, None)
    off_refill = per_token(0.0033, 2, 0.0085, rho, None)
    assert on_refill > 0.98 * off_refill  # refilling every finished request: a tie, or plain decode
    on = per_token(0.0069, 2 * 2.5, 0.026, rho, 1.0)
    off = per_token(0.0033, 2, 0.0085, rho, 1.0)
    assert off > 1.1 * on  # arrivals at 1/s: speculation, as measured (TPOT 2.6 vs 3.4 ms)
    assert on == pytest.approx(0.0069 / (5 * (1 - 0.026)))
    # a load that arrives faster than refills would come is charged as refills (a closed loop's burst)
    assert per_token(0.0069, 5, 0.026, rho, 1000.0) == pytest.approx(on_refill)
    assert per_token(0.0069, 5, 0.026, rho, 30.0) == pytest.approx(on_refill)


def test_goodput_a_probe_in_a_tie_goes_back_to_plain_decode():
    # the modes tie (speculation ~2 % ahead): a near-tie probe is judged after PROBE_ROWS request-steps
    # and PROBE_DECISIONS decisions and, short of the margin, returns; a stretch the model chose stays
    v = view(lambda b: 10.0, lambda b: 5.0 * 1.02)
    p = build_policy("goodput", {"reprobe_near": 64, "reprobe_every": 10**6})
    out, whys = _drive(p, [32] * 200, 2.0, v, start_prev=False)
    start = whys.index("probe")
    back = out[start:].index(False)
    assert 1 + 4 <= back <= 8 and whys[start + back] == "model"
    p2 = build_policy("goodput", {})
    out2, _ = _drive(p2, [32] * 200, 2.0, v, start_prev=True)
    assert all(out2)


def test_goodput_compares_the_modes_at_the_batch_the_arriving_demand_needs(high_phase_view):
    # At bs 34 both modes make ~3,000 tokens/s at 40 arrivals/s: compared there, the modes are within
    # the margin and speculation, running, stays.  40 requests/s of ~150 tokens ask for ~6,000 tokens/s
    # (~7,300 with a burst): plain decode makes that at bs ~65 (~95), speculation only at bs ~170
    # (~510), so its requests would wait 2.5x as long between tokens or more (the high phases of
    # pair2k-rows34, where `on`'s TPOT was 2.5-3x `off`'s): plain decode.  At 1 request/s both make
    # the demand at bs 34; the batch decides.
    x = dict(bs=34, prev=True, dwell=50, acc=2.49, samples=100)
    quiet = build_policy("goodput", {"persist": 1})
    c_on, c_off, _ = quiet.seconds_per_token(inputs(**x, costs=high_phase_view(1.0)))
    assert abs(c_off / c_on - 1.0) < 0.1
    assert quiet.decide(inputs(**x, costs=high_phase_view(1.0))) is True
    calm = high_phase_view(1.0)
    assert quiet.explain()["demand_tok_s"] == pytest.approx(calm.arrivals_per_s / calm.requests_per_token(), rel=1e-3)
    assert quiet.explain()["demand_tok_s"] < 200.0
    p = build_policy("goodput", {"persist": 1})
    busy = high_phase_view(40.0)
    c_on, c_off, _ = p.seconds_per_token(inputs(**x, costs=busy))
    assert c_on > 1.5 * c_off
    assert p.decide(inputs(**x, costs=busy)) is False
    e = p.explain()
    assert 5000.0 < e["demand_tok_s"] < 6500.0 and e["off_tok_s"] > 1.5 * e["on_tok_s"]


def test_goodput_judges_at_the_demand_only_where_the_running_mode_falls_behind_it(high_phase_view):
    from sglang_dynspec.policies.goodput import per_token

    v = high_phase_view(40.0)
    rho, lam = v.requests_per_token(), v.arrivals_per_s
    p = build_policy("goodput", {})

    def step_figures(bs):
        return (per_token(v.estimate(True, bs), bs * 2.49, v.prefill_per_request(True, bs, 2.49), rho, lam),
                per_token(v.estimate(False, bs), bs, v.prefill_per_request(False), rho, lam))

    # plain decode at bs 80 makes the demand: every figure is the step's at bs 80, speculation's too
    # (it falls short there, but the running mode keeps up: in a closed loop arrivals follow it)
    c_on, c_off, _ = p.seconds_per_token(inputs(bs=80, prev=False, dwell=50, acc=2.49, samples=100, costs=v))
    assert (c_on, c_off) == pytest.approx(step_figures(80))
    # at bs 40 plain decode falls behind too: both are charged the batch they would need for the
    # demand and a burst of 1.5 standard deviations of a second's arrivals (~7,300 tokens/s): plain
    # decode ~95 requests, speculation ~510; never less than their steps at bs 40
    on40, off40 = step_figures(40)
    c_on, c_off, _ = p.seconds_per_token(inputs(bs=40, prev=False, dwell=50, acc=2.49, samples=100, costs=v))
    burst = lam / rho * (1 + 1.5 / lam ** 0.5)
    assert c_off * 40 * burst == pytest.approx(95, rel=0.1) and c_off > off40
    assert c_on * 40 * burst == pytest.approx(510, rel=0.15) and c_on > 3 * c_off
