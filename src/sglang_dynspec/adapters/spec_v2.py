"""Speculation-off step for ``EAGLEWorkerV2`` (``sglang.srt.speculative.eagle_worker_v2``).

An off-step behaves like a normal speculative step in which the target rejected every draft:
the target runs one plain DECODE token per request (input = previous bonus token, position =
``seq_lens``, ``spec_info=None``), and the upstream decode draft-extend then fills the draft KV
cache over the usual ``num_draft_tokens`` window with only window slot 0 meaningful
(``accept_lens == 1``).  The result carries exactly the fields the installed release's scheduler
reads for a spec-v2 step, so the FutureMap / result processor / KV accounting run unchanged:
one token is committed per request, and the over-allocated slots stay owned by the request.

Two input shapes exist (see ``compat.v2_input_kind``):

* ``"model_worker_batch"`` (0.5.9-0.5.12; on 0.5.9/0.5.10 only with ``SGLANG_ENABLE_SPEC_V2=1``):
  ``forward_batch_generation(model_worker_batch)``, overlap scheduler only, runs on the forward
  stream; the next draft input carries ``new_seq_lens`` + ``verify_done``.
* ``"schedule_batch"`` (>= 0.5.13): ``forward_batch_generation(batch, on_publish=None, ...)``
  inside ``Scheduler._forward_isolation``; ``new_seq_lens`` travels on the result and
  ``on_publish(new_seq_lens)`` must be called before the draft-extend (an off-step calls it, like
  ``verify_done`` on the older shape, before its target decode: the lengths are known up front).

Graphs: a TARGET_VERIFY graph runner must never replay a DECODE batch (the graph guard in
``runtime``).  ``prepare`` captures a separate set of DECODE graphs for the target on a fresh
attention backend and swaps them in for the off-step (``offstep_graphs``), where the release's
graph runner accepts its own backend; elsewhere the off-step target decode runs eager.
"""

from __future__ import annotations

import dataclasses
import inspect
import logging
from dataclasses import dataclass
from typing import Any

from .. import compat
from ..controller import StepMode
from . import draft_kv, kernel_warmup, offstep_graphs, state
from .draft_kv import LightSync
from .profiler_ranges import span
from .state import AdapterState

logger = logging.getLogger("sglang_dynspec.adapters.spec_v2")

# Row counts the light draft write is also recorded at for light prefills, beyond the off-step
# batch sizes: prompts of a few requests (row 4's 256-token prompts arrive 1-8 per prefill batch).
PREFILL_WRITE_ROWS = (384, 512, 768, 1024, 1536, 2048)

FORWARD_TARGET = f"{compat.V2_MODULE}.{compat.V2_CLASS}.forward_batch_generation"


@dataclass
class SpecV2State(AdapterState):
    """This adapter's per-worker state (``state.py``): also why the worker can never run an off-step."""

    unsupported_checked: bool = False
    unsupported: str | None = None
    light_prefill: bool = False  # prefills while off write the draft KV directly (prepare)
    plain_batches: bool = False  # off-steps run as plain decode batches (plain_batch, prepare)


def _torch():
    import torch

    return torch


def _defines_forward(cls) -> type | None:
    """The class in ``cls``'s MRO whose own __dict__ defines forward_batch_generation."""
    for klass in cls.__mro__:
        if "forward_batch_generation" in vars(klass):
            return klass
    return None


_TYPE_OK: dict[type, bool] = {}


def _is_plain_v2_worker(worker) -> bool:
    """EAGLEWorkerV2 or a subclass that inherits its forward_batch_generation (StandaloneWorkerV2).
    Subclasses that override it (FrozenKVMTPWorkerV2, ...) are left alone."""
    cls = type(worker)
    ok = _TYPE_OK.get(cls)
    if ok is None:
        try:
            ok = _defines_forward(cls) is compat.v2_worker_class()
        except Exception:  # noqa: BLE001 - module missing or odd class: not ours
            ok = False
        _TYPE_OK[cls] = ok
    return ok


def unsupported_reason(worker) -> str | None:
    """Why this worker can never run an off-step (cached), or None."""
    st = state.of(worker, SpecV2State)
    if st.unsupported_checked:
        return st.unsupported
    reason = _compute_unsupported_reason(worker)
    st.unsupported_checked, st.unsupported = True, reason or None
    if reason:
        logger.warning("dynspec: off-steps disabled on this %s: %s", type(worker).__name__, reason)
    return reason


def _compute_unsupported_reason(worker) -> str | None:
    if not _is_plain_v2_worker(worker):
        return "worker class overrides forward_batch_generation"
    algo_problem = compat.adapter_algorithm_problem(getattr(worker, "speculative_algorithm", None))
    if algo_problem:
        return algo_problem
    sa = worker.server_args
    if getattr(sa, "enable_dp_attention", False):
        return "DP attention (off-step would need all DP ranks to agree)"
    if getattr(sa, "pp_size", 1) > 1:
        return "pipeline parallelism"
    if getattr(sa, "enable_two_batch_overlap", False):
        return "two-batch overlap"
    if compat.target_is_hybrid(worker.target_worker.model_runner, compat.V2_HYBRID_TARGET_MARKERS):
        return "hybrid mamba/GDN target (verify-time state commit not replicated)"
    if compat.target_kv_is_compressed(worker.token_to_kv_pool_allocator.get_kvcache()):
        return "compressed-KV target (draft-state cleanup not replicated)"
    if not compat.target_capture_channel():
        return "no way to request target hidden-state capture on this release"
    return None


def _batch_wants_hidden_states(batch) -> bool:
    val = getattr(batch, "return_hidden_states", None)
    if val is not None:
        return bool(val)
    reqs = getattr(batch, "reqs", None) or ()
    return any(getattr(r, "return_hidden_states", False) for r in reqs)


def _batch_has_grammar(batch) -> bool:
    if getattr(batch, "has_grammar", False):
        return True
    si = getattr(batch, "sampling_info", None)
    return bool(getattr(si, "grammars", None))


def decline_reason(batch) -> str | None:
    """Why a decode batch must speculate whatever the policy says (None: it may run off): its
    requests' post-processing differs between a verify and a plain decode in ways not replicated
    here, or (plain batches) a plain batch on a speculative worker samples without the grammar
    delay.  Reads the batch the worker receives and the scheduler's running batch alike."""
    if getattr(batch, "return_logprob", False):
        return "logprobs"
    if getattr(batch, "global_num_tokens", None) is not None:
        return "DP attention"
    if _batch_has_grammar(batch):
        return "grammar"
    if _batch_wants_hidden_states(batch) or getattr(batch, "return_hidden_states_before_norm", False):
        return "hidden states"
    return None


def decode_batch_size(worker, batch) -> int | None:
    """Rows of ``batch`` when it is a pure decode batch this adapter can run without speculation.

    No GPU sync: only Python attributes and tensor shapes are read.  Declines (None) batches whose
    post-processing differs between a verify and a plain decode in ways not replicated here:
    logprobs, returned hidden states, grammar (constrained decoding), DP-attention padding.
    """
    if not _is_plain_v2_worker(worker):
        return None
    fm = getattr(batch, "forward_mode", None)
    if fm is None or not fm.is_decode():
        return None
    if getattr(batch, "is_extend_in_batch", False):
        return None
    si = getattr(batch, "spec_info", None)
    if si is None:
        return None
    is_draft = getattr(si, "is_draft_input", None)
    if callable(is_draft) and not is_draft():
        return None  # e.g. a pre-built verify input (PP relay, 0.5.23)
    if decline_reason(batch) or unsupported_reason(worker):
        return None
    seq_lens = getattr(batch, "seq_lens", None)
    if seq_lens is None:
        return None
    bs = int(seq_lens.shape[0])
    return bs if bs > 0 else None


def _needs_hidden(worker) -> bool:
    return compat.draft_reads_target_hidden(worker.speculative_algorithm)


def _capture_mode_for_target(worker):
    # The draft-extend reads the target hidden states; FULL == LAST for one token per request,
    # and FULL is what verify uses and what the off-step graphs capture.
    return offstep_graphs.hidden_mode(state.of(worker, SpecV2State).graphs, _needs_hidden(worker))


def _window_locs(worker, batch, ndt: int):
    """KV slots of positions [seq_lens, seq_lens + ndt) per request (already allocated by
    prepare_for_decode's over-allocation), flattened request-major, int64."""
    torch = _torch()
    seq_lens = batch.seq_lens
    req_to_token = worker.req_to_token_pool.req_to_token
    offs = seq_lens.to(torch.int64).unsqueeze(1) + torch.arange(ndt, device=seq_lens.device, dtype=torch.int64)
    rows = batch.req_pool_indices.to(torch.int64).unsqueeze(1)
    return req_to_token[rows, offs].reshape(-1).to(torch.int64)


def _ask_for_hidden(worker, overrides: dict) -> dict:
    """Ask the target for the hidden states the draft reads, through whichever channel this
    release reads (with spec_info=None nothing else asks, and the draft would get None): adds the
    batch field to ``overrides``, or returns the keyword arguments of the target's call."""
    mode = _capture_mode_for_target(worker)
    if compat.target_capture_channel() == "kwarg":
        return {"capture_hidden_mode": mode}
    overrides["capture_hidden_mode"] = mode
    return {}


def _offstep_graphs_active(worker):
    return offstep_graphs.active(worker.target_worker.model_runner, state.of(worker, SpecV2State).graphs)


def _target_decode(worker, batch, kind: str, bonus, window, ndt: int, new_seq_lens):
    """1. One plain DECODE token per request on the target (eager unless off-step graphs were
    captured); returns (GenerationBatchResult, copied batch or None)."""
    from sglang.srt.model_executor.forward_batch_info import ForwardMode

    torch = _torch()
    bs = int(batch.seq_lens.shape[0])
    overrides = {
        "forward_mode": ForwardMode.DECODE,
        "input_ids": bonus.to(torch.int64),
        # Slot of position seq_lens: window slot 0 of each request.
        "out_cache_loc": window.view(bs, ndt)[:, 0].contiguous(),
        "seq_lens": new_seq_lens,
        "spec_info": None,
    }
    call_kwargs = _ask_for_hidden(worker, overrides)
    if getattr(batch, "seq_lens_cpu", None) is not None:
        overrides["seq_lens_cpu"] = batch.seq_lens_cpu + 1
    if getattr(batch, "seq_lens_sum", None) is not None:
        overrides["seq_lens_sum"] = batch.seq_lens_sum + bs
    return _run_target(worker, batch, kind, overrides, call_kwargs)


def _run_target(worker, batch, kind: str, overrides: dict, call_kwargs: dict, copy: bool = True):
    """The target's forward of ``batch`` with ``overrides``; returns (GenerationBatchResult,
    copied batch or None).  A ModelWorkerBatch is copied (its tensors alias the ScheduleBatch's)
    where ``copy`` asks for it (a speculative off-step's draft-extend reads the copy); otherwise
    the batch is set, run and restored (a speculative off-step's draft-extend needs the old
    values; run_batch restores a speculative batch anyway, and keeps no copy of a plain one)."""
    tw = worker.target_worker
    if kind == "model_worker_batch" and copy:
        tb = dataclasses.replace(batch, **overrides)
        with _offstep_graphs_active(worker):
            out = tw.forward_batch_generation(tb, **call_kwargs)
        return out, tb
    saved = {k: getattr(batch, k) for k in overrides}
    try:
        for k, v in overrides.items():
            setattr(batch, k, v)
        with _offstep_graphs_active(worker):
            out = tw.forward_batch_generation(batch, **call_kwargs)
    finally:
        for k, v in saved.items():
            setattr(batch, k, v)
    return out, None


def _record_stream(stream, *tensors) -> None:
    # Keeps the caching allocator from reusing memory another stream still reads.
    for t in tensors:
        if t is not None and t.is_cuda:
            t.record_stream(stream)


def forward_off(worker, batch, mode: StepMode, *args, **kwargs):
    """Run one decode step of ``worker`` without speculation (see module docstring).

    ``mode``: ``StepMode.RESUME`` refreshes the draft through its draft-extend forward even
    where the light sync (``draft_kv``) is available (the runtime's resume step after light ones).
    """
    mod = compat.v2_worker_module()
    kind = compat.v2_input_kind()
    on_publish = _on_publish_arg(kind, args, kwargs)
    device_mod, fwd_stream = _forward_stream(batch)
    ndt = int(worker.speculative_num_draft_tokens)
    st = state.of(worker, SpecV2State)
    light = st.light is not None and mode is not StepMode.RESUME
    _log_first_off(worker, st, kind, int(batch.seq_lens.shape[0]), ndt)
    bonus_field = compat.draft_input_bonus_field(mod.EagleDraftInput)
    bonus = getattr(batch.spec_info, bonus_field)
    bs = int(batch.seq_lens.shape[0])
    res_fields = compat.dataclass_field_names(mod.GenerationBatchResult)
    # Light: only the slot of position seq_lens is written.  Full: the draft-extend also fills
    # the rest of the verify window (over-allocated by the scheduler, beyond new_seq_lens).
    span_w = 1 if light else ndt
    window = _window_locs(worker, batch, span_w)
    new_seq_lens, verify_done = _publish_seq_lens(batch, device_mod, res_fields, on_publish)  # 0
    with span("dynspec.offstep.target"):  # 1
        out, target_batch = _target_decode(worker, batch, kind, bonus, window, span_w, new_seq_lens)
    new_tokens, target_hidden, stride, predict, accept_lens = _rejected_verify(out, light, res_fields, ndt, bs)  # 2
    next_draft_input = _next_draft_input(mod.EagleDraftInput, bonus_field, new_tokens, st.light if light else None,
                                         bs, res_fields, new_seq_lens, verify_done)
    result = _result(mod.GenerationBatchResult, out, predict, stride, next_draft_input, accept_lens, new_seq_lens,
                     keep_alive=[target_batch] if target_batch is not None else [window])
    if light:  # 3a
        _sync_draft_light(worker, st, batch, new_tokens, target_hidden, window)
    else:  # 3b
        _sync_draft_full(worker, st, batch, result, window, predict, accept_lens, fwd_stream)
    return result


def _on_publish_arg(kind: str, args, kwargs):
    """The ``on_publish`` callback the scheduler passed (``schedule_batch`` input only), else None."""
    if kind != "schedule_batch":
        return None
    on_publish = kwargs.get("on_publish", args[0] if args else None)
    if kwargs.get("pp_proxy_tensors") is not None:
        raise RuntimeError("dynspec spec_v2 off-step: pp_proxy_tensors is not supported")
    return on_publish


def _forward_stream(batch):
    """The device module and the current (forward) stream, which keeps ``seq_lens`` /
    ``req_pool_indices`` alive: they may come from the schedule stream (as in verify())."""
    device_mod = _torch().get_device_module(batch.seq_lens.device)
    fwd_stream = device_mod.current_stream()
    _record_stream(fwd_stream, batch.seq_lens, batch.req_pool_indices)
    return device_mod, fwd_stream


def _log_first_off(worker, st: SpecV2State, kind: str, bs: int, ndt: int) -> None:
    if not st.logged_first_off:
        st.logged_first_off = True
        logger.info(
            "dynspec: first off-step on %s (%s input, bs=%d, num_draft_tokens=%d, target graphs=%s, draft sync=%s)",
            type(worker).__name__, kind, bs, ndt, bool(st.graphs), "light" if st.light is not None else "full",
        )


def _publish_seq_lens(batch, device_mod, res_fields, on_publish):
    """0. Publish the next step's seq_lens before the target runs; returns (new_seq_lens,
    verify_done event or None).

    A verify's lengths depend on its outcome, so SGLang publishes them after it; an off-step's
    are seq_lens + 1, known now.  The scheduler blocks on this publication (0.5.11-0.5.12:
    verify_done, waited for in prepare_for_decode / filter_batch; >= 0.5.13: on_publish, which
    gates its seq_lens copy) and then prepares the next batch while the GPU still runs this one,
    as for plain decode.  All GPU work stays ordered on the forward stream, so nothing the next
    batch runs can overtake it."""
    new_seq_lens = batch.seq_lens + 1
    verify_done = None
    if "new_seq_lens" not in res_fields:
        verify_done = device_mod.Event()
        verify_done.record()
    elif on_publish is not None:
        on_publish(new_seq_lens)
    return new_seq_lens, verify_done


def _rejected_verify(out, light: bool, res_fields, ndt: int, bs: int):
    """2. The tokens of a verify whose drafts were all rejected, from the target decode ``out``:
    returns (new tokens, target hidden states, row stride, per-row tokens, accept_lens).

    Releases whose result carries its own row stride (0.5.12+) take one row per request after
    a light sync; otherwise every per-token tensor has num_draft_tokens rows per request, the
    real value in row i*ndt (the full sync pads ``out``'s hidden states the same way)."""
    torch = _torch()
    logits_output = out.logits_output
    new_tokens = out.next_token_ids.to(torch.int32)
    target_hidden = logits_output.hidden_states
    stride = 1 if (light and "speculative_num_draft_tokens" in res_fields) else ndt
    if stride > 1:
        predict = new_tokens.repeat_interleave(stride)
        if not light and target_hidden is not None:
            logits_output.hidden_states = target_hidden.repeat_interleave(stride, dim=0)
    else:
        predict = new_tokens
    accept_lens = torch.ones(bs, dtype=torch.int32, device=new_tokens.device)
    return new_tokens, target_hidden, stride, predict, accept_lens


def _next_draft_input(draft_input_cls, bonus_field: str, new_tokens, light: LightSync | None, bs: int, res_fields,
                      new_seq_lens, verify_done, **extra):
    """2. The next step's draft input: the new tokens, placeholder draft outputs after a light
    sync (never drafted from: the runtime's resume step replaces them before speculating), and
    on <= 0.5.12 new_seq_lens + verify_done (recorded in step 0); ``extra``: further fields, kept
    where the installed class declares them."""
    di_fields = compat.dataclass_field_names(draft_input_cls)
    nd_kwargs = {bonus_field: new_tokens, **compat.only_fields(draft_input_cls, **extra)}
    if light is not None:
        nd_kwargs.update(light.placeholder_rows(bs, new_tokens.device))
    if "new_seq_lens" not in res_fields:
        nd_kwargs["new_seq_lens"] = new_seq_lens
        if "verify_done" in di_fields:
            nd_kwargs["verify_done"] = verify_done
    return draft_input_cls(**nd_kwargs)


def _result(result_cls, out, predict, stride: int, next_draft_input, accept_lens, new_seq_lens, keep_alive):
    """2. The GenerationBatchResult, with the fields the installed release declares."""
    return result_cls(
        **compat.only_fields(
            result_cls,
            logits_output=out.logits_output,
            next_token_ids=predict,
            can_run_cuda_graph=bool(out.can_run_cuda_graph),
            # 0.5.12+ only; older schedulers take the row stride from
            # worker.speculative_num_draft_tokens, which is then this same value.
            speculative_num_draft_tokens=stride,
            next_draft_input=next_draft_input,
            accept_lens=accept_lens,
            new_seq_lens=new_seq_lens,
            routed_experts_output=getattr(out, "routed_experts_output", None),
            indexer_topk_output=getattr(out, "indexer_topk_output", None),
            extra_keep_alive_refs=keep_alive,
        )
    )


def _sync_draft_light(worker, st: SpecV2State, batch, new_tokens, target_hidden, window) -> None:
    """3a. Draft KV of position seq_lens from (target hidden there, new token), nothing else."""
    st.light_pending = True
    with span("dynspec.offstep.draft_kv"):
        st.light.write(worker.draft_worker.draft_runner, new_tokens, target_hidden, batch.seq_lens, window)


def _sync_draft_full(worker, st: SpecV2State, batch, result, window, predict, accept_lens, fwd_stream) -> None:
    """3b. Full sync through the decode draft-extend: writes draft KV at position seq_lens from
    (target hidden at seq_lens, new token) and yields topk_p / topk_index / hidden_states for
    the next draft round (select_index = i*ndt + accept_lens - 1)."""
    dw = worker.draft_worker
    st.light_pending = False
    batch.out_cache_loc = window
    plan_stream = getattr(dw, "plan_stream", None)
    if plan_stream is not None:
        # The draft-extend plans on plan_stream and reads tensors made here on fwd_stream.
        plan_stream.wait_stream(fwd_stream)
        _record_stream(plan_stream, window, predict, accept_lens, batch.seq_lens)
    with span("dynspec.offstep.draft_sync"), compat.draft_contexts(worker):
        dw._draft_extend_for_decode(batch, result)


def runs_plain_batches(worker) -> bool:
    """Whether off-steps of this worker run as plain decode batches (``plain_batch``): set at prepare."""
    return state.of(worker, SpecV2State).plain_batches


def plain_batch_problem(st: SpecV2State, settings) -> str | None:
    """Why off-steps of this worker run as speculative batches (None: as plain ones).  A plain
    step has no verify window for the draft-extend to fill: it needs the light sync."""
    return _light_feature_problem(st, "offstep_batch", settings.offstep_batch, "plain",
                                  compat.plain_batch_release_problem)


def _light_feature_problem(st: SpecV2State, setting: str, value: str, wanted: str, release_problem) -> str | None:
    """Why a feature built on the light draft sync is off: its setting, no light sync, or the release."""
    if value != wanted:
        return f"{setting}={value}"
    if st.light is None:
        return "the off-steps have no light draft sync (offstep_draft_sync or the draft's shape)"
    return release_problem()


def forward_plain(worker, batch, future_map):
    """Run a plain decode batch (``plain_batch``) that reached the speculative worker: the
    target's own decode step, then the light draft write of each row's position.  Returns the
    target's result, which the scheduler processes as a plain server's."""
    st = state.of(worker, SpecV2State)
    _log_first_off(worker, st, "plain batch", int(batch.seq_lens.shape[0]), 1)
    overrides = {"input_ids": _plain_input_ids(batch, future_map)}
    call_kwargs = _ask_for_hidden(worker, overrides)
    with span("dynspec.offstep.target"):
        # (no copy: a plain step has no draft-extend to read one; a copy of 0.5.12's ModelWorkerBatch
        # cost ~15 µs of scheduler CPU per step on the H200 host)
        out, _ = _run_target(worker, batch, compat.v2_input_kind(), overrides, call_kwargs, copy=False)
    st.light_pending = True
    # The batch's lengths already count this step's token: its position is one less.
    with span("dynspec.offstep.draft_kv"):
        st.light.write(worker.draft_worker.draft_runner, out.next_token_ids, out.logits_output.hidden_states,
                       batch.seq_lens, batch.out_cache_loc, position_offset=-1)
    # A plain server returns no hidden states unless asked (declined here): drop the target's.
    out.logits_output.hidden_states = None
    return out


def _plain_input_ids(batch, future_map):
    """The plain batch's input ids (int64).  The FutureMap of a speculative server resolves only
    draft inputs: the previous step's tokens (plain, speculative or prefill) sit in its token
    buffer, 0.5.12 under the slots its input ids name negated, 0.5.15 under each row's
    req_pool_idx (the scheduler leaves a decode batch's input ids unset there)."""
    torch = _torch()
    if compat.future_map_by_pool():
        return future_map.output_tokens_buf[batch.req_pool_indices].to(torch.int64)
    ids, buf = batch.input_ids, future_map.bonus_tokens_buf
    resolve = compat.future_token_resolver()
    if resolve is not None and ids.dtype == buf.dtype == torch.int64:
        # In place, one kernel, as a plain server's run_batch resolves its own: seven small ops
        # here cost ~0.1 ms of scheduler CPU per step on the H200 host (py-spy, pair1y-r4).
        resolve(ids, buf)
        return ids
    tokens = buf[torch.clamp(-ids, min=0)].to(torch.int64)
    return torch.where(ids < 0, tokens, ids.to(torch.int64))


def forward_prefill_off(worker, batch, *args, **kwargs):
    """Run an extend batch that arrives while speculation is off without the draft's extend
    forward; None (nothing run) where it must run upstream.

    The target prefills as upstream (hidden states of every token captured); on a ScheduleBatch
    release the batch's lengths are then published, as upstream does before its draft extend.
    The draft KV of each prompt token is then written directly (``draft_kv.write``, the light
    sync's writer): position p from the target's hidden state there and token p + 1, after a
    request's last prompt token its tail token (``compat.prefill_tail_tokens``).  That is all
    upstream's draft extend leaves a later step, besides the first draft round's seeds (top-k,
    draft hidden state), which stay placeholders here: the next step that would speculate runs a
    resume step first, as after a light off-step.  Skipped: the draft's per-request input
    rebuild, its batch and attention setup, its forward and top-k, which made a speculative
    server's prefill dearer than a plain one's.
    """
    st = state.of(worker, SpecV2State)
    if not st.light_prefill or not _plain_prefill(batch):
        return None
    from sglang.srt.model_executor.forward_batch_info import CaptureHiddenMode

    on_publish = _on_publish_arg(compat.v2_input_kind(), args, kwargs)
    mod = compat.v2_worker_module()
    res_fields = compat.dataclass_field_names(mod.GenerationBatchResult)
    n = int(batch.input_ids.shape[0])
    batch.capture_hidden_mode = CaptureHiddenMode.FULL  # as upstream: every prompt token's hidden state
    with span("dynspec.prefill.target"):
        out = worker.target_worker.forward_batch_generation(batch)
    hidden = out.logits_output.hidden_states
    if hidden is None or int(hidden.shape[0]) != n:
        raise RuntimeError(f"dynspec light prefill: the target returned hidden states of shape "
                           f"{None if hidden is None else tuple(hidden.shape)} for {n} prompt tokens")
    if "new_seq_lens" in res_fields:
        # The next step starts from the batch's own lengths; published at target end, as upstream.
        out.new_seq_lens = batch.seq_lens
        if on_publish is not None:
            on_publish(out.new_seq_lens)
    extend_lens, prefix_lens = compat.prefill_lens(batch)
    tokens, positions = _prefill_draft_rows(batch.input_ids, extend_lens, prefix_lens,
                                            compat.prefill_tail_tokens(batch, out.next_token_ids))
    st.light_pending = True
    # A recorded write where one holds the prompt rows (PREFILL_WRITE_ROWS), else eager inside the
    # contexts set at prepare.
    with span("dynspec.prefill.draft_kv"):
        st.light.write(worker.draft_worker.draft_runner, tokens, hidden, positions, batch.out_cache_loc)
    # Upstream's prefill draft input (its lengths are the batch's own), seeds as placeholders.
    out.next_draft_input = _next_draft_input(
        mod.EagleDraftInput, compat.draft_input_bonus_field(mod.EagleDraftInput), out.next_token_ids, st.light,
        int(batch.seq_lens.shape[0]), res_fields, batch.seq_lens, None,
        num_tokens_per_req=1, num_tokens_for_logprob_per_req=1)
    return out


def _plain_prefill(batch) -> bool:
    """A pure EXTEND batch of token ids (no embeddings, no multimodal inputs) whose per-request
    lengths add up to its tokens and whose cached prefixes are listed; anything else prefills upstream."""
    fm = getattr(batch, "forward_mode", None)
    if fm is None or getattr(fm, "name", None) != "EXTEND":
        return False
    if getattr(batch, "input_embeds", None) is not None or getattr(batch, "replace_embeds", None) is not None:
        return False
    if any(mm is not None for mm in (getattr(batch, "multimodal_inputs", None) or ())):
        return False
    lens, prefix = compat.prefill_lens(batch)
    ids = getattr(batch, "input_ids", None)
    if not lens or prefix is None or ids is None or getattr(batch, "out_cache_loc", None) is None:
        return False
    return len(lens) == len(prefix) == int(batch.seq_lens.shape[0]) and sum(lens) == int(ids.shape[0])


def _prefill_draft_rows(ids, extend_lens, prefix_lens, tail_tokens):
    """The draft's (token, position) for every prompt token of an extend batch of token ``ids``:
    position p takes token p + 1, and each request's last position its tail token.  The
    positions and the rows of the last tokens come from the CPU lengths in one asynchronous copy
    from pinned memory; three GPU ops make the tokens.  (Built on the GPU, as before, it took ten
    small ops: ~0.6 ms of scheduler CPU per prefill batch on the H200 host, py-spy in pair1y-r4.)"""
    import numpy as np

    torch = _torch()
    dev = ids.device
    n = int(ids.shape[0])
    lens = np.asarray(extend_lens, dtype=np.int64)
    ends = np.cumsum(lens)
    # position of token i: i less its request's first row, plus that request's cached prefix
    shift = np.asarray(prefix_lens, dtype=np.int64) - (ends - lens)
    host = torch.from_numpy(np.concatenate([np.arange(n, dtype=np.int64) + np.repeat(shift, lens), ends - 1]))
    if dev.type == "cuda":
        host = host.pin_memory()  # (the caching host allocator keeps it until the copy has run)
    rows = host.to(dev, non_blocking=True)
    positions, last = rows[:n], rows[n:]
    tokens = torch.empty(n, dtype=torch.int64, device=dev)
    tokens[:-1] = ids[1:]
    tokens[last] = tail_tokens.to(torch.int64)
    return tokens, positions


resume_pending = state.resume_pending  # the Adapter protocol's, shared by both paths


def offstep_graphs_unsupported() -> str | None:
    """Why this release cannot get off-step DECODE graphs (None: it can), from the installed classes."""
    return compat.offstep_graphs_release_problem(need_hidden=True)


def prepare(worker, settings) -> None:
    """One-time setup before serving: off-step DECODE graphs and the light draft sync, where
    ``settings`` (DynspecSettings) and the release allow."""
    st = state.of(worker, SpecV2State)
    if st.prepared:
        return
    st.prepared = True
    if unsupported_reason(worker):
        return
    st.graphs = offstep_graphs.prepare(worker, _needs_hidden(worker), settings.offstep_graphs)
    sizes = offstep_graphs.capture_sizes(st.graphs)
    if sizes:
        # The light prefill's write too (a prompt token per row): small prefill batches replay
        # one graph instead of a dozen eager ops and their Python (larger ones run eager).
        sizes = sorted(set(sizes) | set(PREFILL_WRITE_ROWS))
    st.light = draft_kv.prepare(getattr(getattr(worker, "draft_worker", None), "draft_runner", None),
                                getattr(worker, "topk", 1), "spec_v2", settings.offstep_draft_sync,
                                sizes, lambda: compat.draft_contexts(worker))
    problem = light_prefill_problem(st, settings)
    st.light_prefill = problem is None
    logger.info("dynspec spec_v2: prefills while off %s", "write the draft KV directly (light)" if problem is None
                else f"run the draft's extend forward ({problem})")
    problem = plain_batch_problem(st, settings)
    st.plain_batches = problem is None
    logger.info("dynspec spec_v2: off-steps run as %s", "plain decode batches" if problem is None
                else f"speculative batches ({problem})")
    _warm_spec_kernels(worker)


def _warm_spec_kernels(worker) -> None:
    """Compile the speculative step's batch-size-keyed Triton kernels now (``kernel_warmup``), then
    log any Triton compile that still stalls a step while serving."""
    watching = kernel_warmup.WATCH.install()
    try:
        model_runner = worker.target_worker.model_runner
        shape = kernel_warmup.WarmupShape(
            max_batch=int(model_runner.max_running_requests),
            draft_tokens=int(worker.speculative_num_draft_tokens),
            topk=int(getattr(worker, "topk", 1) or 1),
            accept_width=int(worker.speculative_num_steps) + 1,
        )
        backends = dict(zip(kernel_warmup.BACKEND_KERNELS,
                            (compat.triton_kv_splits(model_runner), compat.draft_kv_indices(worker))))
        kernels = {**compat.spec_step_kernels(), **{name: fn for name, fn in backends.items() if fn is not None}}
        report = kernel_warmup.warm(kernels, model_runner.req_to_token_pool.req_to_token,
                                    model_runner.token_to_kv_pool_allocator, shape)
    except Exception:  # noqa: BLE001 - without the warm-up, first uses compile lazily as before
        logger.exception("dynspec spec_v2: the speculative kernels' warm-up failed; they compile on first use")
        return
    finally:
        kernel_warmup.WATCH.serving = watching
    logger.info("dynspec spec_v2: warmed the speculative step's Triton kernels for batch sizes 1-%d (%d of them) "
                "in %.1f s (%d variants compiled or loaded)%s", shape.max_batch, report.batch_sizes, report.seconds,
                len(report.compiled), "" if watching else "; this Triton cannot report later compiles")
    for name, why in report.failed.items():
        logger.warning("dynspec spec_v2: %s was not warmed (%s); it compiles on first use", name, why)


def light_prefill_problem(st: SpecV2State, settings) -> str | None:
    """Why prefills while off run the draft's extend forward on this worker (None: light)."""
    return _light_feature_problem(st, "prefill_draft_sync", settings.prefill_draft_sync, "light",
                                  compat.light_prefill_release_problem)


# --------------------------------------------------------------------------------------------


def describe(worker=None) -> dict[str, Any]:
    """What this adapter supports on the installed SGLang (for the CLI doctor); the same for
    every worker (``worker`` is accepted for the adapter protocol)."""
    info: dict[str, Any] = {"adapter": "spec_v2", "hook": FORWARD_TARGET}
    try:
        cls = compat.v2_worker_class()
    except Exception as exc:  # noqa: BLE001
        info.update(available=False, reason=f"{type(exc).__name__}: {exc}")
        return info
    kind = compat.v2_input_kind()
    mod = compat.v2_worker_module()
    prefill_problem = compat.light_prefill_release_problem()
    plain_problem = compat.plain_batch_release_problem()
    info.update(
        available=True,
        input=kind,
        forward_params=list(inspect.signature(inspect.unwrap(cls.forward_batch_generation)).parameters)[1:],
        bonus_field=compat.draft_input_bonus_field(mod.EagleDraftInput),
        new_seq_lens_on=(
            "result" if "new_seq_lens" in compat.dataclass_field_names(mod.GenerationBatchResult) else "draft_input"
        ),
        graph_guard=compat.graph_guard_target(),
        target_capture=compat.target_capture_channel(),
        offstep_graphs=offstep_graphs_unsupported() or "capture DECODE graphs on a separate backend",
        offstep_draft_sync="light for single-layer EAGLE-3 drafts (resume step before speculating), else full",
        prefill_draft_sync=(f"full ({prefill_problem})" if prefill_problem
                            else "light where the off-steps sync light (resume step before speculating)"),
        offstep_batch=(f"speculative ({plain_problem})" if plain_problem
                       else "plain where the off-steps sync light (the scheduler's plain decode path)"),
        topk_gt_1=(kind == "schedule_batch"),  # <= 0.5.12 routes topk > 1 to the v1 worker
        declines=["return_logprob", "return_hidden_states", "grammar", "DP attention", "PP", "TBO", "mamba/GDN"],
    )
    return info
