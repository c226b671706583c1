"""CPU cost of one decision: each built-in policy's decide(), and the controller step around it.

Budget: 20 µs per decode step (issue: policy CPU cost).  pytest-benchmark reports the numbers;
the assertion uses the median so one descheduled round on a busy CI machine does not fail it.
"""

import pytest

from sglang_dynspec.costs import CostTable, CostView
from sglang_dynspec.controller import Controller
from sglang_dynspec.policies import StepInputs, build_policy

BUDGET_S = 20e-6

POLICIES = {
    "always": {},
    "never": {},
    "threshold": {"n": 8, "band": 2, "min_dwell": 4},
    "random": {"seed": 3},
    "goodput": {},
}


def _view():
    t = CostTable()
    for bs in (1, 2, 4, 8, 16, 32, 64, 128, 256):
        for _ in range(5):
            t.observe(True, bs, 0.006 + 0.0002 * bs)
            t.observe(False, bs, 0.004 + 0.00005 * bs)
    return CostView.from_table(t)


@pytest.mark.parametrize("name", sorted(POLICIES))
def test_decide_cost(benchmark, name):
    policy = build_policy(name, POLICIES[name])
    view = _view()
    x = StepInputs(step=1000, decode_bs=37, running=40, waiting=3, accept_length=2.4,
                   accept_samples=500, previous=True, steps_in_mode=50, costs=view)
    result = benchmark(policy.decide, x)
    assert isinstance(result, bool)
    assert benchmark.stats.stats.median < BUDGET_S


@pytest.mark.parametrize("name", ["threshold", "goodput"])
def test_controller_step_cost(benchmark, name):
    """Everything the wrapper does per decode step: timing, the policy call, counters."""
    c = Controller(build_policy(name, POLICIES[name]), sync_interval=10_000)
    c.view = _view()
    sizes = iter(range(10**9))

    def step():
        return c.on_decode(1 + next(sizes) % 64, 64, 0)

    benchmark(step)
    assert benchmark.stats.stats.median < BUDGET_S


def test_goodput_estimate_cost_while_an_open_load_outgrows_the_running_mode(benchmark, high_phase_view):
    """The demand rule's path of goodput's estimates (the bulk of a decision): both modes judged at
    the batch they would settle at.  Its search is done once per cost view, acceptance step and
    demand; the controller hands the policy a new view every 16 steps (four views in turn here)."""
    policy = build_policy("goodput", POLICIES["goodput"])
    views = [high_phase_view(40.0) for _ in range(4)]  # speculation short of 40 arrivals/s at every batch
    calls = iter(range(10**9))

    def estimate():
        k = next(calls)
        # (no decide(): the batch counts as growing, its slow average staying at 0)
        x = StepInputs(step=1000 + k, decode_bs=40, running=40, waiting=0, accept_length=2.4,
                       accept_samples=500, previous=True, steps_in_mode=50, costs=views[k // 16 % 4])
        return policy.seconds_per_token(x)

    c_on, c_off, _ = benchmark(estimate)
    assert c_on > 1.5 * c_off  # the demand rule's figures, not today's batch's
    assert benchmark.stats.stats.median < BUDGET_S
