"""Off-steps as plain decode batches: the scheduler's side (spec_v2 worker, SGLang 0.5.12, 0.5.15).

Why: an off-step that runs as a speculative batch whose drafts were all rejected
(``spec_v2.forward_off``) still pays the scheduler's speculative bookkeeping on every step: the
verify-window allocation loop and its host copies, a blocking ``seq_lens`` copy, the window's
memory estimate, the per-row token lists of a verify result.  A plain server skips all of it,
and where a step is CPU-bound (the H200 pair) that is what kept the plain mode 3-4 % behind one.

How: ``spec_algorithm`` is a field of each ``ScheduleBatch`` (``copy()`` keeps it), and every
step of the scheduler's decode path (memory check, prepare, filter, result processing; from
0.5.13 also run_batch's publication of lengths and tokens) branches on the batch's own value.
A running batch set to ``NONE`` therefore runs SGLang's plain decode path; what stays global is
handled by the runtime's hooks:

* the worker is still ``EAGLEWorkerV2``: its forward hook runs the plain batch itself
  (``spec_v2.forward_plain``: input ids from the FutureMap, target decode, light draft write);
* the FutureMap is still speculative: ``store`` keeps a plain step's tokens where the next
  step (plain or speculative) looks them up (0.5.12: slots named by negated output ids;
  0.5.15: the row's req_pool_idx, whose spec buffers a plain step has nothing for);
* the decode log divides by the speculative forward count: plain results add theirs (accepted 0).

The two conversions run where the scheduler checks a running batch's memory, before it prepares
the step, so that check, and the retraction it may trigger, is the new mode's own.  Lengths:
a plain batch's ``seq_lens`` between steps is each row's KV length (its next input token not yet
written), which is also what a speculative step starts from; on 0.5.15 a speculative batch's
lengths live in the FutureMap, published by the last step, and are read / written there.
"""

from __future__ import annotations

from .. import compat
from . import spec_v2


def _torch():
    import torch

    return torch


def is_plain(batch) -> bool:
    return batch.spec_algorithm.is_none()


# The running batch declines what the speculative off-step declines (one check for both).
declines = spec_v2.decline_reason


def to_plain(batch, scheduler) -> None:
    """On -> off: the running batch leaves the speculative path.

    Its lengths are final (``filter_batch`` waited for the last verify), so the slots of the
    verify window past them are freed and the batch gets the host lengths a plain batch keeps.
    """
    torch = _torch()
    if batch.seq_lens.is_cuda:
        # The last step's draft-extend may still read these rows' req_to_token entries, which the
        # plain prepare rewrites on this (the schedule) stream.
        torch.get_device_module(batch.seq_lens.device).current_stream().wait_stream(scheduler.forward_stream)
    if compat.future_map_by_pool():
        # 0.5.15: the batch's own lengths lag; the last verify published the committed ones.
        published = scheduler.future_map.new_seq_lens_buf
        batch.seq_lens = published[batch.req_pool_indices].to(batch.seq_lens.dtype)
    seq_lens_cpu = batch.seq_lens.cpu()
    trim_window(batch, seq_lens_cpu.tolist())
    batch.seq_lens_cpu = seq_lens_cpu
    batch.seq_lens_sum = int(seq_lens_cpu.sum())
    # The speculative path leaves orig_seq_lens behind; the plain one advances it with seq_lens.
    if batch.orig_seq_lens is not None:
        batch.orig_seq_lens = batch.seq_lens.to(batch.orig_seq_lens.dtype, copy=True)
    batch.spec_info = None
    batch.spec_algorithm = compat.speculative_algorithm_none()


def trim_window(batch, seq_lens: list[int]) -> int:
    """Free each row's slots from its length (page-aligned) up to what it allocated, and make
    its allocation its length; returns the slots freed.

    A speculative step allocates a window of slots ahead of the committed length; a plain step
    allocates exactly one slot per row at its length, which must not already be owned.  Committed
    lengths are left alone: they lag one verify (its result is processed after this step starts)
    and catch up there, as they do upstream.
    """
    torch = _torch()
    allocator = batch.token_to_kv_pool_allocator
    page = int(getattr(allocator, "page_size", 1) or 1)
    rows, cols = [], []
    for req, length in zip(batch.reqs, seq_lens):
        start = -(-length // page) * page
        end = int(req.kv_allocated_len)
        if end > start:
            rows.extend([req.req_pool_idx] * (end - start))
            cols.extend(range(start, end))
        req.kv_allocated_len = length
    if not rows:
        return 0
    table = batch.req_to_token_pool.req_to_token
    r = torch.tensor(rows, dtype=torch.int64).to(table.device, non_blocking=True)
    c = torch.tensor(cols, dtype=torch.int64).to(table.device, non_blocking=True)
    allocator.free(table[r, c].to(torch.int64))
    return len(rows)


def to_speculative(batch, scheduler, draft_input_cls) -> None:
    """Off -> on: the running batch goes back to the speculative path.

    Its rows' next tokens sit in the FutureMap under the indices its ``output_ids`` name (negated,
    on both paths; 0.5.15: under each row's req_pool_idx, with its lengths published there); a
    draft input carrying them is all the speculative prepare and the FutureMap's resolve read.
    The draft's own outputs there are stale: the resume step rebuilds them.
    """
    if compat.future_map_by_pool():
        _publish_plain_lengths(batch, scheduler, scheduler.future_map)
        batch.spec_algorithm = scheduler.spec_algorithm
        batch.spec_info = draft_input_cls(future_indices=batch.req_pool_indices)
        return
    if batch.output_ids is None:
        raise RuntimeError("dynspec plain batch: the running batch has no output_ids to resume from")
    batch.spec_algorithm = scheduler.spec_algorithm
    batch.spec_info = draft_input_cls(future_indices=compat.future_indices(-batch.output_ids.to(_torch().int64)))


def _publish_plain_lengths(batch, scheduler, future_map) -> None:
    """0.5.15: a speculative step reads its lengths from the FutureMap (``resolve_seq_lens_cpu``,
    gated on its publish event).  The scheduler published each plain step's ``seq_lens + 1``
    there, one more than the KV length a speculative step starts from: publish the batch's own,
    on the forward stream after that step, so the event covers this write."""
    torch = _torch()
    stream = getattr(scheduler, "forward_stream", None)
    if stream is None or not batch.seq_lens.is_cuda:
        future_map.publish(batch.req_pool_indices, batch.seq_lens)
        return
    # The forward stream runs after the schedule stream's work up to the last step, which is
    # where these tensors were made; it reads them later than this thread lets go of them.
    batch.seq_lens.record_stream(stream)
    batch.req_pool_indices.record_stream(stream)
    with torch.get_device_module(batch.seq_lens.device).stream(stream):
        future_map.publish(batch.req_pool_indices, batch.seq_lens)


def store(future_map, future_indices, result) -> bool:
    """Keep a plain step's new tokens in the FutureMap's token buffer; False where ``result`` is
    not a plain step's (it carries a next draft input), to be stored by SGLang.  ``result``:
    0.5.12 a GenerationBatchResult, 0.5.15 the RelayPayload of ``FutureMap.stash``."""
    if compat.future_map_by_pool():
        return _stash_plain(future_map, future_indices, result)
    if result.next_draft_input is not None:
        return False
    span = future_indices.interval
    if future_map.is_empty_slice(span):
        return True
    if not future_map.buf_initialized:
        # Every request is prefilled speculatively first, and that store sizes the buffers.
        raise RuntimeError("dynspec plain batch: the FutureMap has no buffers yet (no prefill stored)")
    buf = future_map.bonus_tokens_buf
    buf[span].copy_(result.next_token_ids)  # (casts if it must: no separate conversion op)
    return True


def _stash_plain(future_map, req_pool_indices, payload) -> bool:
    """0.5.15: a plain step's payload carries its tokens only, where a speculative FutureMap
    would also write top-k and hidden-state rows from it (and fail on None): write the tokens.
    Those rows keep the last speculative step's values, which a resume step rebuilds."""
    if payload.topk_p is not None or payload.hidden_states is not None:
        return False
    if int(req_pool_indices.shape[0]) == 0:
        return True
    buf = future_map.output_tokens_buf
    buf[req_pool_indices] = payload.bonus_tokens.to(buf.dtype)  # (index_put_ needs the dtype)
    return True
