"""compat.prefill_rows against the installed release's real ForwardMode and the batch class its
EAGLE worker receives: what the cost model charges prefill time per (requests admitted), and
nothing for decode / idle batches."""

import pytest

from sglang_dynspec import compat

pytestmark = pytest.mark.sglang


def _batch(mode, rows):
    torch = pytest.importorskip("torch")
    from sglang.srt.managers import schedule_batch

    # ModelWorkerBatch up to 0.5.12, ScheduleBatch from 0.5.13 (ModelWorkerBatch is gone there).
    cls = getattr(schedule_batch, "ModelWorkerBatch", None) or schedule_batch.ScheduleBatch
    batch = cls.__new__(cls)  # the real class; only the fields prefill_rows reads are set
    batch.forward_mode = mode
    batch.seq_lens = torch.arange(1, rows + 1, dtype=torch.int64)
    return batch


def test_extend_batches_count_their_requests_decode_and_idle_none():
    from sglang.srt.model_executor.forward_batch_info import ForwardMode

    assert compat.prefill_rows(_batch(ForwardMode.EXTEND, 7)) == 7
    assert compat.prefill_rows(_batch(ForwardMode.MIXED, 3)) == 3
    assert compat.prefill_rows(_batch(ForwardMode.DECODE, 5)) == 0
    assert compat.prefill_rows(_batch(ForwardMode.IDLE, 0)) == 0
