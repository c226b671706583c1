"""The hooks in runtime.py with stand-ins for GPU-only objects (the GPU runs are the real test:
benchmarks/results/fuzz-0512-*.json, tests/gpu)."""

from types import SimpleNamespace as NS

import pytest

from sglang_dynspec import runtime
from sglang_dynspec.controller import Controller, StepMode
from sglang_dynspec.policies import build_policy


class Result:
    """A stand-in for SGLang's GenerationBatchResult (a plain dataclass: weakly referenceable)."""

    def __init__(self, **fields):
        self.__dict__.update(fields)


class Adapter:
    """Satisfies sglang_dynspec.adapters.Adapter; off-steps never leave a resume pending."""

    def __init__(self):
        self.off_calls = 0
        self.modes = []
        self.prefills_off = []  # rows of each extend batch offered to forward_prefill_off
        self.prefill_result = None  # what it returns (None: run upstream)

    def decode_batch_size(self, worker, batch):
        return None if batch.mode != "decode" else len(batch.reqs)

    def forward_off(self, worker, batch, mode, *a, **kw):
        self.off_calls += 1
        self.modes.append(mode)
        return Result(num_correct_drafts=0)

    def forward_prefill_off(self, worker, batch, *a, **kw):
        self.prefills_off.append(len(batch.reqs))
        return self.prefill_result

    def resume_pending(self, worker):
        return False

    def prepare(self, worker, settings):
        pass

    def describe(self, worker=None):
        return {"adapter": "test"}


@pytest.fixture
def state(monkeypatch):
    def make(policy, args=None):
        adapter = Adapter()
        sched = NS(running_batch=NS(reqs=[]), waiting_queue=[], tp_rank=0)
        worker = object()
        st = runtime.WorkerState(settings=None, controller=Controller(build_policy(policy, args or {})),
                                 scheduler=sched, worker=worker, path="v1", adapter=adapter)
        st.accepted_field = "num_correct_drafts"
        monkeypatch.setattr(runtime, "STATE", st)
        return st
    return make


def req(rid):
    return NS(rid=rid)


def batch(n, mode="decode", prefix="r"):
    fm = NS(is_decode=lambda: mode in ("decode", "declined"))
    return NS(mode=mode, forward_mode=fm, reqs=[req(f"{prefix}{i}") for i in range(n)], batch_size=lambda: n)


def original(worker, b, *a, **kw):
    return Result(num_correct_drafts=3 * len(b.reqs), spec=True)


def is_off(st, result):
    """Whether the runtime remembers ``result`` as an off-step's (without forgetting it)."""
    return st.off_results.get(id(result)) is result


def test_policy_decides_and_off_result_is_remembered(state):
    st = state("threshold", {"n": 2})
    on = runtime.around_v1_forward(original, st.worker, batch(2))
    off = runtime.around_v1_forward(original, st.worker, batch(5))
    assert getattr(on, "spec", False) and not is_off(st, on) and vars(on).keys() == {"num_correct_drafts", "spec"}
    assert is_off(st, off) and st.adapter.off_calls == 1 and st.adapter.modes == [StepMode.OFF]
    assert vars(off).keys() == {"num_correct_drafts"}  # nothing written on SGLang's object
    assert st.controller.stats["switches"] == 1


def test_off_results_are_forgotten_once_processed_or_dropped(state):
    st = state("never")
    off = runtime.around_v1_forward(original, st.worker, batch(2))
    unprocessed = runtime.around_v1_forward(original, st.worker, batch(2))
    assert len(st.off_results) == 2
    runtime.after_process_decode(None, None, batch(2), off)
    assert not is_off(st, off) and len(st.off_results) == 1 and st.controller.accept_samples == 0
    runtime.after_process_decode(None, None, batch(2), off)  # asked again: now counted as speculative
    assert st.controller.accept_samples == 1
    del unprocessed  # dropped by its last holder without reaching the result hook
    assert len(st.off_results) == 0


def test_extend_batches_go_to_sglang_untouched(state):
    st = state("never")
    res = runtime.around_v1_forward(original, st.worker, batch(3, mode="extend"))
    assert res.spec and st.controller.stats["decode_steps"] == 0


def test_prefills_while_off_go_to_the_adapter(state):
    st = state("threshold", {"n": 2})
    runtime.around_v1_forward(original, st.worker, batch(2))  # speculative step
    assert runtime.around_v1_forward(original, st.worker, batch(1, mode="extend")).spec
    assert st.adapter.prefills_off == []  # while on: upstream, not offered
    runtime.around_v1_forward(original, st.worker, batch(5))  # off-step
    assert runtime.around_v1_forward(original, st.worker, batch(3, mode="extend")).spec  # adapter declined
    light = Result(num_correct_drafts=0)
    st.adapter.prefill_result = light
    assert runtime.around_v1_forward(original, st.worker, batch(2, mode="extend")) is light
    assert st.adapter.prefills_off == [3, 2] and st.light_prefills == 1
    assert not is_off(st, light)  # a prefill's result is no decode result: nothing to skip
    assert st.snapshot()["light_prefills"] == 1
    # host time per prefill forward, by kind: 1 light, 2 upstream (the one while on, the declined one)
    assert st.prefill_calls == {"light": 1, "upstream": 2}
    took = st.snapshot()["prefill_forward_host_ms"]
    assert set(took) == {"light", "upstream"} and all(ms is not None and ms >= 0 for ms in took.values())


def test_other_workers_untouched(state):
    st = state("never")
    res = runtime.around_v1_forward(original, object(), batch(3))
    assert res.spec and st.adapter.off_calls == 0


def test_acceptance_only_from_speculative_results(state):
    st = state("always")
    b = batch(4)
    runtime.after_process_decode(None, None, b, NS(num_correct_drafts=6))
    off = Result(num_correct_drafts=0)
    st.off_results[id(off)] = off
    runtime.after_process_decode(None, None, b, off)
    runtime.after_process_decode(None, None, b, None)
    assert st.controller.accept_samples == 1
    assert st.controller.accept_length == pytest.approx(2.5)


def test_per_request_opt_out_forces_off(state):
    st = state("always")
    runtime.after_handle_generate(None, st.scheduler, NS(rid="r1", sampling_params=NS(custom_params={"dynspec": "off"})))
    runtime.after_handle_generate(None, st.scheduler, NS(rid="x9", sampling_params=NS(custom_params={"other": 1})))
    runtime.after_handle_generate(None, st.scheduler, NS(rid="x8", sampling_params=NS(custom_params=None)))
    assert st.optout_rids == {"r1"}
    assert is_off(st, runtime.around_v1_forward(original, st.worker, batch(3)))  # holds r1
    assert runtime.around_v1_forward(original, st.worker, batch(3, prefix="q")).spec  # r1 not in it
    assert st.controller.stats["steps_forced_off"] == 1


def test_opt_out_forgotten_once_gone_from_every_queue(state):
    st = state("always")
    for rid in ("r0", "w0", "never-ran"):
        runtime.after_handle_generate(None, st.scheduler, NS(rid=rid, sampling_params=NS(custom_params={"dynspec": False})))
    st.scheduler.waiting_queue = [req("w0")]  # still queued: must be kept
    runtime.around_v1_forward(original, st.worker, batch(2))  # r0 running; step 0 is a check
    assert st.optout_rids == {"r0", "w0", "never-ran"}  # first absence only marks "never-ran"
    st.controller.step = 512
    runtime.around_v1_forward(original, st.worker, batch(2, prefix="q"))  # r0 finished
    assert st.optout_rids == {"r0", "w0"}  # "never-ran" absent twice: dropped; r0 absent once
    st.controller.step = 1024
    runtime.around_v1_forward(original, st.worker, batch(2, prefix="q"))
    assert st.optout_rids == {"w0"}


def test_opt_out_that_cannot_be_honoured_is_counted(state):
    st = state("always")
    runtime.after_handle_generate(None, st.scheduler, NS(rid="r0", sampling_params=NS(custom_params={"dynspec": "off"})))
    runtime.around_v1_forward(original, st.worker, batch(2, mode="extend"))  # prefill: not speculation
    assert st.optout_not_honoured == 0
    runtime.around_v1_forward(original, st.worker, batch(2, mode="declined"))  # decode the adapter declines
    assert st.optout_not_honoured == 1


class LightAdapter(Adapter):
    """An adapter whose off-steps use the light draft sync (resume step before speculating)."""

    def __init__(self):
        super().__init__()
        self.pending, self.full_syncs = False, 0

    def forward_off(self, worker, batch, mode, *a, **kw):
        self.full_syncs += mode is StepMode.RESUME
        self.pending = mode is StepMode.OFF
        return super().forward_off(worker, batch, mode, *a, **kw)

    def resume_pending(self, worker):
        return self.pending


def test_light_off_steps_resume_before_speculating(monkeypatch):
    adapter = LightAdapter()
    worker = object()
    st = runtime.WorkerState(settings=None, controller=Controller(build_policy("threshold", {"n": 2})),
                             scheduler=NS(running_batch=NS(reqs=[]), waiting_queue=[], tp_rank=0),
                             worker=worker, path="spec_v2", adapter=adapter)
    monkeypatch.setattr(runtime, "STATE", st)
    first = runtime.around_v2_forward(original, worker, batch(2))  # on, nothing pending
    assert getattr(first, "spec", False)
    runtime.around_v2_forward(original, worker, batch(5))  # off: light
    runtime.around_v2_forward(original, worker, batch(5))  # off: light
    assert adapter.off_calls == 2 and adapter.full_syncs == 0 and adapter.pending
    resumed = runtime.around_v2_forward(original, worker, batch(2))  # on -> resume step instead
    assert is_off(st, resumed) and adapter.full_syncs == 1 and not adapter.pending
    assert adapter.modes == [StepMode.OFF, StepMode.OFF, StepMode.RESUME]
    assert getattr(runtime.around_v2_forward(original, worker, batch(2)), "spec", False)  # now speculates
    s = st.controller.stats
    assert s["steps_resume"] == 1 and s["steps_on"] == 3 and s["steps_off"] == 2


def test_the_plugins_own_cpu_time_is_counted_per_hook_and_per_decode_step(state):
    """The stats file says how much CPU dynspec's hooks take per decode step, SGLang's own work
    excluded: on the H200 a `dynspec:always` server ran 3.6 % slower steps than stock `on`
    (pair1j-aa-row2), and this is what separates the plugin's code from everything else."""
    import time

    st = state("always")

    def slow_original(worker, b, *a, **kw):
        time.sleep(0.02)  # SGLang's step: not dynspec's time
        return Result(num_correct_drafts=len(b.reqs), spec=True)

    for _ in range(3):
        res = runtime.around_v1_forward(slow_original, st.worker, batch(2))
        runtime.after_process_decode(None, None, batch(2), res)
    runtime.around_v1_forward(slow_original, st.worker, batch(2, mode="extend"))
    runtime.after_handle_generate(None, None, NS(rid="x", sampling_params=None))
    guard = NS(capture_forward_mode=NS(is_target_verify=lambda: True))
    assert runtime.around_graph_can_run(lambda *a: True, guard, NS(forward_mode=NS(is_decode=lambda: True))) is False
    assert runtime.around_prefill_graph_can_run(lambda *a: False, NS(), NS()) is False
    assert st.hook_calls == {"forward": 4, "result": 3, "graph_guard": 1, "generate": 1, "prefill_graph": 1,
                             "memcheck": 0, "store": 0}
    s = st.snapshot()
    assert 0 < sum(s["hook_cpu_s"].values()) < 0.02  # four sleeps of 20 ms are not in it
    assert s["hook_cpu_us_per_decode_step"] == pytest.approx(1e6 * sum(st.hook_cpu.values()) / 3, rel=1e-3)


def test_stats_report_the_prefill_figures_the_policy_uses(state):
    """The stats file's per-request prefill figures are the policy's own at the last decode step:
    speculation's at that batch size and acceptance (its steady state without a history)."""
    st = state("never")
    ctl = Controller(build_policy("never", {}), sync_interval=1)
    st.controller = ctl
    t = [0.0]
    ctl.clock = lambda: t[0]
    for i in range(40):
        if i % 10 == 5:
            ctl.on_other(1)  # one request, 20 ms
            t[0] += 0.020
        ctl.on_decode(8)
        t[0] += 0.004
    s = st.snapshot()
    v = ctl.view
    assert s["decode_bs"] == 8 and v.batch_size_history(True) is None
    assert s["prefill_per_request_off_s"] == v.prefill_per_request(False) > 0
    assert s["prefill_per_request_on_s"] == v.prefill_per_request(True, 8, ctl.accept_length) > 0


def test_the_batchs_sampling_regime_reaches_the_decision_and_its_result(state):
    st = state("always")
    seen = []
    decide = st.controller.policy.decide
    st.controller.policy.decide = lambda x: seen.append(x.accept_samples) or decide(x)

    def regime(b, top_k):
        for r in b.reqs:
            r.sampling_params = NS(top_k=top_k)  # SGLang makes temperature 0 top_k 1
        return b

    greedy, sampled = regime(batch(4), 1), regime(batch(4), 1 << 30)
    # result processing gets the batch's requests only (0.5.12's ScheduleBatch.copy has no sampling info)
    runtime.around_v1_forward(original, st.worker, sampled)
    runtime.after_process_decode(None, None, NS(reqs=sampled.reqs, batch_size=lambda: 4),
                                 NS(num_correct_drafts=4))  # 2.0
    runtime.around_v1_forward(original, st.worker, greedy)
    runtime.after_process_decode(None, None, NS(reqs=greedy.reqs, batch_size=lambda: 4),
                                 NS(num_correct_drafts=8))  # 3.0
    runtime.around_v1_forward(original, st.worker, sampled)
    assert seen == [0, 0, 1]  # the greedy batch had no acceptance of its own yet
    assert st.controller.accept_length == pytest.approx(2.0)
    assert st.snapshot()["accept_by_sampling"]["greedy"]["accept_length"] == pytest.approx(3.0)
