"""The v1 (EAGLEWorker) adapter against the installed SGLang's real classes, on CPU.

What runs on the GPU (the forwards, the triton kernels) is covered by tests/gpu/test_v1_gpu.py;
here: the objects the adapter builds are valid instances of the installed dataclasses, every
SGLang callable it uses accepts the arguments it passes, the pure-Python decisions, and
forward_off's named steps with doubles for the model calls.
"""

import dataclasses
import inspect
from types import SimpleNamespace

import pytest

from sglang_dynspec import compat
from sglang_dynspec.adapters import draft_kv, state
from sglang_dynspec.config import DynspecSettings
from sglang_dynspec.controller import StepMode

pytestmark = pytest.mark.sglang

torch = pytest.importorskip("torch")


def _has_v1():
    try:
        from sglang.srt.speculative import eagle_worker

        return hasattr(eagle_worker, "EAGLEWorker")
    except ImportError:
        return False


requires_v1 = pytest.mark.skipif(not _has_v1(), reason="installed SGLang has no v1 EAGLEWorker")


@pytest.fixture(scope="module")
def v1():
    from sglang_dynspec.adapters import v1 as mod

    return mod


def _bind(fn, *args, **kwargs):
    inspect.signature(fn).bind(*args, **kwargs)  # raises TypeError on a mismatch


def _extend_rows(v1, n=3, hidden=24):
    return compat.build_draft_extend_input(
        hidden_states=torch.randn(n, hidden),
        tokens=torch.arange(10, 10 + n, dtype=torch.int32),
        seq_lens=torch.arange(5, 5 + n, dtype=torch.int64),
        seq_lens_cpu=torch.arange(5, 5 + n, dtype=torch.int64),
        req_pool_indices=torch.arange(n, dtype=torch.int64),
    )


@requires_v1
def test_draft_extend_input_is_a_real_instance_with_one_token_per_request(v1):
    from sglang.srt.speculative import eagle_info

    de = _extend_rows(v1)
    layout = compat.draft_extend_layout()
    if layout == "extend_input":
        assert type(de) is eagle_info.EagleDraftExtendInput
        assert de.num_correct_drafts.tolist() == [0, 0, 0]
        assert de.num_accept_tokens.tolist() == [1, 1, 1]
        assert de.num_accept_tokens_cpu == [1, 1, 1]
        assert de.input_ids.tolist() == [10, 11, 12]
        assert de.num_accept_tokens.dtype == torch.int32
    else:
        assert type(de) is eagle_info.EagleDraftInput
        assert de.verified_id.tolist() == [10, 11, 12]
        assert de.seq_lens_for_draft_extend.tolist() == [5, 6, 7]
        if layout == "num_accepted":
            assert de.num_accepted_drafts_cpu == [0, 0, 0]
            assert de.num_accepted_tokens_cpu == [1, 1, 1]
        else:
            # prepare_extend_after_decode adds the bonus token itself.
            assert de.accept_length.tolist() == [0, 0, 0]
            assert de.accept_length_cpu == [0, 0, 0]
    # Every field we set is a declared field of the installed dataclass.
    names = {f.name for f in dataclasses.fields(type(de))}
    assert {"hidden_states"} <= names


@requires_v1
def test_draft_extend_input_matches_what_verify_builds(v1):
    """The keyword names we pass are the ones the installed verify() passes."""
    from sglang.srt.speculative import eagle_info

    src = inspect.getsource(eagle_info.EagleVerifyInput.verify)
    layout = compat.draft_extend_layout()
    expected = {
        "extend_input": ["num_correct_drafts=", "num_accept_tokens=", "num_accept_tokens_cpu=", "input_ids="],
        "num_accepted": ["num_accepted_drafts=", "num_accepted_tokens=", "seq_lens_for_draft_extend="],
        "accept_length": ["accept_length=", "accept_length_cpu=", "seq_lens_for_draft_extend="],
    }[layout]
    for kw in expected:
        assert kw in src, f"{kw} not used by the installed EagleVerifyInput.verify"


def test_result_fields_build_a_valid_generation_batch_result(v1):
    from sglang.srt.managers.utils import GenerationBatchResult

    kw = compat.result_kwargs(GenerationBatchResult, bs=4)
    assert len(kw) == 2, kw
    count = [k for k in kw if not k.endswith("_cpu")][0]
    per_req = [k for k in kw if k.endswith("_cpu")][0]
    assert kw[count] == 0 and kw[per_req] == [0, 0, 0, 0]
    r = GenerationBatchResult(
        logits_output=None, next_token_ids=torch.tensor([1, 2, 3, 4]), can_run_cuda_graph=False, **kw
    )
    assert getattr(r, count) == 0
    # The scheduler's v1 path reads the count as an int (update_spec_metrics).
    assert isinstance(getattr(r, count), int)


@requires_v1
def test_signatures_of_everything_called(v1):
    from sglang.srt.managers.schedule_batch import Req, ScheduleBatch
    from sglang.srt.managers.tp_worker import TpModelWorker
    from sglang.srt.mem_cache.common import alloc_for_decode
    from sglang.srt.model_executor.cuda_graph_runner import CudaGraphRunner
    from sglang.srt.sampling.penaltylib.orchestrator import BatchedPenalizerOrchestrator
    from sglang.srt.speculative import eagle_worker as ew

    x = object()
    _bind(alloc_for_decode, x, token_per_req=1)
    _bind(TpModelWorker.forward_batch_generation, x, x)
    _bind(ew.EAGLEWorker.forward_draft_extend_after_decode, x, x)
    _bind(ew.EAGLEWorker._draft_preprocess_idle, x, x)
    _bind(ScheduleBatch.get_model_worker_batch, x)
    _bind(Req.check_finished, x)
    if hasattr(Req, "update_reasoning_tokens"):
        _bind(Req.update_reasoning_tokens, x, 1, 2)
    _bind(BatchedPenalizerOrchestrator.cumulate_output_tokens, x, x)
    _bind(CudaGraphRunner.can_run, x, x)
    # Context managers the adapter enters around the draft forward.
    assert callable(ew.EAGLEWorker.__init__)
    for name in ("speculative_moe_backend_context", "speculative_moe_a2a_backend_context"):
        if hasattr(ew, name):
            _bind(getattr(ew, name))
    assert "draft_tp_context" in inspect.getsource(ew.EAGLEWorker.__init__)


@requires_v1
def test_fields_the_adapter_touches_exist():
    from sglang.srt.layers.logits_processor import LogitsProcessorOutput
    from sglang.srt.managers.schedule_batch import ModelWorkerBatch, Req, ScheduleBatch

    sb = {f.name for f in dataclasses.fields(ScheduleBatch)}
    for name in (
        "reqs", "forward_mode", "spec_info", "seq_lens", "seq_lens_cpu", "seq_lens_sum", "out_cache_loc",
        "input_ids", "req_pool_indices", "return_logprob", "model_config", "sampling_info",
    ):
        assert name in sb, name
    assert "capture_hidden_mode" in {f.name for f in dataclasses.fields(ModelWorkerBatch)}
    lo = {f.name for f in dataclasses.fields(LogitsProcessorOutput)}
    for name in (
        "hidden_states", "next_token_logprobs", "next_token_top_logprobs_val", "next_token_top_logprobs_idx",
        "next_token_token_ids_logprobs_val", "next_token_token_ids_logprobs_idx",
    ):
        assert name in lo, name
    init = inspect.getsource(Req.__init__)
    for attr in (
        "kv_committed_len", "kv_allocated_len", "spec_verify_ct", "output_token_logprobs_val",
        "output_top_logprobs_val", "output_token_ids_logprobs_val",
    ):
        assert f"self.{attr}" in init, attr


@requires_v1
def test_last_token_ids_reads_the_installed_draft_input(v1):
    from sglang.srt.speculative.eagle_info import EagleDraftInput

    names = {f.name for f in dataclasses.fields(EagleDraftInput)}
    field = "bonus_tokens" if "bonus_tokens" in names else "verified_id"
    di = EagleDraftInput(**{field: torch.tensor([7, 8], dtype=torch.int32)})
    assert compat.last_token_ids(di).tolist() == [7, 8]


# --- graph guard -----------------------------------------------------------------


def _fm():
    from sglang.srt.model_executor.forward_batch_info import ForwardMode

    return ForwardMode


def test_describe_names_the_shared_graph_guard(v1):
    assert v1.describe()["graph_guard"] == compat.graph_guard_target()


# --- decode_batch_size -----------------------------------------------------------


def _worker(dp=False, algo="EAGLE3", hybrid=False):
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

    mr = SimpleNamespace(hybrid_gdn_config=object() if hybrid else None, mamba2_config=None)
    return SimpleNamespace(
        speculative_algorithm=SpeculativeAlgorithm.from_string(algo),
        server_args=SimpleNamespace(enable_dp_attention=dp),
        target_worker=SimpleNamespace(model_runner=mr),
    )


def _batch(mode, n=3, spec_info="ready"):
    from sglang.srt.speculative.eagle_info import EagleDraftInput

    names = {f.name for f in dataclasses.fields(EagleDraftInput)}
    field = "bonus_tokens" if "bonus_tokens" in names else "verified_id"
    si = None
    if spec_info == "ready":
        si = EagleDraftInput(topk_p=torch.zeros(n, 4), **{field: torch.zeros(n, dtype=torch.int32)})
    return SimpleNamespace(
        forward_mode=mode, is_extend_in_batch=False, is_spec_v2=False, spec_info=si, reqs=[object()] * n
    )


@requires_v1
def test_decode_batch_size(v1):
    FM = _fm()
    assert v1.decode_batch_size(_worker(), _batch(FM.DECODE, 5)) == 5
    assert v1.decode_batch_size(_worker(algo="EAGLE"), _batch(FM.DECODE, 2)) == 2
    for mode in (FM.EXTEND, FM.IDLE, FM.MIXED, FM.TARGET_VERIFY):
        assert v1.decode_batch_size(_worker(), _batch(mode)) is None
    mixed = _batch(FM.DECODE)
    mixed.is_extend_in_batch = True
    assert v1.decode_batch_size(_worker(), mixed) is None
    assert v1.decode_batch_size(_worker(dp=True), _batch(FM.DECODE)) is None
    assert v1.decode_batch_size(_worker(hybrid=True), _batch(FM.DECODE)) is None
    assert v1.decode_batch_size(_worker(), _batch(FM.DECODE, spec_info=None)) is None
    assert v1.decode_batch_size(_worker(), _batch(FM.DECODE, n=0)) is None


def test_describe_is_plain_data(v1):
    import json

    d = v1.describe()
    json.dumps(d)
    assert d["adapter"] == "v1" and "error" not in d, d


# --- off-step graphs -----------------------------------------------------------------


@requires_v1
def test_prepare_captures_decode_graphs_where_the_release_allows(v1, monkeypatch):
    from sglang_dynspec.adapters import offstep_graphs

    captured = []
    monkeypatch.setattr(offstep_graphs, "capture",
                        lambda mr, need_hidden: captured.append((mr, need_hidden)) or {"runner": "stub", "gib": 0.1})
    w = _worker()
    w.server_args.disable_cuda_graph = False
    v1.prepare(w, DynspecSettings(offstep_graphs=True))
    v1.prepare(w, DynspecSettings(offstep_graphs=True))  # once per worker
    supported = compat.offstep_graphs_release_problem() is None
    assert captured == ([(w.target_worker.model_runner, True)] if supported else [])
    assert v1.describe(w)["offstep_graphs"]["active"] is supported
    # The off-step asks for the graph runner's own hidden mode, so the graph can replay.
    from sglang.srt.model_executor.forward_batch_info import CaptureHiddenMode

    runner = SimpleNamespace(capture_hidden_mode=CaptureHiddenMode.FULL)
    assert offstep_graphs.hidden_mode({"runner": runner}, True, eager_mode="LAST") == CaptureHiddenMode.FULL
    assert offstep_graphs.hidden_mode(None, True, eager_mode="LAST") == CaptureHiddenMode.LAST
    assert offstep_graphs.hidden_mode(None, False) == CaptureHiddenMode.NULL


@requires_v1
def test_prepare_respects_the_setting_and_server_flags(v1, monkeypatch):
    from sglang_dynspec.adapters import offstep_graphs

    monkeypatch.setattr(offstep_graphs, "capture", lambda mr, need_hidden: pytest.fail("must not capture"))
    w = _worker()
    w.server_args.disable_cuda_graph = False
    v1.prepare(w, DynspecSettings(offstep_graphs=False))
    assert v1.describe(w)["offstep_graphs"]["active"] is False
    w = _worker()
    w.server_args.disable_cuda_graph = True
    v1.prepare(w, DynspecSettings(offstep_graphs=True))
    assert v1.describe(w)["offstep_graphs"]["active"] is False


@requires_v1
def test_light_draft_input_survives_the_schedulers_filter_and_merge(v1):
    """After a light off-step, spec_info holds placeholder rows; the real EagleDraftInput's
    filter_batch / merge_batch (requests finishing, a prefill joining) must handle them."""
    from sglang.srt.speculative.eagle_info import EagleDraftInput

    from sglang_dynspec.adapters import draft_kv

    ph = draft_kv.Placeholders()

    def light(tokens):
        rows = ph.get(len(tokens), 4, 8, torch.bfloat16, "cpu")
        return compat.build_draft_input(torch.tensor(tokens, dtype=torch.int32),
                                        **{k: v.contiguous() for k, v in rows.items()})

    a = light([5, 6, 7])
    assert isinstance(a, EagleDraftInput) and compat.last_token_ids(a).tolist() == [5, 6, 7]
    assert a.topk_p.shape == (3, 4) and a.topk_index.dtype == torch.int64 and a.hidden_states.shape == (3, 8)
    a.filter_batch(torch.tensor([0, 2]), has_been_filtered=False)  # e.g. an abort
    assert compat.last_token_ids(a).tolist() == [5, 7] and a.topk_p.shape == (2, 4)
    real = compat.build_draft_input(torch.tensor([9], dtype=torch.int32), topk_p=torch.rand(1, 4),
                                    topk_index=torch.ones(1, 4, dtype=torch.int64),
                                    hidden_states=torch.rand(1, 8, dtype=torch.bfloat16))
    a.merge_batch(real)
    assert compat.last_token_ids(a).tolist() == [5, 7, 9] and a.hidden_states.shape == (3, 8)
    assert torch.equal(a.topk_index[2], torch.ones(4, dtype=torch.int64))
    # v1's off-step accepts a batch in this state (resume step).
    assert v1.decode_batch_size(_worker(), NS_batch(a)) == 3


def NS_batch(spec_info):
    FM = _fm()
    return SimpleNamespace(forward_mode=FM.DECODE, is_extend_in_batch=False, is_spec_v2=False, spec_info=spec_info,
                           reqs=[object()] * int(compat.last_token_ids(spec_info).shape[0]))


# --- forward_off's named steps, one by one, then in order -------------------------------------
# Small doubles for what needs a GPU or a live memory pool (the target forward, alloc_for_decode,
# the draft-extend forward, requests); the release's real draft inputs and result class.


NS = SimpleNamespace


class Req:
    """What the off-step touches on a request; finishes when it emits ``stop``."""

    def __init__(self, stop=None, grammar=None):
        self.output_ids, self.stop, self.grammar, self._finished = [], stop, grammar, False
        self.kv_committed_len = self.kv_allocated_len = self.decode_batch_idx = self.spec_verify_ct = 0
        self.return_logprob = False

    def check_finished(self):
        self._finished = self._finished or self.output_ids[-1] == self.stop

    def finished(self):
        return self._finished


class Grammar:
    def __init__(self):
        self.accepted = []

    def accept_token(self, tok):
        self.accepted.append(tok)


class Orchestrator:
    def __init__(self, required):
        self.is_required, self.seen = required, []

    def cumulate_output_tokens(self, ids):
        self.seen.append(ids.clone())


def _draft_input(tokens):
    from sglang.srt.speculative.eagle_info import EagleDraftInput

    names = compat.dataclass_field_names(EagleDraftInput)
    field = "bonus_tokens" if "bonus_tokens" in names else "verified_id"
    n = len(tokens)
    return EagleDraftInput(topk_p=torch.rand(n, 1), **{field: torch.tensor(tokens, dtype=torch.int32)})


def _off_batch(reqs, tokens=(3, 4, 5), seq_lens=(10, 20, 30), calls=None):
    calls = calls if calls is not None else []
    seq = torch.tensor(seq_lens, dtype=torch.int64)
    b = NS(
        reqs=reqs,
        spec_info=_draft_input(list(tokens)),
        sampling_info=NS(penalizer_orchestrator=Orchestrator(False)),
        seq_lens=seq,
        seq_lens_cpu=seq.clone(),
        seq_lens_sum=0,
        orig_seq_lens=None,
        req_pool_indices=torch.arange(len(reqs), dtype=torch.int64) + 4,
        out_cache_loc=None,
        input_ids=None,
        forward_mode=None,
        return_logprob=False,
        model_config=NS(think_end_id=None),
    )

    def get_model_worker_batch():
        calls.append(("mwb", b.forward_mode, b.spec_info))
        return NS(seq_lens=b.seq_lens.clone(), input_ids=b.input_ids, capture_hidden_mode=None)

    b.get_model_worker_batch = get_model_worker_batch
    return b


@pytest.fixture
def alloc(monkeypatch):
    """alloc_for_decode without a memory pool: slot 100 + seq_lens per request, recorded."""
    from sglang.srt.mem_cache import common

    seen = []

    def fake(batch, token_per_req):
        seen.append((batch.seq_lens.clone(), token_per_req))
        return batch.seq_lens + 100

    monkeypatch.setattr(common, "alloc_for_decode", fake)
    return seen


class Target:
    def __init__(self, new_tokens, hidden=6, calls=None):
        self.new_tokens, self.hidden, self.calls = new_tokens, hidden, calls if calls is not None else []
        self.model_runner = NS()
        self.mwbs = []

    def forward_batch_generation(self, mwb):
        from sglang.srt.layers.logits_processor import LogitsProcessorOutput
        from sglang.srt.managers.utils import GenerationBatchResult

        self.calls.append("target")
        self.mwbs.append(mwb)
        n = len(self.new_tokens)
        lo = LogitsProcessorOutput(next_token_logits=torch.zeros(n, 11),
                                   hidden_states=torch.arange(n * self.hidden, dtype=torch.float32).view(n, -1))
        return GenerationBatchResult(logits_output=lo, next_token_ids=torch.tensor(self.new_tokens),
                                     can_run_cuda_graph=False)


def _off_worker(new_tokens, calls=None, returns_input=False):
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

    calls = calls if calls is not None else []
    w = NS(speculative_algorithm=SpeculativeAlgorithm.from_string("EAGLE3"),
           target_worker=Target(new_tokens, calls=calls),
           draft_model_runner=NS(tp_group=None), extends=[], idles=[])

    def forward_draft_extend_after_decode(batch):
        calls.append("draft_extend")
        w.extends.append(NS(spec_info=batch.spec_info, out_cache_loc=batch.out_cache_loc.clone(),
                            forward_mode=batch.forward_mode))
        return "next draft input" if returns_input else None

    w.forward_draft_extend_after_decode = forward_draft_extend_after_decode
    w._draft_preprocess_idle = lambda batch: (calls.append("idle"), w.idles.append(batch))
    return w


def _light(w):
    state.of(w).light = draft_kv.LightSync(topk=1, draft_hidden=6, draft_dtype=torch.bfloat16)


# --- the steps one by one ---------------------------------------------------------------


def test_cumulate_penalties_only_when_required(v1):
    b = _off_batch([Req()] * 3)
    last = compat.last_token_ids(b.spec_info)
    v1._cumulate_penalties(b, last)
    assert b.sampling_info.penalizer_orchestrator.seen == []
    b.sampling_info.penalizer_orchestrator = Orchestrator(True)
    v1._cumulate_penalties(b, last)
    (ids,) = b.sampling_info.penalizer_orchestrator.seen
    assert ids.tolist() == [3, 4, 5] and ids.dtype == torch.int64


@requires_v1
def test_alloc_slots_advances_like_a_plain_decode(v1, alloc):
    reqs = [Req(), Req(), Req()]
    b = _off_batch(reqs)
    b.orig_seq_lens = torch.tensor([9, 19, 29])
    loc = v1._alloc_slots(b, compat.last_token_ids(b.spec_info))
    ((seen_lens, per_req),) = alloc
    assert seen_lens.tolist() == [10, 20, 30] and per_req == 1  # slots of the old lengths
    assert loc.tolist() == [110, 120, 130] and b.out_cache_loc is loc
    assert b.input_ids.tolist() == [3, 4, 5] and b.input_ids.dtype == torch.int64
    assert b.seq_lens.tolist() == [11, 21, 31] and b.seq_lens_cpu.tolist() == [11, 21, 31]
    assert b.orig_seq_lens.tolist() == [10, 20, 30] and b.seq_lens_sum == 63
    assert [(r.kv_committed_len, r.kv_allocated_len, r.decode_batch_idx) for r in reqs] == [(1, 1, 1)] * 3


@requires_v1
def test_target_decode_is_a_plain_decode_with_hidden_capture(v1):
    from sglang.srt.model_executor.forward_batch_info import CaptureHiddenMode, ForwardMode

    calls = []
    w, b = _off_worker([7, 8, 9], calls), _off_batch([Req()] * 3, calls=calls)
    out = v1._target_decode(w, b, None)
    assert calls == [("mwb", ForwardMode.DECODE, None), "target"]
    assert w.target_worker.mwbs[0].capture_hidden_mode == CaptureHiddenMode.LAST  # eager
    assert out.next_token_ids.tolist() == [7, 8, 9]
    runner = NS(capture_hidden_mode=CaptureHiddenMode.FULL)
    graphs = {"runner": runner, "runner_attr": "graph_runner", "attn_backend": "off-step backend"}
    w.target_worker.model_runner = NS(attn_backend="live", graph_runner="verify graphs")
    v1._target_decode(w, b, graphs)
    assert w.target_worker.mwbs[1].capture_hidden_mode == CaptureHiddenMode.FULL  # the graphs' own mode
    assert w.target_worker.model_runner.attn_backend == "live"  # swapped back


def test_commit_tokens_does_the_verify_bookkeeping(v1):
    grammar = Grammar()
    reqs = [Req(), Req(stop=8), Req(grammar=grammar)]
    b = _off_batch(reqs)
    unfinished = v1._commit_tokens(b, torch.tensor([7, 8, 9]), None)
    assert unfinished == [0, 2]
    assert [r.output_ids for r in reqs] == [[7], [8], [9]]
    assert grammar.accepted == [9] and [r.spec_verify_ct for r in reqs] == [1, 1, 1]


def test_keep_index(v1):
    b = _off_batch([Req()] * 3)
    assert v1._keep_index([], b) is None
    assert v1._keep_index([0, 1, 2], b) is None
    keep = v1._keep_index([0, 2], b)
    assert keep.tolist() == [0, 2] and keep.dtype == torch.int64
    assert v1._rows(torch.tensor([5, 6, 7]), keep).tolist() == [5, 7]
    assert v1._rows(None, keep) is None


@requires_v1
def test_sync_draft_full_extends_the_unfinished_rows(v1):
    from sglang.srt.model_executor.forward_batch_info import ForwardMode

    w, b = _off_worker([7, 8, 9], returns_input=True), _off_batch([Req()] * 3)
    b.seq_lens = torch.tensor([11, 21, 31])
    b.seq_lens_cpu = b.seq_lens.clone()
    st = state.of(w)
    st.light_pending = True
    keep = v1._keep_index([0, 2], b)
    hidden = torch.arange(18, dtype=torch.float32).view(3, 6)
    v1._sync_draft_full(w, b, st, keep, [0, 2], torch.tensor([7, 8, 9]), hidden, torch.tensor([110, 120, 130]))
    (ext,) = w.extends
    assert ext.out_cache_loc.tolist() == [110, 130] and ext.forward_mode == ForwardMode.DECODE
    assert torch.equal(ext.spec_info.hidden_states, hidden[[0, 2]])
    assert b.spec_info == "next draft input"  # 0.5.12 returns it; older releases mutate in place
    assert not st.light_pending


@requires_v1
def test_sync_draft_full_refuses_a_stale_graph_buffer(v1):
    w, b = _off_worker([7]), _off_batch([Req()], tokens=(3,), seq_lens=(10,))
    w.cuda_graph_runner_for_draft_extend = NS(buffers=NS(hidden_states=torch.zeros(4, 5)), hidden_states=None)
    with pytest.raises(RuntimeError, match="hidden width 6 != draft-extend buffer width 5"):
        v1._sync_draft_full(w, b, state.of(w), None, [0], torch.tensor([7]), torch.zeros(1, 6), torch.tensor([110]))


@requires_v1
def test_sync_draft_light_writes_every_row_and_keeps_the_unfinished(v1, monkeypatch):
    writes = []
    monkeypatch.setattr(draft_kv, "write", lambda runner, tok, hid, pos, loc: writes.append(
        (runner, tok.tolist(), pos.tolist(), loc.tolist())))
    w, b = _off_worker([7, 8, 9]), _off_batch([Req()] * 3)
    b.seq_lens = torch.tensor([11, 21, 31])
    _light(w)
    st = state.of(w)
    keep = v1._keep_index([1], b)
    v1._sync_draft_light(w, b, st, keep, 1, torch.tensor([7, 8, 9]), torch.zeros(3, 6), torch.tensor([110, 120, 130]))
    assert writes == [(w.draft_model_runner, [7, 8, 9], [10, 20, 30], [110, 120, 130])]
    assert compat.last_token_ids(b.spec_info).tolist() == [8]
    assert b.spec_info.topk_p.shape == (1, 1) and b.spec_info.hidden_states.dtype == torch.bfloat16
    assert st.light_pending and w.extends == []


@requires_v1
def test_fill_result_keeps_the_target_result(v1):
    from sglang.srt.managers.utils import GenerationBatchResult

    res = GenerationBatchResult(logits_output=None, next_token_ids=torch.tensor([1, 2]), can_run_cuda_graph=False)
    assert v1._fill_result(res, 2) is res
    for name, value in compat.result_kwargs(GenerationBatchResult, bs=2).items():
        assert getattr(res, name) == value
    with pytest.raises(RuntimeError, match="unexpected target result"):
        v1._fill_result(NS(), 2)


# --- forward_off: the steps in order ------------------------------------------------------


@requires_v1
@pytest.mark.parametrize("light, mode, sync", [(False, StepMode.OFF, "full"), (True, StepMode.OFF, "light"),
                                               (True, StepMode.RESUME, "full")])
def test_forward_off_runs_the_steps_in_order(v1, alloc, monkeypatch, light, mode, sync):
    from sglang.srt.model_executor.forward_batch_info import ForwardMode

    calls = []
    monkeypatch.setattr(draft_kv, "write", lambda *a: calls.append("draft_kv"))
    w = _off_worker([7, 8, 9], calls)
    if light:
        _light(w)
    reqs = [Req(), Req(stop=8), Req()]
    b = _off_batch(reqs, calls=calls)
    res = v1.forward_off(w, b, mode)
    assert calls == [("mwb", ForwardMode.DECODE, None), "target", "draft_kv" if sync == "light" else "draft_extend"]
    assert b.seq_lens.tolist() == [11, 21, 31] and [r.output_ids for r in reqs] == [[7], [8], [9]]
    assert b.forward_mode == ForwardMode.DECODE
    assert res.next_token_ids.tolist() == [7, 8, 9]
    assert v1.resume_pending(w) is (sync == "light")
    if sync == "full":
        assert w.extends[0].out_cache_loc.tolist() == [110, 130]  # the unfinished rows' slots
    else:
        assert compat.last_token_ids(b.spec_info).tolist() == [7, 9]


@requires_v1
def test_forward_off_with_every_request_finished(v1, alloc):
    calls = []
    w = _off_worker([7, 8], calls)
    _light(w)
    state.of(w).light_pending = True
    b = _off_batch([Req(stop=7), Req(stop=8)], tokens=(3, 4), seq_lens=(10, 20), calls=calls)
    v1.forward_off(w, b, StepMode.OFF)
    assert calls[-1] == "idle" and w.idles == [b] and not v1.resume_pending(w)
