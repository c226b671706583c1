"""compat.prefill_rows against the installed release's real ForwardMode and ModelWorkerBatch: what
the cost model charges prefill time per (requests admitted), and nothing for decode/idle batches."""

import dataclasses

import pytest

from sglang_dynspec import compat

pytestmark = pytest.mark.sglang


def _batch(mode, rows):
    torch = pytest.importorskip("torch")
    from sglang.srt.managers.schedule_batch import ModelWorkerBatch

    # A real ModelWorkerBatch with only the fields prefill_rows reads set; the rest are placeholders.
    fields = {f.name: None for f in dataclasses.fields(ModelWorkerBatch)}
    fields.update(forward_mode=mode, seq_lens=torch.arange(1, rows + 1, dtype=torch.int64))
    return ModelWorkerBatch(**fields)


def test_extend_batches_count_their_requests_decode_and_idle_none():
    from sglang.srt.model_executor.forward_batch_info import ForwardMode

    assert compat.prefill_rows(_batch(ForwardMode.EXTEND, 7)) == 7
    assert compat.prefill_rows(_batch(ForwardMode.MIXED, 3)) == 3
    assert compat.prefill_rows(_batch(ForwardMode.DECODE, 5)) == 0
    assert compat.prefill_rows(_batch(ForwardMode.IDLE, 0)) == 0
