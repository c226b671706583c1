"""Off-steps as plain decode batches (adapters/plain_batch.py) on SGLang's own scheduler classes.

Real ``ScheduleBatch``, ``Req``, ``ReqToTokenPool``, ``TokenToKVPoolAllocator``, ``FutureMap`` and
``EagleDraftInput`` on the CPU, 0.5.12 (ring FutureMap) and 0.5.15 (FutureMap by req_pool_idx,
lengths published there); the GPU test (tests/gpu/test_spec_v2_gpu.py, ``dynspec:random``
switching every step) runs the same conversions inside a server.
"""

from __future__ import annotations

import pytest

from sglang_dynspec import compat, runtime
from sglang_dynspec.controller import StepMode

pytestmark = pytest.mark.sglang

torch = pytest.importorskip("torch")

PLAIN_RELEASE = compat.plain_batch_release_problem() is None
needs_plain_release = pytest.mark.skipif(not PLAIN_RELEASE, reason="plain batches are built on SGLang 0.5.12, 0.5.15")
# 0.5.15's FutureMap is keyed by req_pool_idx (stash / publish); 0.5.12's hands out ring slots.
POOL_MAP = PLAIN_RELEASE and compat.future_map_by_pool()
needs_ring_map = pytest.mark.skipif(not PLAIN_RELEASE or POOL_MAP, reason="the ring FutureMap of SGLang 0.5.12")
needs_pool_map = pytest.mark.skipif(not POOL_MAP, reason="the FutureMap by req_pool_idx of SGLang 0.5.15")

ALLOC_LEN = 3  # a topk-1 window of 3 draft tokens: the speculative prepare claims 2 x 3 ahead


@pytest.fixture
def sgl(monkeypatch):
    from sglang.srt.managers import overlap_utils
    from sglang.srt.managers import utils as mutils
    from sglang.srt.managers.overlap_utils import FutureMap
    from sglang.srt.managers.schedule_batch import Req, ScheduleBatch
    from sglang.srt.mem_cache.allocator import TokenToKVPoolAllocator
    from sglang.srt.mem_cache.memory_pool import ReqToTokenPool
    from sglang.srt.model_executor.forward_batch_info import ForwardMode
    from sglang.srt.sampling.sampling_params import SamplingParams
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

    from sglang.srt.managers import schedule_batch

    # The window length reads the global server args, which a CPU test has none of.
    if hasattr(mutils, "get_alloc_len_per_decode"):  # 0.5.12
        monkeypatch.setattr(mutils, "get_alloc_len_per_decode", lambda *a, **k: ALLOC_LEN)
    if hasattr(schedule_batch, "get_alloc_reserve_per_decode"):  # 0.5.15: the window claimed ahead
        monkeypatch.setattr(schedule_batch, "get_alloc_reserve_per_decode", lambda *a, **k: 2 * ALLOC_LEN)
    # EAGLE-3 (reads the global server args): 0.5.12's FutureMap imports it, 0.5.15's at first stash.
    if hasattr(overlap_utils, "spec_need_hidden_states"):
        monkeypatch.setattr(overlap_utils, "spec_need_hidden_states", lambda *a, **k: True)
    else:
        from sglang.srt.speculative import spec_utils

        monkeypatch.setattr(spec_utils, "spec_need_hidden_states", lambda *a, **k: True)
    return dict(FutureMap=FutureMap, Req=Req, ScheduleBatch=ScheduleBatch, Allocator=TokenToKVPoolAllocator,
                ReqToTokenPool=ReqToTokenPool, ForwardMode=ForwardMode, SamplingParams=SamplingParams,
                EAGLE3=SpeculativeAlgorithm.EAGLE3, NONE=SpeculativeAlgorithm.NONE)


def _speculative_batch(sgl, lengths, allocated):
    """A running batch after a speculative step: row i holds ``lengths[i]`` tokens and owns the
    slots of positions [0, allocated[i]) (its verify window), its next tokens in FutureMap slots."""
    pool = sgl["ReqToTokenPool"](size=8, max_context_len=64, device="cpu", enable_memory_saver=False)
    alloc = sgl["Allocator"](size=256, dtype=torch.float16, device="cpu", kvcache=None, need_sort=False)
    reqs = []
    for i, (n, a) in enumerate(zip(lengths, allocated)):
        req = sgl["Req"](f"r{i}", "", list(range(1, 4)), sgl["SamplingParams"]())
        req.req_pool_idx = pool.free_slots.pop(0)
        pool.req_to_token[req.req_pool_idx, :a] = alloc.alloc(a).to(torch.int32)
        req.kv_allocated_len = a
        req.kv_committed_len = n - 1  # one verify behind, as when the scheduler prepares the next step
        reqs.append(req)
    seq = torch.tensor(lengths, dtype=torch.int64)
    rpi = torch.tensor([r.req_pool_idx for r in reqs], dtype=torch.int64)
    fields = dict(
        reqs=reqs, req_to_token_pool=pool, token_to_kv_pool_allocator=alloc, tree_cache=None,
        forward_mode=sgl["ForwardMode"].DECODE, enable_overlap=True, spec_algorithm=sgl["EAGLE3"],
        req_pool_indices=rpi, seq_lens=seq, seq_lens_cpu=seq - 1, orig_seq_lens=(seq - 5).to(torch.int32),
        seq_lens_sum=0,
    )
    if POOL_MAP:
        fields["req_pool_indices_cpu"] = rpi.clone()
    else:
        fields["output_ids"] = -torch.arange(11, 11 + len(lengths), dtype=torch.int64)
    return sgl["ScheduleBatch"](**fields)


def _pool_future_map(sgl, batch):
    """0.5.15's FutureMap over the batch's request pool, its buffers sized by a prefill's stash of
    those rows (as in a server, before any decode step)."""
    from sglang.srt.managers.overlap_utils import RelayPayload

    fmap = sgl["FutureMap"](device="cpu", spec_algo=sgl["EAGLE3"], req_to_token_pool=batch.req_to_token_pool)
    n = len(batch.reqs)
    fmap.stash(batch.req_pool_indices, RelayPayload(
        bonus_tokens=torch.arange(5, 5 + n, dtype=torch.int32), topk_p=torch.ones(n, 1),
        topk_index=torch.zeros(n, 1, dtype=torch.int64), hidden_states=torch.zeros(n, 8)))
    return fmap


def _owned(batch, req):
    return set(batch.req_to_token_pool.req_to_token[req.req_pool_idx, :req.kv_allocated_len].tolist())


def _scheduler(sgl, future_map=None):
    return type("Sched", (), {"spec_algorithm": sgl["EAGLE3"], "forward_stream": None, "future_map": future_map,
                              "running_batch": None, "waiting_queue": []})()


def _is_speculative(batch) -> bool:
    return not batch.spec_algorithm.is_none() and batch.spec_info is not None


@needs_plain_release
def test_to_plain_frees_the_window_past_each_length_and_sets_the_plain_fields(sgl):
    from sglang_dynspec.adapters import plain_batch

    batch = _speculative_batch(sgl, lengths=[10, 7], allocated=[14, 13])
    sched = _scheduler(sgl)
    if POOL_MAP:
        # 0.5.15: the batch's own lengths lag one verify; the verify published the committed ones.
        sched.future_map = _pool_future_map(sgl, batch)
        sched.future_map.publish(batch.req_pool_indices, torch.tensor([10, 7]))
        batch.seq_lens = torch.tensor([8, 5])
    alloc = batch.token_to_kv_pool_allocator
    free_before = alloc.available_size()
    window = [set(batch.req_to_token_pool.req_to_token[r.req_pool_idx, n:r.kv_allocated_len].tolist())
              for r, n in zip(batch.reqs, (10, 7))]
    plain_batch.to_plain(batch, sched)

    assert alloc.available_size() == free_before + 4 + 6
    assert set(alloc.free_pages[-10:].tolist()) == window[0] | window[1]
    assert [r.kv_allocated_len for r in batch.reqs] == [10, 7]
    assert [r.kv_committed_len for r in batch.reqs] == [9, 6]  # caught up by the pending result
    assert batch.spec_algorithm.is_none() and batch.spec_info is None and not _is_speculative(batch)
    assert batch.seq_lens.tolist() == [10, 7] and batch.seq_lens.dtype == torch.int64
    assert batch.seq_lens_cpu.tolist() == [10, 7] and batch.seq_lens_sum == 17
    assert batch.orig_seq_lens.tolist() == [10, 7] and batch.orig_seq_lens.dtype == torch.int32
    # The scheduler's own memory check now asks for what a plain step allocates: nothing is
    # claimed ahead, so it fits in the slots just freed.
    assert batch.check_decode_mem()
    assert batch.new_tokens_required_next_decode() == 2


@needs_plain_release
def test_trim_window_keeps_a_rows_partial_page(sgl):
    from sglang_dynspec.adapters import plain_batch

    batch = _speculative_batch(sgl, lengths=[10], allocated=[16])
    freed = []
    batch.token_to_kv_pool_allocator.page_size = 4
    batch.token_to_kv_pool_allocator.free = lambda idx: freed.append(idx.tolist())
    slots = batch.req_to_token_pool.req_to_token[batch.reqs[0].req_pool_idx].tolist()
    assert plain_batch.trim_window(batch, [10]) == 4
    assert freed == [slots[12:16]]  # positions 10 and 11 share the page of position 9: kept
    assert batch.reqs[0].kv_allocated_len == 10


@needs_ring_map
def test_to_speculative_resolves_the_plain_steps_tokens_through_the_real_future_map(sgl):
    from sglang.srt.managers.utils import GenerationBatchResult
    from sglang.srt.speculative.eagle_info import EagleDraftInput

    from sglang_dynspec.adapters import plain_batch

    fmap = sgl["FutureMap"](max_running_requests=4, chunked_prefill_size=64, context_len=64, device="cpu",
                            spec_algo=sgl["EAGLE3"])
    # A prefill's store sizes the buffers (as in a server, before any decode step).
    first = fmap.alloc_future_indices(2)
    fmap.store_to_map(first, GenerationBatchResult(next_draft_input=EagleDraftInput(
        topk_p=torch.ones(2, 1), topk_index=torch.zeros(2, 1, dtype=torch.int64), hidden_states=torch.zeros(2, 8),
        bonus_tokens=torch.tensor([5, 6], dtype=torch.int32), new_seq_lens=torch.tensor([4, 4]))))
    # A plain step's result: tokens only, stored where the next step looks them up.
    step = fmap.alloc_future_indices(2)
    plain = GenerationBatchResult(next_token_ids=torch.tensor([41, 42]), next_draft_input=None)
    assert plain_batch.store(fmap, step, plain)
    assert fmap.bonus_tokens_buf[step.interval].tolist() == [41, 42]
    # A speculative result is left to SGLang's store.
    assert not plain_batch.store(fmap, first, GenerationBatchResult(next_draft_input=object()))

    batch = _speculative_batch(sgl, lengths=[10, 7], allocated=[14, 13])
    plain_batch.to_plain(batch, _scheduler(sgl))
    batch.output_ids = -step.indices  # what run_batch leaves on any batch of an overlap scheduler
    sched = type("Sched", (), {"spec_algorithm": sgl["EAGLE3"]})()
    plain_batch.to_speculative(batch, sched, EagleDraftInput)
    assert batch.is_spec_v2 and batch.spec_info.future_indices.indices.tolist() == step.indices.tolist()
    # The speculative memory check claims the window again: 2 x ALLOC_LEN ahead of each commit.
    assert batch.new_tokens_required_next_decode() == (9 + 6 - 10) + (6 + 6 - 7)

    # What FutureMap.resolve_future gathers for the resume step (its stream bookkeeping needs a GPU).
    assert fmap.bonus_tokens_buf[batch.spec_info.future_indices.indices].tolist() == [41, 42]
    # The real filter of a draft input that carries only FutureMap indices (a request finished).
    batch.spec_info.filter_batch(torch.tensor([1]), has_been_filtered=False)
    assert batch.spec_info.future_indices.indices.tolist() == [step.indices[1].item()]


@needs_pool_map
def test_to_speculative_publishes_the_plain_lengths_and_resolves_the_plain_steps_tokens(sgl):
    from sglang.srt.managers.overlap_utils import RelayPayload
    from sglang.srt.speculative.eagle_info import EagleDraftInput

    from sglang_dynspec.adapters import plain_batch

    batch = _speculative_batch(sgl, lengths=[10, 7], allocated=[14, 13])
    fmap = _pool_future_map(sgl, batch)
    fmap.publish(batch.req_pool_indices, batch.seq_lens)
    sched = _scheduler(sgl, fmap)
    plain_batch.to_plain(batch, sched)
    # A plain step's payload (what run_batch relays for a batch without a draft input): tokens only,
    # which the speculative FutureMap's own stash cannot take (no top-k or hidden-state rows).
    plain = RelayPayload(bonus_tokens=torch.tensor([41, 42]))
    with pytest.raises(AttributeError):
        type(fmap).stash(fmap, batch.req_pool_indices, plain)
    # Known values in the speculative rows (the buffer starts as uninitialised memory, NaN included).
    fmap.topk_p_buf.copy_(torch.arange(fmap.topk_p_buf.numel(), dtype=fmap.topk_p_buf.dtype).view_as(fmap.topk_p_buf))
    topk_before = fmap.topk_p_buf.clone()
    assert plain_batch.store(fmap, batch.req_pool_indices, plain)
    assert fmap.output_tokens_buf[batch.req_pool_indices].tolist() == [41, 42]
    assert torch.equal(fmap.topk_p_buf, topk_before)  # the speculative rows stay for the resume step
    speculative = RelayPayload(bonus_tokens=torch.tensor([1, 2]), topk_p=torch.ones(2, 1),
                               topk_index=torch.zeros(2, 1, dtype=torch.int64), hidden_states=torch.zeros(2, 8))
    assert not plain_batch.store(fmap, batch.req_pool_indices, speculative)  # left to SGLang's stash
    # The plain step counted its token (prepare) and the scheduler published one more after it.
    batch.seq_lens = torch.tensor([11, 8])
    fmap.publish(batch.req_pool_indices, batch.seq_lens + 1)

    plain_batch.to_speculative(batch, sched, EagleDraftInput)
    assert _is_speculative(batch) and batch.spec_info.future_indices.tolist() == batch.req_pool_indices.tolist()
    # What the next speculative step starts from: each row's KV length, its last token not yet written.
    fmap.resolve_seq_lens_cpu(batch)
    assert batch.seq_lens.tolist() == [11, 8] and batch.seq_lens_cpu.tolist() == [11, 8]
    # The speculative memory check claims the window again: 2 x ALLOC_LEN ahead of each commit.
    for r in batch.reqs:
        r.kv_committed_len = r.kv_allocated_len = 11 if r is batch.reqs[0] else 8
    assert batch.new_tokens_required_next_decode() == 2 * 2 * ALLOC_LEN
    # What the resume step's draft input gathers (FutureMap._resolve_spec_extras; a Triton kernel).
    assert fmap.output_tokens_buf[batch.spec_info.future_indices].tolist() == [41, 42]


def test_declines_what_the_speculative_off_step_declines():
    from types import SimpleNamespace as NS

    from sglang_dynspec.adapters import plain_batch

    assert plain_batch.declines(NS(return_logprob=False, has_grammar=False, return_hidden_states=False)) is None
    assert plain_batch.declines(NS(return_logprob=True)) == "logprobs"
    assert plain_batch.declines(NS(has_grammar=True)) == "grammar"
    assert plain_batch.declines(NS(return_hidden_states=True)) == "hidden states"
    assert plain_batch.declines(NS(global_num_tokens=[3])) == "DP attention"


@needs_plain_release
def test_the_memory_check_hook_decides_and_converts_the_running_batch(sgl, monkeypatch):
    from sglang.srt.speculative.eagle_info import EagleDraftInput  # noqa: F401 - the class converted to

    from sglang_dynspec.adapters import plain_batch

    batch = _speculative_batch(sgl, lengths=[10, 7], allocated=[14, 13])
    modes = iter([StepMode.OFF, StepMode.OFF, StepMode.RESUME])

    class Ctl:
        def step_mode(self, bs, running, waiting, force_off=False, resume_pending=False, greedy=None):
            self.bs, self.greedy = bs, greedy
            return next(modes)

    sched = _scheduler(sgl)
    sched.running_batch = batch
    if POOL_MAP:
        sched.future_map = _pool_future_map(sgl, batch)
        sched.future_map.publish(batch.req_pool_indices, batch.seq_lens)
    st = runtime.WorkerState(runtime.DynspecSettings(), Ctl(), sched, object(), "spec_v2",
                             type("A", (), {"resume_pending": staticmethod(lambda w: False)})())
    st.plain = True
    monkeypatch.setattr(runtime, "STATE", st)
    check = type(batch).check_decode_mem
    original = getattr(check, "__wrapped__", check)

    assert runtime.around_check_decode_mem(original, batch) is True
    assert st.planned is StepMode.OFF and plain_batch.is_plain(batch) and st.controller.bs == 2
    assert st.controller.greedy is False  # its requests sample (SamplingParams() is temperature 1)
    assert [r.kv_allocated_len for r in batch.reqs] == [10, 7]
    if not POOL_MAP:
        batch.output_ids = -torch.tensor([3, 4])  # the ring slots of the plain step's tokens
    assert runtime.around_check_decode_mem(original, batch) is True  # stays plain, nothing to convert
    assert plain_batch.is_plain(batch)
    assert runtime.around_check_decode_mem(original, batch) is True
    assert st.planned is StepMode.RESUME and _is_speculative(batch)
    indices = batch.spec_info.future_indices
    assert (indices.tolist() == batch.req_pool_indices.tolist() if POOL_MAP else indices.indices.tolist() == [3, 4])
    # Not the running batch (a retraction's own check, a prefill): SGLang's check alone.
    other = _speculative_batch(sgl, lengths=[5], allocated=[9])
    assert runtime.around_check_decode_mem(original, other) is True and not plain_batch.is_plain(other)
    assert runtime.around_check_decode_mem(original, batch, selected_indices=[0]) is True
    assert st.hook_calls["memcheck"] == 3


class _Adapter:
    """The worker side stands in here (its forward needs a GPU; tests/sglang/test_adapter_spec_v2.py
    runs forward_plain on recorders, tests/gpu in a server)."""

    def __init__(self):
        self.calls = []

    def forward_plain(self, worker, batch, future_map):
        self.calls.append(("plain", future_map))
        return _Result(next_token_ids=torch.tensor([1]), next_draft_input=None)

    def forward_off(self, worker, batch, mode, *a, **k):
        self.calls.append(("off", mode))
        return _Result(next_draft_input=object())

    def resume_pending(self, worker):
        return False


class _Result:
    def __init__(self, **fields):
        self.__dict__.update(fields)


def _plain_state(monkeypatch, sgl, fmap=None):
    adapter = _Adapter()
    sched = type("Sched", (), {"running_batch": None, "waiting_queue": [], "future_map": fmap})()
    worker = object()
    st = runtime.WorkerState(runtime.DynspecSettings(), None, sched, worker, "spec_v2", adapter)
    st.plain = True
    monkeypatch.setattr(runtime, "STATE", st)
    return st, worker, adapter


@needs_plain_release
def test_the_forward_runs_what_the_memory_check_decided(sgl, monkeypatch):
    from types import SimpleNamespace as NS

    st, worker, adapter = _plain_state(monkeypatch, sgl, fmap="the future map")
    upstream = []

    def original(w, b, *a, **k):
        upstream.append(b)
        return _Result(next_draft_input=object())

    decode = sgl["ForwardMode"].DECODE
    plain = NS(forward_mode=decode, spec_info=None, spec_algorithm=sgl["NONE"])
    spec = NS(forward_mode=decode, spec_info=object(), spec_algorithm=sgl["EAGLE3"])
    res = runtime.around_v2_forward(original, worker, plain)
    assert adapter.calls == [("plain", "the future map")] and st.plain_steps == 1
    assert st.took_off_result(res)
    st.planned = StepMode.RESUME
    runtime.around_v2_forward(original, worker, spec)
    assert adapter.calls[-1] == ("off", StepMode.RESUME) and st.planned is None
    st.planned = StepMode.ON
    runtime.around_v2_forward(original, worker, spec)
    runtime.around_v2_forward(original, worker, spec)  # declined at the check: nothing planned
    assert upstream == [spec, spec] and len(adapter.calls) == 2


@needs_ring_map
def test_plain_results_count_in_the_decode_log_and_their_tokens_reach_the_future_map(sgl, monkeypatch):
    from sglang.srt.managers.utils import GenerationBatchResult
    from sglang.srt.observability.scheduler_metrics_mixin import SchedulerMetricsMixin
    from sglang.srt.speculative.eagle_info import EagleDraftInput

    fmap = sgl["FutureMap"](max_running_requests=4, chunked_prefill_size=64, context_len=64, device="cpu",
                            spec_algo=sgl["EAGLE3"])
    st, worker, adapter = _plain_state(monkeypatch, sgl, fmap)
    stored = []
    first = fmap.alloc_future_indices(1)
    speculative = GenerationBatchResult(next_draft_input=EagleDraftInput(
        topk_p=torch.ones(1, 1), topk_index=torch.zeros(1, 1, dtype=torch.int64), hidden_states=torch.zeros(1, 8),
        bonus_tokens=torch.tensor([5], dtype=torch.int32), new_seq_lens=torch.tensor([4])))
    real_store = type(fmap).store_to_map
    real_store = getattr(real_store, "__wrapped__", real_store)
    runtime.around_future_store(lambda *a: stored.append(a) or real_store(*a), fmap, first, speculative)
    assert len(stored) == 1 and fmap.buf_initialized  # SGLang's own store
    plain = runtime.around_v2_forward(None, worker, type("B", (), {
        "forward_mode": sgl["ForwardMode"].DECODE, "spec_info": None, "spec_algorithm": sgl["NONE"]})())
    step = fmap.alloc_future_indices(1)
    runtime.around_future_store(lambda *a: stored.append(a), fmap, step, plain)
    assert len(stored) == 1 and fmap.bonus_tokens_buf[step.interval].tolist() == [1]

    # The scheduler's own counter update, called for the plain batch (the log divides by it).
    proc = type("Proc", (), {"spec_num_accept_tokens": 0, "spec_num_forward_ct": 0, "num_generated_tokens": 0,
                             "update_spec_metrics": SchedulerMetricsMixin.update_spec_metrics})()
    batch = _speculative_batch(sgl, lengths=[10, 7], allocated=[10, 7])
    batch.spec_algorithm = sgl["NONE"]
    runtime.after_process_decode(None, proc, batch, plain)
    assert (proc.spec_num_forward_ct, proc.spec_num_accept_tokens, proc.num_generated_tokens) == (2, 2, 0)
    runtime.after_process_decode(None, proc, batch, plain)  # once per result
    assert proc.spec_num_forward_ct == 2


@needs_pool_map
def test_plain_results_count_in_the_decode_log_and_their_tokens_reach_the_pool_future_map(sgl, monkeypatch):
    from sglang.srt.managers.overlap_utils import RelayPayload
    from sglang.srt.managers.scheduler_components.metrics_reporter import SchedulerMetricsReporter

    batch = _speculative_batch(sgl, lengths=[10, 7], allocated=[10, 7])
    fmap = _pool_future_map(sgl, batch)
    st, worker, adapter = _plain_state(monkeypatch, sgl, fmap)
    stored = []
    real_stash = type(fmap).stash
    real_stash = getattr(real_stash, "__wrapped__", real_stash)
    speculative = RelayPayload(bonus_tokens=torch.tensor([7, 8]), topk_p=torch.ones(2, 1),
                               topk_index=torch.zeros(2, 1, dtype=torch.int64), hidden_states=torch.zeros(2, 8))
    runtime.around_future_store(lambda *a: stored.append(a) or real_stash(*a), fmap, batch.req_pool_indices,
                                speculative)
    assert len(stored) == 1 and fmap.output_tokens_buf[batch.req_pool_indices].tolist() == [7, 8]  # SGLang's own
    plain = runtime.around_v2_forward(None, worker, type("B", (), {
        "forward_mode": sgl["ForwardMode"].DECODE, "spec_info": None, "spec_algorithm": sgl["NONE"]})())
    # What run_batch relays for a result without a draft input.
    payload = RelayPayload(bonus_tokens=plain.next_token_ids)
    runtime.around_future_store(lambda *a: stored.append(a), fmap, batch.req_pool_indices[:1], payload)
    assert len(stored) == 1 and fmap.output_tokens_buf[batch.req_pool_indices].tolist() == [1, 8]

    # The scheduler's own counter update (on its metrics reporter), called for the plain batch.
    reporter = type("Rep", (), {"spec_num_accept_tokens": 0, "spec_num_forward_ct": 0, "num_generated_tokens": 0,
                                "update_spec_metrics": SchedulerMetricsReporter.update_spec_metrics})()
    proc = type("Proc", (), {"metrics_reporter": reporter})()
    batch.spec_algorithm = sgl["NONE"]
    runtime.after_process_decode(None, proc, batch, plain)
    assert (reporter.spec_num_forward_ct, reporter.spec_num_accept_tokens, reporter.num_generated_tokens) == (2, 2, 0)
    runtime.after_process_decode(None, proc, batch, plain)  # once per result
    assert reporter.spec_num_forward_ct == 2
