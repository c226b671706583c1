"""spec_v2 adapter against the installed SGLang classes (CPU only).

What is real here: every SGLang class, dataclass, enum and signature.  What is not: the model
calls.  ``test_forward_off_*`` replace the target forward and the draft-extend with recorders
(the two calls need a GPU and weights); they check what the adapter hands to those calls and
what it returns to the scheduler.  The end-to-end check is tests/gpu/test_spec_v2_gpu.py.
"""

from __future__ import annotations

import contextlib
import dataclasses
import inspect
from types import SimpleNamespace

import pytest

from sglang_dynspec import compat
from sglang_dynspec.adapters import state
from sglang_dynspec.config import DynspecSettings
from sglang_dynspec.controller import StepMode

pytestmark = pytest.mark.sglang

torch = pytest.importorskip("torch")


@pytest.fixture(scope="module")
def m():
    from sglang_dynspec.adapters import spec_v2

    return spec_v2


@pytest.fixture(scope="module")
def up(m):
    """The installed upstream objects the adapter touches."""
    from sglang.srt.model_executor.forward_batch_info import CaptureHiddenMode, ForwardMode
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

    mod = compat.v2_worker_module()
    return SimpleNamespace(
        mod=mod,
        Worker=mod.EAGLEWorkerV2,
        DraftWorker=getattr(mod, "EagleDraftWorker", None),
        GBR=mod.GenerationBatchResult,
        EDI=mod.EagleDraftInput,
        ForwardMode=ForwardMode,
        CaptureHiddenMode=CaptureHiddenMode,
        Algo=SpeculativeAlgorithm,
    )


# ------------------------------------------------------------------------------------------
# Contract shape


def test_module_contract(m):
    for name in ("decode_batch_size", "forward_off", "resume_pending", "prepare", "describe", "runs_plain_batches",
                 "forward_plain"):
        assert callable(getattr(m, name)), name


def test_describe(m):
    info = m.describe()
    assert info["available"] is True
    assert info["input"] in ("model_worker_batch", "schedule_batch")
    assert info["graph_guard"] == compat.graph_guard_target()
    # Plain-batch off-steps on the one release whose scheduler they are built on, and said so.
    assert info["offstep_batch"].startswith("plain") is (compat.plain_batch_release_problem() is None)


def test_input_kind_matches_release(m, sglang_version):
    from packaging.version import Version

    expected = "model_worker_batch" if sglang_version < Version("0.5.13") else "schedule_batch"
    assert compat.v2_input_kind() == expected


# ------------------------------------------------------------------------------------------
# Signatures of every upstream function the adapter calls, with the arguments it passes.


def _bind(fn, *args, **kwargs):
    inspect.signature(inspect.unwrap(fn)).bind(*args, **kwargs)


def test_signature_target_forward(m):
    from sglang.srt.managers.tp_worker import TpModelWorker

    # forward_off calls target_worker.forward_batch_generation(batch) positionally.
    _bind(TpModelWorker.forward_batch_generation, object(), object())


def test_signature_draft_extend_for_decode(m, up):
    # forward_off calls draft_worker._draft_extend_for_decode(batch, result).
    owner = up.DraftWorker if up.DraftWorker is not None else up.Worker
    _bind(owner._draft_extend_for_decode, object(), object(), object())


def test_signature_worker_forward(m, up):
    params = list(inspect.signature(inspect.unwrap(up.Worker.forward_batch_generation)).parameters)
    if compat.v2_input_kind() == "model_worker_batch":
        assert params[:2] == ["self", "model_worker_batch"]
    else:
        assert params[:3] == ["self", "batch", "on_publish"]


def test_draft_context_factories_exist(up):
    for name in ("speculative_moe_backend_context", "speculative_moe_a2a_backend_context"):
        assert callable(getattr(up.mod, name)), name
    with contextlib.ExitStack() as st:  # they work without a server (module globals only)
        st.enter_context(up.mod.speculative_moe_backend_context())
        st.enter_context(up.mod.speculative_moe_a2a_backend_context())


def _expect_offstep_graphs(sglang_version):
    """Releases whose answer was read in their source; None where only the feature check decides."""
    from packaging.version import Version

    v = Version(sglang_version.base_version)
    if v < Version("0.5.10"):
        return False  # CudaGraphRunner(model_runner) only: no separate attention backend
    if Version("0.5.12") <= v < Version("0.5.13") or Version("0.5.15") <= v < Version("0.5.16"):
        return True
    if v >= Version("0.5.23"):
        return False  # the decode runner takes its hidden mode from return_hidden_states_mode
    return None


def test_offstep_graph_support_per_release(m, sglang_version):
    reason = m.offstep_graphs_unsupported()
    expected = _expect_offstep_graphs(sglang_version)
    if expected is not None:
        assert (reason is None) is expected, reason
    if reason is not None:
        assert m.describe()["offstep_graphs"] == reason
        return
    # Supported: every piece offstep_graphs.capture calls takes the arguments it passes.
    from sglang.srt.model_executor.model_runner import ModelRunner

    runner_cls = compat.target_graph_runner_class()
    _bind(runner_cls.__init__, object(), object(), attn_backend=object())
    _bind(ModelRunner._get_attention_backend, object(), init_new_workspace=True)
    src = inspect.getsource(runner_cls.__init__)
    # The capture relies on these two switches (see offstep_graphs.capture).
    assert "spec_algorithm.is_speculative()" in src
    assert "enable_return_hidden_states" in src


def test_prepare_captures_graphs_only_where_supported(m, up, monkeypatch):
    captured = []
    from sglang_dynspec.adapters import offstep_graphs

    monkeypatch.setattr(offstep_graphs, "capture", lambda mr, need_hidden: captured.append(mr) or {"runner": "stub"})
    w = _worker(up)
    w.server_args.disable_cuda_graph = False
    w._target_worker.model_runner.is_draft_worker = False
    m.prepare(w, DynspecSettings(offstep_graphs=True))
    graphs = state.peek(w).graphs
    if m.offstep_graphs_unsupported() is None:
        assert captured == [w.target_worker.model_runner] and graphs == {"runner": "stub"}
    else:
        # Eager: the capture must not even be attempted (it would touch the live backend).
        assert captured == [] and graphs is None


# ------------------------------------------------------------------------------------------
# Dataclasses the adapter builds: real construction with CPU tensors.


def test_draft_input_fields(m, up):
    names = compat.dataclass_field_names(up.EDI)
    bonus = compat.draft_input_bonus_field(up.EDI)
    assert bonus in names
    kw = {bonus: torch.tensor([5, 6], dtype=torch.int32)}
    if "new_seq_lens" not in compat.dataclass_field_names(up.GBR):
        assert {"new_seq_lens", "verify_done"} <= names
        kw.update(new_seq_lens=torch.tensor([10, 20]), verify_done=None)
    di = up.EDI(**kw)
    assert torch.equal(getattr(di, bonus), kw[bonus])
    # What _draft_extend_for_decode fills in afterwards.
    assert {"topk_p", "topk_index", "hidden_states"} <= names


def _result_carries_stride(sglang_version):
    from packaging.version import Version

    return Version(sglang_version.base_version) >= Version("0.5.12")


def test_generation_batch_result_fields(m, up, sglang_version):
    names = compat.dataclass_field_names(up.GBR)
    # The scheduler's spec-v2 decode path reads these on every release we support.
    for f in ("logits_output", "next_token_ids", "can_run_cuda_graph", "next_draft_input", "accept_lens"):
        assert f in names, f
    has_stride = "speculative_num_draft_tokens" in names
    assert has_stride is _result_carries_stride(sglang_version)
    if not has_stride:
        # Before 0.5.12 the scheduler takes the row stride from the worker, not the result.
        from sglang.srt.managers import scheduler_output_processor_mixin as mixin

        assert "self.draft_worker.speculative_num_draft_tokens" in inspect.getsource(mixin)
    kw = compat.only_fields(
        up.GBR,
        logits_output=None,
        next_token_ids=torch.zeros(8, dtype=torch.int32),
        can_run_cuda_graph=False,
        speculative_num_draft_tokens=4,
        next_draft_input=None,
        accept_lens=torch.ones(2, dtype=torch.int32),
        new_seq_lens=torch.tensor([11, 21]),
        extra_keep_alive_refs=[],
        not_a_field=1,
    )
    assert "not_a_field" not in kw
    assert ("speculative_num_draft_tokens" in kw) is has_stride
    res = up.GBR(**kw)
    if has_stride:
        assert res.speculative_num_draft_tokens == 4
    else:
        assert not hasattr(res, "speculative_num_draft_tokens")


def _required_fields(cls):
    return [
        f.name
        for f in dataclasses.fields(cls)
        if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING and f.init
    ]


def m_fields(cls):
    return {f.name for f in dataclasses.fields(cls)}


def _batch_class(m):
    """The batch class forward_batch_generation receives (ModelWorkerBatch is gone in >= 0.5.13)."""
    from sglang.srt.managers import schedule_batch

    name = "ModelWorkerBatch" if compat.v2_input_kind() == "model_worker_batch" else "ScheduleBatch"
    return getattr(schedule_batch, name)


def _expect_capture_channel(m, sglang_version):
    from packaging.version import Version

    v = Version(sglang_version.base_version)
    if compat.v2_input_kind() == "model_worker_batch":
        return "batch_field"  # ModelWorkerBatch.capture_hidden_mode
    if v <= Version("0.5.15"):
        return "batch_field"  # ScheduleBatch.capture_hidden_mode, consumed by ForwardBatch.init_new
    if v >= Version("0.5.23"):
        return "kwarg"  # TpModelWorker.forward_batch_generation(..., capture_hidden_mode=)
    return None


def test_target_overrides_are_batch_fields(m):
    keys = {"forward_mode", "input_ids", "out_cache_loc", "seq_lens", "spec_info", "seq_lens_cpu", "seq_lens_sum"}
    assert keys <= m_fields(_batch_class(m))


def test_target_capture_channel(m, sglang_version):
    from sglang.srt.managers.tp_worker import TpModelWorker
    from sglang.srt.model_executor.forward_batch_info import ForwardBatch

    channel = compat.target_capture_channel()
    expected = _expect_capture_channel(m, sglang_version)
    if expected is not None:
        assert channel == expected
    cls = _batch_class(m)
    if channel == "kwarg":
        _bind(TpModelWorker.forward_batch_generation, object(), object(), capture_hidden_mode=object())
        assert "capture_hidden_mode" in inspect.signature(inspect.unwrap(ForwardBatch.init_new)).parameters
    else:
        assert channel == "batch_field"
        assert "capture_hidden_mode" in m_fields(cls)
        assert "batch.capture_hidden_mode" in inspect.getsource(ForwardBatch.init_new)


# ------------------------------------------------------------------------------------------
# decode_batch_size


def _worker(up, algo="EAGLE3", cls=None, ndt=4):
    cls = cls or up.Worker
    w = object.__new__(cls)
    w.speculative_algorithm = up.Algo.from_string(algo)
    w.server_args = SimpleNamespace(enable_dp_attention=False, pp_size=1, enable_two_batch_overlap=False,
                                    disable_cuda_graph=True)
    w.speculative_num_draft_tokens = ndt
    w.speculative_num_steps = ndt - 1
    w.topk = 1
    w.token_to_kv_pool_allocator = SimpleNamespace(get_kvcache=lambda: SimpleNamespace())
    tmr = SimpleNamespace(hybrid_gdn_config=None, mamba2_config=None)
    w._target_worker = SimpleNamespace(model_runner=tmr)
    return w


def _decode_batch(up, bs=2, **over):
    b = SimpleNamespace(
        forward_mode=up.ForwardMode.DECODE,
        is_extend_in_batch=False,
        spec_info=up.EDI(),
        return_logprob=False,
        global_num_tokens=None,
        has_grammar=False,
        sampling_info=SimpleNamespace(grammars=None),
        reqs=[SimpleNamespace(return_hidden_states=False) for _ in range(bs)],
        seq_lens=torch.arange(bs) + 10,
    )
    for k, v in over.items():
        setattr(b, k, v)
    return b


def test_decode_batch_size_accepts_decode(m, up):
    assert m.decode_batch_size(_worker(up), _decode_batch(up, bs=3)) == 3
    assert m.decode_batch_size(_worker(up, algo="EAGLE"), _decode_batch(up, bs=1)) == 1


@pytest.mark.parametrize(
    "over",
    [
        {"forward_mode": "EXTEND"},
        {"forward_mode": "IDLE"},
        {"is_extend_in_batch": True},
        {"spec_info": None},
        {"return_logprob": True},
        {"global_num_tokens": [2, 2]},
        {"has_grammar": True},
        {"sampling_info": SimpleNamespace(grammars=[object()])},
        {"reqs": [SimpleNamespace(return_hidden_states=True)]},
    ],
    ids=lambda d: next(iter(d)) + ("" if not isinstance(next(iter(d.values())), str) else "=" + next(iter(d.values()))),
)
def test_decode_batch_size_declines(m, up, over):
    over = {k: (getattr(up.ForwardMode, v) if k == "forward_mode" else v) for k, v in over.items()}
    assert m.decode_batch_size(_worker(up), _decode_batch(up, **over)) is None


def test_decode_batch_size_subclasses(m, up):
    from sglang.srt.speculative import standalone_worker_v2

    sa = _worker(up, algo="STANDALONE", cls=standalone_worker_v2.StandaloneWorkerV2)
    assert m.decode_batch_size(sa, _decode_batch(up)) == 2  # inherits forward_batch_generation

    class Overrides(up.Worker):
        def forward_batch_generation(self, *a, **k):  # noqa: D401 - test double of e.g. FrozenKVMTPWorkerV2
            return None

    assert m.decode_batch_size(_worker(up, cls=Overrides), _decode_batch(up)) is None
    assert m.decode_batch_size(SimpleNamespace(), _decode_batch(up)) is None


def test_decode_batch_size_worker_level_declines(m, up):
    w = _worker(up)
    w.server_args.enable_dp_attention = True
    assert m.decode_batch_size(w, _decode_batch(up)) is None
    w = _worker(up)
    w._target_worker.model_runner.mamba2_config = object()
    assert m.decode_batch_size(w, _decode_batch(up)) is None


# ------------------------------------------------------------------------------------------
# forward_off with the two model calls replaced by recorders


_ABSENT = object()


class _TargetRecorder:
    def __init__(self, up, hidden=6, new_tokens=(7, 8)):
        self.up, self.hidden, self.new_tokens, self.batches = up, hidden, new_tokens, []
        self.model_runner = SimpleNamespace()

    def forward_batch_generation(self, batch, *a, **k):
        from sglang.srt.layers.logits_processor import LogitsProcessorOutput
        from sglang.srt.managers.tp_worker import TpModelWorker

        # The adapter's call must be one the installed TpModelWorker accepts.
        _bind(TpModelWorker.forward_batch_generation, self, batch, *a, **k)
        # Snapshot: the ScheduleBatch path restores the fields after the call.
        snap = {f: getattr(batch, f) for f in (
            "forward_mode", "input_ids", "out_cache_loc", "seq_lens", "seq_lens_cpu", "seq_lens_sum", "spec_info")}
        snap["batch_capture"] = getattr(batch, "capture_hidden_mode", _ABSENT)
        snap["kwarg_capture"] = k.get("capture_hidden_mode", _ABSENT)
        self.batches.append(snap)
        bs = batch.seq_lens.shape[0]
        lo = LogitsProcessorOutput(next_token_logits=torch.zeros(bs, 11),
                                   hidden_states=torch.arange(bs * self.hidden, dtype=torch.float32).view(bs, -1))
        return self.up.GBR(logits_output=lo, next_token_ids=torch.tensor(self.new_tokens, dtype=torch.int64),
                           can_run_cuda_graph=False)


class _DraftRecorder:
    plan_stream = None

    def __init__(self):
        self.calls = []
        self.draft_runner = SimpleNamespace(tp_group=None)

    def draft_tp_context(self, group):
        return contextlib.nullcontext()

    def _draft_extend_for_decode(self, batch, result):
        self.calls.append((batch.out_cache_loc.clone(), batch.seq_lens.clone(), result))
        nd = result.next_draft_input
        nd.topk_p = torch.ones(2, 1)
        nd.topk_index = torch.zeros(2, 1, dtype=torch.int64)
        nd.hidden_states = torch.zeros(2, 6)


def _off_setup(m, up, ndt=4):
    w = _worker(up, ndt=ndt)
    target, draft = _TargetRecorder(up), _DraftRecorder()
    w._target_worker = target
    w._draft_worker = draft
    # req_to_token[r, p] = 100*r + p, so every slot names its (request, position).
    req_to_token = (torch.arange(4).unsqueeze(1) * 100 + torch.arange(64)).to(torch.int32)
    w.req_to_token_pool = SimpleNamespace(req_to_token=req_to_token)
    bonus = compat.draft_input_bonus_field(up.EDI)
    spec_info = up.EDI(**{bonus: torch.tensor([3, 4], dtype=torch.int32)})
    seq_lens = torch.tensor([10, 20])
    fields = dict(
        forward_mode=up.ForwardMode.DECODE,
        input_ids=torch.tensor([-1, -1]),
        req_pool_indices=torch.tensor([1, 3]),
        seq_lens=seq_lens,
        seq_lens_cpu=seq_lens.clone(),
        seq_lens_sum=30,
        out_cache_loc=None,
        spec_info=spec_info,
        orig_seq_lens=None,
        return_logprob=False,
    )
    cls = _batch_class(m)
    if "capture_hidden_mode" in m_fields(cls):  # only where the real batch has the field
        fields["capture_hidden_mode"] = None
    if compat.v2_input_kind() == "model_worker_batch":
        kw = {name: None for name in _required_fields(cls)}
        kw.update(fields)
        batch = cls(**kw)
    else:
        batch = SimpleNamespace(**fields)  # a real ScheduleBatch needs a live memory pool
    return w, target, draft, batch


def _target_capture(m, tb):
    """The capture mode the target saw, through the channel this release reads; the other
    channel must stay unused (a stray ScheduleBatch attribute would be silently ignored)."""
    if compat.target_capture_channel() == "kwarg":
        assert tb["batch_capture"] in (_ABSENT, None)
        return tb["kwarg_capture"]
    assert tb["kwarg_capture"] is _ABSENT
    return tb["batch_capture"]


def test_forward_off_builds_target_decode_and_result(m, up, sglang_version):
    ndt = 4
    w, target, draft, batch = _off_setup(m, up, ndt=ndt)
    published = []
    kwargs = {"on_publish": published.append} if compat.v2_input_kind() == "schedule_batch" else {}
    res = m.forward_off(w, batch, StepMode.OFF, **kwargs)

    # Target call: plain DECODE, one token per request at position seq_lens.
    (tb,) = target.batches
    assert tb["forward_mode"] == up.ForwardMode.DECODE
    assert tb["spec_info"] is None
    assert _target_capture(m, tb) == up.CaptureHiddenMode.FULL
    assert tb["input_ids"].tolist() == [3, 4] and tb["input_ids"].dtype == torch.int64
    assert tb["out_cache_loc"].tolist() == [110, 320]  # req_to_token[rpi, seq_lens]
    assert tb["seq_lens"].tolist() == [11, 21]
    assert tb["seq_lens_cpu"].tolist() == [11, 21]
    assert tb["seq_lens_sum"] == 32
    # The scheduler's batch is untouched where the draft-extend needs the old values.
    assert batch.seq_lens.tolist() == [10, 20]
    assert batch.forward_mode == up.ForwardMode.DECODE

    # Result: a verify whose drafts were all rejected.
    assert isinstance(res, up.GBR)
    if _result_carries_stride(sglang_version):
        assert res.speculative_num_draft_tokens == ndt
    else:
        # The scheduler reads the stride from the worker; the padding below must match it.
        assert not hasattr(res, "speculative_num_draft_tokens") and w.speculative_num_draft_tokens == ndt
    assert res.next_token_ids.tolist() == [7] * ndt + [8] * ndt
    assert res.next_token_ids.dtype == torch.int32
    assert res.accept_lens.tolist() == [1, 1] and res.accept_lens.dtype == torch.int32
    assert res.logits_output.hidden_states.shape == (2 * ndt, 6)
    assert torch.equal(res.logits_output.hidden_states[::ndt], torch.arange(12, dtype=torch.float32).view(2, 6))
    nd = res.next_draft_input
    assert isinstance(nd, up.EDI)
    assert getattr(nd, compat.draft_input_bonus_field(up.EDI)).tolist() == [7, 8]
    if "new_seq_lens" in compat.dataclass_field_names(up.GBR):
        assert res.new_seq_lens.tolist() == [11, 21]
        assert [t.tolist() for t in published] == [[11, 21]]
    else:
        assert nd.new_seq_lens.tolist() == [11, 21]
        assert nd.verify_done is not None

    # Draft sync: the verify window [seq_lens, seq_lens + ndt), old seq_lens.
    ((loc, seq_lens, passed),) = draft.calls
    assert passed is res
    assert loc.tolist() == [110, 111, 112, 113, 320, 321, 322, 323]
    assert seq_lens.tolist() == [10, 20]
    assert nd.topk_p is not None and nd.hidden_states is not None


def test_forward_off_publishes_seq_lens_before_the_target_runs(m, up, monkeypatch):
    """The scheduler blocks on the published seq_lens before preparing the next batch; an
    off-step knows them up front, so it must publish before the target decode is launched
    (published after it, the next batch's preparation could not overlap this step's GPU work)."""
    w, target, draft, batch = _off_setup(m, up)
    order = []
    forward = target.forward_batch_generation
    target.forward_batch_generation = lambda *a, **k: (order.append("target"), forward(*a, **k))[1]
    kwargs = {}
    if compat.v2_input_kind() == "schedule_batch":
        kwargs["on_publish"] = lambda lens: order.append(("publish", lens.tolist()))
    else:
        device_mod = torch.get_device_module(batch.seq_lens.device)

        class Event:
            def record(self):
                order.append(("record", id(self)))

            def synchronize(self):
                pass

        monkeypatch.setattr(device_mod, "Event", Event)
    res = m.forward_off(w, batch, StepMode.OFF, **kwargs)

    assert order[-1] == "target" and len(order) == 2, order
    if compat.v2_input_kind() == "schedule_batch":
        assert order[0] == ("publish", [11, 21])
    else:
        nd = res.next_draft_input
        assert nd.new_seq_lens.tolist() == [11, 21]
        if "verify_done" in compat.dataclass_field_names(up.EDI):
            assert order[0] == ("record", id(nd.verify_done))


def test_forward_off_standalone_captures_nothing(m, up):
    w, target, draft, batch = _off_setup(m, up)
    w.speculative_algorithm = up.Algo.from_string("STANDALONE")
    kwargs = {"on_publish": None} if compat.v2_input_kind() == "schedule_batch" else {}
    m.forward_off(w, batch, StepMode.OFF, **kwargs)
    assert _target_capture(m, target.batches[0]) == up.CaptureHiddenMode.NULL


def test_prepare_without_graphs_is_noop(m, up, monkeypatch):
    from sglang_dynspec.adapters import offstep_graphs

    monkeypatch.setattr(offstep_graphs, "capture", lambda mr, need_hidden: pytest.fail("must not capture"))
    w = _worker(up)
    w.server_args.disable_cuda_graph = False
    settings = DynspecSettings(offstep_graphs=False)
    m.prepare(w, settings)
    m.prepare(w, settings)  # idempotent
    assert state.peek(w).graphs is None


# ------------------------------------------------------------------------------------------
# light draft sync (draft_kv) and the resume step


def _light(m, w, monkeypatch):
    from sglang_dynspec.adapters import draft_kv

    state.of(w, m.SpecV2State).light = draft_kv.LightSync(topk=1, draft_hidden=6, draft_dtype=torch.bfloat16)
    writes = []
    monkeypatch.setattr(draft_kv, "write", lambda runner, tok, hid, pos, loc: writes.append(
        (runner, tok.clone(), hid.clone(), pos.clone(), loc.clone())))
    return writes


def test_forward_off_light_sync_then_resume_step(m, up, sglang_version, monkeypatch):
    ndt = 4
    w, target, draft, batch = _off_setup(m, up, ndt=ndt)
    writes = _light(m, w, monkeypatch)
    published = []
    kwargs = {"on_publish": published.append} if compat.v2_input_kind() == "schedule_batch" else {}
    assert not m.resume_pending(w)
    res = m.forward_off(w, batch, StepMode.OFF, **kwargs)

    (tb,) = target.batches
    assert tb["out_cache_loc"].tolist() == [110, 320] and tb["seq_lens"].tolist() == [11, 21]
    assert draft.calls == []  # no draft-extend forward
    ((runner, tok, hid, pos, loc),) = writes
    assert runner is draft.draft_runner
    assert tok.tolist() == [7, 8] and pos.tolist() == [10, 20] and loc.tolist() == [110, 320]
    assert torch.equal(hid, torch.arange(12, dtype=torch.float32).view(2, 6))  # one row per request
    if _result_carries_stride(sglang_version):
        assert res.speculative_num_draft_tokens == 1 and res.next_token_ids.tolist() == [7, 8]
    else:
        assert res.next_token_ids.tolist() == [7] * ndt + [8] * ndt
    nd = res.next_draft_input
    assert getattr(nd, compat.draft_input_bonus_field(up.EDI)).tolist() == [7, 8]
    assert nd.topk_p.shape == (2, 1) and nd.topk_p.dtype == torch.float32 and not nd.topk_p.any()
    assert nd.topk_index.shape == (2, 1) and nd.topk_index.dtype == torch.int64
    assert nd.hidden_states.shape == (2, 6) and nd.hidden_states.dtype == torch.bfloat16
    assert m.resume_pending(w)

    # The resume step: a full sync through the draft-extend, after which speculation may run.
    w2, target2, draft2, batch2 = _off_setup(m, up, ndt=ndt)
    w.__dict__["_target_worker"], w.__dict__["_draft_worker"] = target2, draft2
    m.forward_off(w, batch2, StepMode.RESUME, **kwargs)
    assert len(draft2.calls) == 1 and len(writes) == 1
    assert not m.resume_pending(w)


@pytest.mark.skipif(compat.v2_input_kind() != "model_worker_batch", reason="FutureMap.store_to_map of <= 0.5.12")
def test_light_draft_input_fits_the_real_future_map(m, up, monkeypatch):
    from sglang.srt.managers import overlap_utils

    if not hasattr(overlap_utils.FutureMap, "store_to_map_for_new_batch") or \
            compat.draft_input_bonus_field(up.EDI) != "bonus_tokens":
        pytest.skip("FutureMap of another shape on this release")
    monkeypatch.setattr(overlap_utils, "spec_need_hidden_states", lambda *a, **k: True)
    fm = overlap_utils.FutureMap(8, 16, 32, torch.device("cpu"), up.Algo.from_string("EAGLE3"))
    bonus = compat.draft_input_bonus_field(up.EDI)
    # A real step's draft input initialises the buffers (as the first prefill does on a server).
    real = up.EDI(topk_p=torch.rand(2, 1), topk_index=torch.ones(2, 1, dtype=torch.int64),
                  hidden_states=torch.rand(2, 6, dtype=torch.bfloat16),
                  **{bonus: torch.tensor([1, 2], dtype=torch.int32)}, new_seq_lens=torch.tensor([5, 6]))
    fm.store_to_map_for_new_batch(fm.alloc_future_indices(2), real)
    w, target, draft, batch = _off_setup(m, up)
    _light(m, w, monkeypatch)
    nd = m.forward_off(w, batch, StepMode.OFF).next_draft_input
    idx = fm.alloc_future_indices(2)
    fm.store_to_map_for_new_batch(idx, nd)
    assert fm.bonus_tokens_buf[idx.indices].tolist() == [7, 8]
    assert fm.new_seq_lens_buf[idx.indices].tolist() == [11, 21]
    assert not fm.topk_p_buf[idx.indices].any() and not fm.hidden_states_buf[idx.indices].any()


# ------------------------------------------------------------------------------------------
# forward_off's named steps one by one (the forward_off tests above run them together)


def test_on_publish_arg(m):
    publish = object()
    assert m._on_publish_arg("model_worker_batch", (publish,), {}) is None
    assert m._on_publish_arg("schedule_batch", (publish,), {}) is publish
    assert m._on_publish_arg("schedule_batch", (), {"on_publish": publish}) is publish
    assert m._on_publish_arg("schedule_batch", (), {}) is None
    with pytest.raises(RuntimeError, match="pp_proxy_tensors"):
        m._on_publish_arg("schedule_batch", (), {"pp_proxy_tensors": object()})


def test_publish_seq_lens_on_the_result_or_by_event(m):
    batch = SimpleNamespace(seq_lens=torch.tensor([10, 20]))
    published = []
    lens, done = m._publish_seq_lens(batch, None, {"new_seq_lens"}, published.append)
    assert lens.tolist() == [11, 21] and done is None and published == [lens]
    assert m._publish_seq_lens(batch, None, {"new_seq_lens"}, None)[1] is None  # nobody to tell

    class Event:
        recorded = 0

        def record(self):
            self.recorded += 1

    lens, done = m._publish_seq_lens(batch, SimpleNamespace(Event=Event), set(), published.append)
    assert lens.tolist() == [11, 21] and done.recorded == 1 and len(published) == 1  # the event instead


def _target_out(up, bs=2, hidden=6):
    from sglang.srt.layers.logits_processor import LogitsProcessorOutput

    lo = LogitsProcessorOutput(next_token_logits=torch.zeros(bs, 11),
                               hidden_states=torch.arange(bs * hidden, dtype=torch.float32).view(bs, -1))
    return up.GBR(logits_output=lo, next_token_ids=torch.tensor([7, 8][:bs]), can_run_cuda_graph=True)


@pytest.mark.parametrize("light", [False, True])
@pytest.mark.parametrize("carries_stride", [False, True])
def test_rejected_verify(m, up, light, carries_stride):
    out = _target_out(up)
    hidden = out.logits_output.hidden_states
    fields = {"speculative_num_draft_tokens"} if carries_stride else set()
    new_tokens, target_hidden, stride, predict, accept_lens = m._rejected_verify(out, light, fields, 3, 2)
    assert new_tokens.tolist() == [7, 8] and new_tokens.dtype == torch.int32 and target_hidden is hidden
    assert accept_lens.tolist() == [1, 1] and accept_lens.dtype == torch.int32
    if light and carries_stride:
        assert stride == 1 and predict is new_tokens
    else:
        assert stride == 3 and predict.tolist() == [7, 7, 7, 8, 8, 8]
    # Only the full sync's draft-extend reads the padded hidden states.
    padded = out.logits_output.hidden_states
    assert (padded is hidden) is light
    if not light:
        assert padded.shape == (6, 6) and torch.equal(padded[::3], hidden)


def test_next_draft_input(m, up):
    bonus = compat.draft_input_bonus_field(up.EDI)
    on_result = "new_seq_lens" in compat.dataclass_field_names(up.GBR)
    fields = {"new_seq_lens"} if on_result else set()
    tokens, lens, done = torch.tensor([7, 8], dtype=torch.int32), torch.tensor([11, 21]), object()
    nd = m._next_draft_input(up.EDI, bonus, tokens, None, 2, fields, lens, done)
    assert isinstance(nd, up.EDI) and getattr(nd, bonus) is tokens and nd.topk_p is None
    if not on_result:
        assert nd.new_seq_lens is lens
        if "verify_done" in compat.dataclass_field_names(up.EDI):
            assert nd.verify_done is done
    from sglang_dynspec.adapters import draft_kv

    light = draft_kv.LightSync(topk=1, draft_hidden=6, draft_dtype=torch.bfloat16)
    nd = m._next_draft_input(up.EDI, bonus, tokens, light, 2, fields, lens, done)
    assert nd.topk_p.shape == (2, 1) and not nd.topk_p.any() and nd.hidden_states.dtype == torch.bfloat16


def test_result_has_the_fields_of_a_rejected_verify(m, up, sglang_version):
    out = _target_out(up)
    out.routed_experts_output = "experts"
    nd, predict, lens = up.EDI(), torch.tensor([7, 8]), torch.tensor([11])
    accept_lens = torch.ones(2, dtype=torch.int32)
    res = m._result(up.GBR, out, predict, 1, nd, accept_lens, lens, keep_alive=["ref"])
    assert isinstance(res, up.GBR) and res.logits_output is out.logits_output and res.next_token_ids is predict
    assert res.can_run_cuda_graph is True and res.next_draft_input is nd and res.accept_lens is accept_lens
    names = compat.dataclass_field_names(up.GBR)
    if "speculative_num_draft_tokens" in names:
        assert res.speculative_num_draft_tokens == 1
    if "routed_experts_output" in names:
        assert res.routed_experts_output == "experts"
    if "extra_keep_alive_refs" in names:
        assert res.extra_keep_alive_refs == ["ref"]


def test_sync_draft_full_waits_for_the_forward_stream_first(m, up):
    w, target, draft, batch = _off_setup(m, up)
    order = []

    class PlanStream:
        def wait_stream(self, stream):
            order.append(("wait", stream))

    draft.plan_stream = PlanStream()
    extend = draft._draft_extend_for_decode
    draft._draft_extend_for_decode = lambda b, r: (order.append("draft_extend"), extend(b, r))
    st = state.of(w, m.SpecV2State)
    st.light_pending = True
    window, fwd = torch.tensor([110, 111, 320, 321]), object()
    res = SimpleNamespace(next_draft_input=up.EDI())
    m._sync_draft_full(w, st, batch, res, window, torch.tensor([7, 7, 8, 8]), torch.ones(2), fwd)
    assert order == [("wait", fwd), "draft_extend"]
    assert batch.out_cache_loc is window and draft.calls[0][2] is res and not st.light_pending


def test_sync_draft_light_writes_the_draft_kv_only(m, up, monkeypatch):
    w, target, draft, batch = _off_setup(m, up)
    writes = _light(m, w, monkeypatch)
    st = state.of(w, m.SpecV2State)
    m._sync_draft_light(w, st, batch, torch.tensor([7, 8]), torch.zeros(2, 6), torch.tensor([110, 320]))
    ((runner, tok, _hid, pos, loc),) = writes
    assert runner is draft.draft_runner and tok.tolist() == [7, 8] and pos.tolist() == [10, 20]
    assert loc.tolist() == [110, 320] and draft.calls == [] and st.light_pending and m.resume_pending(w)


def test_state_is_typed_and_stored_once_per_worker(m, up):
    w = _worker(up)
    assert state.peek(w) is None and not m.resume_pending(w)
    assert m.unsupported_reason(w) is None
    st = state.peek(w)
    assert isinstance(st, m.SpecV2State) and st.unsupported_checked and state.of(w, m.SpecV2State) is st
    w.server_args.enable_dp_attention = True
    assert m.unsupported_reason(w) is None  # decided once per worker


# ------------------------------------------------------------------------------------------
# Prefills while off: the light prefill (target extend, then the prompt's draft KV written directly)

_LIGHT_PREFILL = pytest.mark.skipif(compat.light_prefill_release_problem() is not None,
                                    reason="no light prefill on this release (test_light_prefill_release_support)")
_LENS = dict(zip(("extend", "prefix"), compat.PREFILL_LENS_FIELDS[compat.v2_input_kind()]))


class _PrefillTarget:
    """The target's extend: records what it was given, returns one hidden row per prompt token."""

    def __init__(self, up, new_tokens=(13, 22), aux_hidden=9):
        self.up, self.new_tokens, self.aux_hidden, self.seen = up, new_tokens, aux_hidden, []

    def forward_batch_generation(self, batch, *a, **k):
        from sglang.srt.layers.logits_processor import LogitsProcessorOutput
        from sglang.srt.managers.tp_worker import TpModelWorker

        _bind(TpModelWorker.forward_batch_generation, self, batch, *a, **k)
        self.seen.append((batch.capture_hidden_mode, batch.input_ids.clone()))
        n = batch.input_ids.shape[0]
        lo = LogitsProcessorOutput(next_token_logits=torch.zeros(len(self.new_tokens), 11),
                                   hidden_states=torch.arange(n * self.aux_hidden, dtype=torch.float32).view(n, -1))
        return self.up.GBR(logits_output=lo, next_token_ids=torch.tensor(self.new_tokens, dtype=torch.int64),
                           can_run_cuda_graph=True)


def _prefill_setup(m, up, monkeypatch, **over):
    """Two requests: one with 4 cached tokens extending 3 ([10, 11, 12]), one new with 2 ([20, 21]).
    ``over``'s keys ``extend`` / ``prefix`` name the release's per-request length fields."""
    w = _worker(up)
    target, draft = _PrefillTarget(up), _DraftRecorder()
    w._target_worker, w._draft_worker = target, draft
    writes = _light(m, w, monkeypatch)
    state.of(w, m.SpecV2State).light_prefill = True
    fields = dict(forward_mode=up.ForwardMode.EXTEND, input_ids=torch.tensor([10, 11, 12, 20, 21]),
                  out_cache_loc=torch.tensor([504, 505, 506, 700, 701]), seq_lens=torch.tensor([7, 2]),
                  extend=[3, 2], prefix=[4, 0], capture_hidden_mode=None,
                  spec_info=None, return_logprob=False, multimodal_inputs=[None, None])
    fields.update(over)
    fields = {_LENS.get(k, k): v for k, v in fields.items()}
    cls = _batch_class(m)
    if compat.v2_input_kind() == "model_worker_batch":
        kw = {name: None for name in _required_fields(cls)}
        kw.update(fields)
        batch = cls(**kw)
    else:
        # A real ScheduleBatch needs a live memory pool: the same fields, each one the class declares.
        fields.update(reqs=[SimpleNamespace(rid="a"), SimpleNamespace(rid="b")], chunked_req=None,
                      chunked_req_next_prompt_token=None)
        assert set(fields) <= m_fields(cls)
        batch = SimpleNamespace(**fields)
    return w, target, draft, writes, batch


def test_prefill_draft_rows_shift_tokens_and_count_positions_from_the_prefix(m):
    ids = torch.tensor([10, 11, 12, 20, 21, 30], dtype=torch.int32)
    tokens, positions = m._prefill_draft_rows(ids, [3, 2, 1], [4, 0, 9], torch.tensor([13, 22, 31], dtype=torch.int32))
    assert tokens.tolist() == [11, 12, 13, 21, 22, 31] and tokens.dtype == torch.int64
    assert positions.tolist() == [4, 5, 6, 0, 1, 9] and positions.dtype == torch.int64


@_LIGHT_PREFILL
def test_prefill_while_off_writes_the_prompt_draft_kv_without_the_draft_extend(m, up, monkeypatch):
    w, target, draft, writes, batch = _prefill_setup(m, up, monkeypatch)
    inside = []  # the draft's contexts the light sync holds (set at prepare) surround the write
    published = []  # (lengths, draft writes made by then)

    @contextlib.contextmanager
    def contexts():
        inside.append(len(writes))
        yield
        inside.append(len(writes))

    state.of(w, m.SpecV2State).light.contexts = contexts
    assert not m.resume_pending(w)
    schedule_batch = compat.v2_input_kind() == "schedule_batch"
    args = (lambda lens: published.append((lens, len(writes), len(target.seen))),) if schedule_batch else ()
    res = m.forward_prefill_off(w, batch, *args)
    assert inside == [0, 1]
    ((capture, ids),) = target.seen
    assert capture == up.CaptureHiddenMode.FULL and ids.tolist() == [10, 11, 12, 20, 21]
    assert draft.calls == []  # _DraftRecorder has no _draft_extend_for_prefill: it was not asked
    ((runner, tok, hid, pos, loc),) = writes
    assert runner is draft.draft_runner
    assert tok.tolist() == [11, 12, 13, 21, 22] and pos.tolist() == [4, 5, 6, 0, 1]
    assert loc.tolist() == [504, 505, 506, 700, 701] and hid.shape == (5, 9)
    assert res.next_token_ids.tolist() == [13, 22] and res.can_run_cuda_graph
    nd = res.next_draft_input
    assert isinstance(nd, up.EDI)
    assert getattr(nd, compat.draft_input_bonus_field(up.EDI)).tolist() == [13, 22]
    if schedule_batch:
        # Lengths on the result, published once after the target and before the draft write, as upstream.
        assert res.new_seq_lens is batch.seq_lens and published == [(batch.seq_lens, 0, 1)]
    else:
        assert nd.new_seq_lens is batch.seq_lens
    assert nd.topk_p.shape == (2, 1) and not nd.topk_p.any() and nd.hidden_states.shape == (2, 6)
    assert m.resume_pending(w)  # the next speculative step is a resume step


@_LIGHT_PREFILL
@pytest.mark.skipif(compat.v2_input_kind() != "schedule_batch", reason="chunk-aware tail tokens come with ScheduleBatch")
def test_prefill_while_off_gives_a_chunked_request_its_next_prompt_token(m, up, monkeypatch):
    # Request a is a non-final chunk: the draft's row after its last token is the prompt's next
    # token (99), not the token the target sampled there (13), as SGLang's draft extend does.
    w, _target, _draft, writes, batch = _prefill_setup(m, up, monkeypatch)
    batch.chunked_req, batch.chunked_req_next_prompt_token = batch.reqs[0], 99
    m.forward_prefill_off(w, batch, None)
    ((_runner, tok, _hid, pos, _loc),) = writes
    assert tok.tolist() == [11, 12, 99, 21, 22] and pos.tolist() == [4, 5, 6, 0, 1]


@_LIGHT_PREFILL
@pytest.mark.parametrize("over", [
    {"forward_mode": "MIXED"},
    {"forward_mode": "IDLE"},
    {"input_embeds": torch.zeros(5, 4)},
    {"multimodal_inputs": [object(), None]},
    {"extend": [3, 1]},  # lengths that do not add up to the batch's tokens
    {"extend": None},
    {"prefix": None},
], ids=lambda d: next(iter(d)))
def test_prefill_while_off_leaves_other_batches_to_sglang(m, up, monkeypatch, over):
    over = {k: (getattr(up.ForwardMode, v) if k == "forward_mode" else v) for k, v in over.items()}
    w, target, _draft, writes, batch = _prefill_setup(m, up, monkeypatch, **over)
    assert m.forward_prefill_off(w, batch) is None
    assert target.seen == [] and writes == [] and not m.resume_pending(w)


@_LIGHT_PREFILL
def test_prefill_while_off_refuses_a_target_without_per_token_hidden_states(m, up, monkeypatch):
    w, target, _draft, writes, batch = _prefill_setup(m, up, monkeypatch)
    target.aux_hidden = 0  # no hidden columns: shape (5, 0) is still per token; make it per request
    monkeypatch.setattr(target, "forward_batch_generation", lambda b, *a, **k: up.GBR(
        logits_output=SimpleNamespace(hidden_states=torch.zeros(2, 9)), next_token_ids=torch.tensor([13, 22]),
        can_run_cuda_graph=False))
    with pytest.raises(RuntimeError, match="hidden states of shape"):
        m.forward_prefill_off(w, batch)
    assert writes == []


def test_prepare_chooses_the_light_prefill_only_where_allowed(m, up, monkeypatch):
    from sglang_dynspec.adapters import draft_kv

    light = draft_kv.LightSync(topk=1, draft_hidden=6, draft_dtype=torch.bfloat16)
    monkeypatch.setattr(draft_kv, "prepare", lambda runner, topk, who, mode, sizes, contexts: light if mode == "light" else None)
    release = compat.light_prefill_release_problem()
    cases = {(): release is None,
             (("prefill_draft_sync", "full"),): False,
             (("offstep_draft_sync", "full"),): False}
    for over, expected in cases.items():
        w = _worker(up)
        w._draft_worker = _DraftRecorder()
        m.prepare(w, DynspecSettings(offstep_graphs=False, **dict(over)))
        assert state.peek(w).light_prefill is expected, over
    st = m.SpecV2State(light=None)
    assert "offstep_draft_sync" in m.light_prefill_problem(st, DynspecSettings())
    assert m.light_prefill_problem(st, DynspecSettings(prefill_draft_sync="full")) == "prefill_draft_sync=full"


def test_light_prefill_release_support(sglang_version):
    from packaging.version import Version

    problem = compat.light_prefill_release_problem()
    v = Version(sglang_version.base_version)
    if v >= Version("0.5.13") and v not in compat.LIGHT_PREFILL_SCHEDULE_BATCH_RELEASES:
        assert "ScheduleBatch" in problem and str(v) in problem
    else:
        assert problem is None  # <= 0.5.12's ModelWorkerBatch, 0.5.15's ScheduleBatch


# ------------------------------------------------------------------------------------------
# a plain decode batch (adapters/plain_batch.py) that reaches the worker


@pytest.mark.skipif(compat.plain_batch_release_problem() is not None, reason="plain batches are built on 0.5.12, 0.5.15")
@pytest.mark.parametrize("buf_dtype", [torch.int32, torch.int64])
def test_forward_plain_runs_the_target_decode_then_the_light_write(m, up, monkeypatch, buf_dtype):
    w, target, draft, batch = _off_setup(m, up)
    writes = _light(m, w, monkeypatch)
    # A plain batch as the scheduler's plain prepare leaves it: lengths counting this step's
    # token, its slot allocated; its input tokens in the speculative FutureMap's token buffer.
    batch.spec_info = None
    batch.seq_lens = torch.tensor([11, 21])
    batch.out_cache_loc = torch.tensor([110, 320])
    if compat.v2_input_kind() == "model_worker_batch":
        # 0.5.12: input ids name ring slots (negated) or are real tokens.
        batch.input_ids = ids = torch.tensor([-5, 9])
        future_map = SimpleNamespace(bonus_tokens_buf=torch.arange(100, 108, dtype=buf_dtype))
        expected = [105, 9]
    else:
        # 0.5.15: unset; each row's token sits under its req_pool_idx (rows 1 and 3 here).
        batch.input_ids = None
        future_map = SimpleNamespace(output_tokens_buf=torch.tensor([100, 105, 102, 9], dtype=torch.int64))
        expected = [105, 9]
    res = m.forward_plain(w, batch, future_map)

    (tb,) = target.batches
    assert tb["input_ids"].tolist() == expected and tb["input_ids"].dtype == torch.int64
    if compat.v2_input_kind() == "model_worker_batch":
        # A token buffer of the input ids' own dtype: resolved in place by SGLang's resolver (one
        # kernel on CUDA), as a plain server resolves its batch; else a resolved copy.
        assert (ids.tolist() == expected) == (buf_dtype == torch.int64)
    assert tb["seq_lens"].tolist() == [11, 21] and tb["out_cache_loc"].tolist() == [110, 320]
    assert tb["spec_info"] is None and _target_capture(m, tb) is not None
    ((runner, tok, hid, pos, loc),) = writes
    assert runner is draft.draft_runner and draft.calls == []
    # Draft KV of each row's position (one less than its length) from the new token.
    assert tok.tolist() == [7, 8] and pos.tolist() == [10, 20] and loc.tolist() == [110, 320]
    assert torch.equal(hid, torch.arange(12, dtype=torch.float32).view(2, 6))
    # The target's own result, as a plain server's: one token per row, no draft input.
    assert res.next_token_ids.tolist() == [7, 8] and res.next_draft_input is None
    assert res.logits_output.hidden_states is None
    assert m.resume_pending(w)
    # The batch itself ran, not a copy (0.5.15's ScheduleBatch: run_batch keeps no snapshot of a
    # plain batch; 0.5.12's ModelWorkerBatch: nothing reads one): what the forward was given is
    # put back, as for a speculative off-step.
    assert getattr(batch, "capture_hidden_mode", None) is None
    assert batch.input_ids is (ids if compat.v2_input_kind() == "model_worker_batch" else None)


@pytest.mark.skipif(compat.plain_batch_release_problem() is not None, reason="plain batches are built on 0.5.12, 0.5.15")
def test_plain_batches_need_the_light_sync_and_the_setting(m, up):
    from sglang_dynspec.adapters import draft_kv
    from sglang_dynspec.config import DynspecSettings

    st = m.SpecV2State()
    assert "light draft sync" in m.plain_batch_problem(st, DynspecSettings())
    st.light = draft_kv.LightSync(topk=1, draft_hidden=6, draft_dtype=torch.bfloat16)
    assert m.plain_batch_problem(st, DynspecSettings()) is None
    assert m.plain_batch_problem(st, DynspecSettings(offstep_batch="speculative")) == "offstep_batch=speculative"


def test_prepare_records_the_light_write_at_the_off_step_sizes_and_small_prefills(m, up, monkeypatch):
    from sglang_dynspec.adapters import draft_kv, offstep_graphs

    asked = []
    monkeypatch.setattr(draft_kv, "prepare", lambda runner, topk, who, mode, sizes, contexts: asked.append(sizes))
    for graphs, expected in (({"runner": SimpleNamespace(capture_bs=[4, 1, 2])}, [1, 2, 4, *m.PREFILL_WRITE_ROWS]),
                             (None, None)):  # no off-step graphs: the write runs eager everywhere
        monkeypatch.setattr(offstep_graphs, "prepare", lambda worker, need_hidden, enabled, g=graphs: g)
        w = _worker(up)
        w._draft_worker = _DraftRecorder()
        m.prepare(w, DynspecSettings())
        assert asked[-1] == expected
