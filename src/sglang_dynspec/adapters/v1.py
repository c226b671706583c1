"""Speculation "off" for the v1 worker, ``sglang.srt.speculative.eagle_worker.EAGLEWorker``.

Releases 0.5.9 - 0.5.12 (the class is gone in 0.5.13), non-overlap scheduler only.

On this path the scheduler leaves decode preparation to the worker: it neither allocates KV
slots nor advances ``seq_lens`` (``ScheduleBatch.prepare_for_decode`` returns early for any
speculative algorithm).  At step start ``batch.spec_info`` is an ``EagleDraftInput`` whose
last-token field (``bonus_tokens`` on 0.5.12, ``verified_id`` before) holds each request's
newest output token, which has no KV yet in either model.

An off-step therefore does, in order:

1. what the worker's decode preprocessing does besides drafting: step counter, penalties;
2. one KV slot per request via SGLang's ``alloc_for_decode`` (also writes ``req_to_token``
   and runs the SWA eviction), then ``seq_lens`` / ``kv_*_len`` bookkeeping like a plain
   decode;
3. a plain DECODE forward of the target with ``spec_info=None`` and hidden capture on
   (EAGLE-3 targets then return the concatenated aux states the draft needs), replayed from
   the off-step DECODE graphs ``prepare`` captured (``offstep_graphs``) where possible;
4. the per-request bookkeeping that ``EagleVerifyInput.verify`` normally does for v1
   (output ids, finish checks, grammar, reasoning tokens, logprobs): the v1 branch of the
   scheduler's result processor relies on the worker for it;
5. a draft-extend "after decode" with zero accepted drafts (one token per unfinished
   request) through the worker's own ``forward_draft_extend_after_decode``, so the draft KV
   for this position is written and the next batch can speculate again with full acceptance
   (or the light sync, ``draft_kv``, followed by a resume step before speculating);
6. the result: the target's own GenerationBatchResult with zero accepted drafts.

``forward_off`` is these steps in order, one function each.

Known limits (``decode_batch_size`` returns ``None`` for them, so upstream runs): DP
attention (every DP rank must take the same branch; idle ranks run upstream), hybrid
Mamba / linear-attention targets (their state tracking assumes verify), batches without a
ready draft input.
"""

from __future__ import annotations

import logging
from typing import Any

from .. import compat
from ..controller import StepMode
from . import draft_kv, offstep_graphs, state
from .profiler_ranges import span
from .state import AdapterState

logger = logging.getLogger(__name__)

WORKER_CLASS = "sglang.srt.speculative.eagle_worker.EAGLEWorker"


def _as_list(x):
    if x is None:
        return None
    if hasattr(x, "tolist"):
        return x.tolist()
    return [v.tolist() if hasattr(v, "tolist") else v for v in x]


def decode_batch_size(worker, batch) -> int | None:
    """Rows of a pure decode batch that may run without speculation, else None (cheap)."""
    fm = getattr(batch, "forward_mode", None)
    if fm is None or not fm.is_decode() or getattr(batch, "is_extend_in_batch", False):
        return None
    if compat.adapter_algorithm_problem(getattr(worker, "speculative_algorithm", None)):
        return None
    server_args = getattr(worker, "server_args", None)
    if getattr(server_args, "enable_dp_attention", False):
        return None  # every DP rank (idle ones too) must take the same branch
    if getattr(batch, "is_spec_v2", False):
        return None
    spec_info = getattr(batch, "spec_info", None)
    if spec_info is None or getattr(spec_info, "topk_p", None) is None:
        return None
    if compat.last_token_ids(spec_info) is None:
        return None
    if compat.target_is_hybrid(worker.target_worker.model_runner):
        return None
    n = len(batch.reqs)
    return n if n > 0 else None


def forward_off(worker, batch, mode: StepMode, *args, **kwargs):
    """One plain target decode step + one-token draft KV sync; returns GenerationBatchResult.

    ``mode``: ``StepMode.RESUME`` refreshes the draft through its draft-extend even where the
    light sync (``draft_kv``) is available (the runtime's resume step after light ones).
    The numbered steps are the module docstring's.
    """
    st = state.of(worker)
    light = st.light is not None and mode is not StepMode.RESUME
    bs = len(batch.reqs)
    last = compat.last_token_ids(batch.spec_info)
    _cumulate_penalties(batch, last)  # 1
    out_cache_loc = _alloc_slots(batch, last)  # 2
    target_result = _target_decode(worker, batch, st.graphs)  # 3
    logits_output = target_result.logits_output
    next_token_ids = target_result.next_token_ids
    unfinished = _commit_tokens(batch, next_token_ids, logits_output)  # 4
    _log_first_off(worker, st, bs, light)
    _sync_draft(worker, batch, st, light, unfinished, next_token_ids, logits_output, out_cache_loc)  # 5
    return _fill_result(target_result, bs)  # 6


def _forward_mode():
    from sglang.srt.model_executor.forward_batch_info import ForwardMode

    return ForwardMode


def _cumulate_penalties(batch, last) -> None:
    """1. What the spec path's decode preprocessing does besides drafting."""
    import torch

    orch = batch.sampling_info.penalizer_orchestrator
    if orch.is_required:
        orch.cumulate_output_tokens(last.to(torch.int64))


def _alloc_slots(batch, last):
    """2. One slot per request (``alloc_for_decode`` also evicts SWA and writes
    ``req_to_token[seq_lens]``), and the lengths a plain decode step advances; returns the slots."""
    import torch
    from sglang.srt.mem_cache.common import alloc_for_decode

    out_cache_loc = alloc_for_decode(batch, token_per_req=1)
    for req in batch.reqs:
        if hasattr(req, "decode_batch_idx"):
            req.decode_batch_idx += 1
        req.kv_committed_len += 1
        req.kv_allocated_len += 1
    batch.out_cache_loc = out_cache_loc
    batch.input_ids = last.to(torch.int64)
    batch.seq_lens.add_(1)
    batch.seq_lens_cpu.add_(1)
    if getattr(batch, "orig_seq_lens", None) is not None:
        batch.orig_seq_lens.add_(1)
    # v1 verify leaves seq_lens_sum stale; the CPU copy is exact and costs no sync.
    batch.seq_lens_sum = int(batch.seq_lens_cpu.sum())
    return out_cache_loc


def _target_decode(worker, batch, graphs):
    """3. Plain target decode; returns the target's GenerationBatchResult.

    spec_info=None keeps positions / attention metadata on the non-speculative path.  The draft
    needs the hidden state: the off-step graphs' own mode (FULL, one row per request) when they
    exist, else LAST for the eager forward.  The verify graph never replays this batch (the
    graph guard in runtime)."""
    batch.spec_info = None
    batch.forward_mode = _forward_mode().DECODE
    mwb = batch.get_model_worker_batch()
    mwb.capture_hidden_mode = offstep_graphs.hidden_mode(graphs, _needs_hidden(worker), eager_mode="LAST")
    with span("dynspec.offstep.target"), offstep_graphs.active(worker.target_worker.model_runner, graphs):
        return worker.target_worker.forward_batch_generation(mwb)


def _commit_tokens(batch, next_token_ids, logits_output) -> list[int]:
    """4. Per-request bookkeeping the v1 result processor leaves to the worker (output ids,
    reasoning tokens, finish checks, grammar, logprobs); returns the unfinished rows."""
    reqs = batch.reqs
    tokens_cpu = next_token_ids.tolist()
    think_end_id = getattr(getattr(batch, "model_config", None), "think_end_id", None)
    unfinished = []
    for i, (req, tok) in enumerate(zip(reqs, tokens_cpu)):
        req.output_ids.append(tok)
        if (
            think_end_id is not None
            and getattr(req, "require_reasoning", False)
            and hasattr(req, "update_reasoning_tokens")  # 0.5.11+
        ):
            req.update_reasoning_tokens(tok, think_end_id)
        req.check_finished()
        if not req.finished() and req.grammar is not None:
            req.grammar.accept_token(tok)
            req.check_finished()
        if not req.finished():
            unfinished.append(i)
        if hasattr(req, "spec_verify_ct"):
            # Count the step so per-request "accept length" stays tokens per forward.
            req.spec_verify_ct += 1
    if batch.return_logprob:
        _append_logprobs(reqs, tokens_cpu, logits_output)
    return unfinished


def _log_first_off(worker, st: AdapterState, bs: int, light: bool) -> None:
    if not st.logged_first_off:
        st.logged_first_off = True
        logger.info("dynspec: first off-step on %s (bs=%d, target graphs=%s, draft sync=%s)",
                    type(worker).__name__, bs, bool(st.graphs), "light" if light else "full")


def _sync_draft(worker, batch, st: AdapterState, light: bool, unfinished: list[int], next_token_ids, logits_output,
                out_cache_loc) -> None:
    """5. Draft KV sync for the unfinished rows (spec_info must hold exactly those, in order);
    leaves the batch in DECODE mode."""
    keep = _keep_index(unfinished, batch)
    if not unfinished:
        _sync_draft_idle(worker, batch, st)
    elif light:
        _sync_draft_light(worker, batch, st, keep, len(unfinished), next_token_ids, logits_output.hidden_states,
                          out_cache_loc)
    else:
        _sync_draft_full(worker, batch, st, keep, unfinished, next_token_ids, logits_output.hidden_states,
                         out_cache_loc)
    batch.forward_mode = _forward_mode().DECODE


def _keep_index(unfinished: list[int], batch):
    """The rows the draft sync keeps: None for all of them (or none), else their index tensor."""
    if unfinished and len(unfinished) != len(batch.reqs):
        import torch

        return torch.tensor(unfinished, dtype=torch.int64, device=batch.seq_lens.device)
    return None


def _rows(t, keep):
    return t if keep is None or t is None else t[keep]


def _sync_draft_idle(worker, batch, st: AdapterState) -> None:
    """5. Every request finished: the worker's idle draft input, nothing left to resume."""
    worker._draft_preprocess_idle(batch)
    st.light_pending = False


def _sync_draft_light(worker, batch, st: AdapterState, keep, n_unfinished: int, next_token_ids, target_hidden,
                      out_cache_loc) -> None:
    """5. Light sync: the draft KV of every row's position seq_lens-1 (finished rows' slots are
    freed next, so writing them is harmless and saves an index), then a draft input for the
    unfinished rows that is never drafted from: the runtime runs a resume step first."""
    import torch

    with span("dynspec.offstep.draft_kv"):
        st.light.write(worker.draft_model_runner, next_token_ids, target_hidden, batch.seq_lens, out_cache_loc,
                       position_offset=-1)
    toks = _rows(next_token_ids, keep).to(torch.int32)
    ph = st.light.placeholder_rows(n_unfinished, toks.device)
    # Materialised: the scheduler filters and concatenates these rows in place.
    batch.spec_info = compat.build_draft_input(toks, **{k: v.contiguous() for k, v in ph.items()})
    st.light_pending = True


def _sync_draft_full(worker, batch, st: AdapterState, keep, unfinished: list[int], next_token_ids, target_hidden,
                     out_cache_loc) -> None:
    """5. Full sync: the worker's own draft-extend "after decode", one token per unfinished row."""
    import torch

    st.light_pending = False
    hidden = target_hidden if _needs_hidden(worker) else None
    if hidden is not None:
        width = compat.draft_extend_hidden_width(worker)
        if width is not None and hidden.shape[1] != width:
            # The draft-extend graph would silently keep a stale buffer; refuse instead.
            raise RuntimeError(
                f"sglang-dynspec: off-step target hidden width {hidden.shape[1]} != "
                f"draft-extend buffer width {width}"
            )
    extend_input = compat.build_draft_extend_input(
        hidden_states=_rows(hidden, keep),
        tokens=_rows(next_token_ids, keep).to(torch.int32),
        seq_lens=_rows(batch.seq_lens, keep),
        seq_lens_cpu=batch.seq_lens_cpu if keep is None else batch.seq_lens_cpu[unfinished],
        req_pool_indices=_rows(batch.req_pool_indices, keep),
    )
    batch.out_cache_loc = _rows(out_cache_loc, keep)
    batch.spec_info = extend_input
    batch.forward_mode = _forward_mode().DECODE
    with span("dynspec.offstep.draft_sync"), compat.spec_contexts(worker):
        next_draft_input = worker.forward_draft_extend_after_decode(batch)
    if next_draft_input is not None:  # 0.5.12 returns it; older releases mutate in place
        batch.spec_info = next_draft_input


def _fill_result(target_result, bs: int):
    """6. The result under the installed release's field names; the target result's extras
    (routed experts, metrics events) are kept by filling in the same object."""
    from sglang.srt.managers.utils import GenerationBatchResult

    if not isinstance(target_result, GenerationBatchResult):
        raise RuntimeError(f"sglang-dynspec: unexpected target result {type(target_result).__name__}")
    for name, value in compat.result_kwargs(GenerationBatchResult, bs=bs).items():
        setattr(target_result, name, value)
    return target_result


def _append_logprobs(reqs, tokens_cpu, logits_output) -> None:
    """Sampler-computed logprobs into the request lists (the v1 processor does not)."""
    vals = _as_list(logits_output.next_token_logprobs)
    top_val = _as_list(getattr(logits_output, "next_token_top_logprobs_val", None))
    top_idx = _as_list(getattr(logits_output, "next_token_top_logprobs_idx", None))
    ids_val = _as_list(getattr(logits_output, "next_token_token_ids_logprobs_val", None))
    ids_idx = _as_list(getattr(logits_output, "next_token_token_ids_logprobs_idx", None))
    for i, req in enumerate(reqs):
        if not req.return_logprob:
            continue
        req.output_token_logprobs_val.append(vals[i])
        req.output_token_logprobs_idx.append(tokens_cpu[i])
        if req.top_logprobs_num > 0 and top_val is not None:
            req.output_top_logprobs_val.append(top_val[i])
            req.output_top_logprobs_idx.append(top_idx[i])
        if req.token_ids_logprob is not None and ids_val is not None:
            req.output_token_ids_logprobs_val.append(ids_val[i])
            req.output_token_ids_logprobs_idx.append(ids_idx[i])


# --- per-worker state: off-step graphs (else eager target decode), light draft sync -------


def prepare(worker, settings) -> None:
    """One-time setup before serving: off-step DECODE graphs and the light draft sync, where
    ``settings`` (DynspecSettings) and the release allow."""
    st = state.of(worker)
    if st.prepared:
        return
    st.prepared = True  # first: a failing capture is not retried
    st.graphs = offstep_graphs.prepare(worker, _needs_hidden(worker), settings.offstep_graphs)
    st.light = draft_kv.prepare(getattr(worker, "draft_model_runner", None), getattr(worker, "topk", 1), "v1",
                                settings.offstep_draft_sync, offstep_graphs.capture_sizes(st.graphs),
                                lambda: compat.spec_contexts(worker))


def forward_prefill_off(worker, batch, *args, **kwargs):
    """Prefills while off run upstream on this path (None): EAGLEWorker's prefill (target extend,
    then the draft's) is not replicated with a light draft KV write."""
    return None


resume_pending = state.resume_pending  # the Adapter protocol's, shared by both paths


def runs_plain_batches(worker) -> bool:
    """Never: the v1 worker's off-steps run inside its speculative batches (plain batches are spec_v2's)."""
    return False


def _needs_hidden(worker) -> bool:
    return compat.draft_reads_target_hidden(worker.speculative_algorithm)


def describe(worker=None) -> dict:
    info: dict[str, Any] = {
        "adapter": "v1",
        "worker": WORKER_CLASS,
        "releases": "0.5.9 - 0.5.12 (non-overlap scheduler; topk>1 or --disable-overlap-schedule)",
        "off_step": "plain target DECODE (spec_info=None, hidden capture on) + 1-token draft extend",
        "prefill_draft_sync": "full (the draft's extend forward on every prefill; light is spec_v2 only)",
        "unsupported": ["dp-attention", "hybrid mamba/linear-attention targets"],
        "graph_guard": compat.graph_guard_target(),
    }
    try:
        info["draft_extend_layout"] = compat.draft_extend_layout()
        from sglang.srt.managers.utils import GenerationBatchResult

        info["result_fields"] = sorted(compat.result_kwargs(GenerationBatchResult, bs=0))
    except Exception as exc:  # doctor output: report, never raise
        info["error"] = f"{type(exc).__name__}: {exc}"
    if worker is not None:
        st = state.peek(worker)
        graphs = (st.graphs if st is not None else None) or {}
        info["offstep_graphs"] = {"active": bool(graphs), "gib": graphs.get("gib")}
    return info
