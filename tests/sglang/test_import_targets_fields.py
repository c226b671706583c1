"""The ServerArgs fields dynspec reads exist in the installed release."""

import inspect

import pytest

pytestmark = pytest.mark.sglang


def test_server_args_fields_exist():
    from sglang.srt.server_args import ServerArgs

    params = inspect.signature(ServerArgs).parameters
    for name in ("speculative_algorithm", "enable_dp_attention", "pp_size", "speculative_num_draft_tokens",
                 "enable_metrics", "disable_overlap_schedule"):
        assert name in params, name


def test_off_step_results_can_be_remembered_weakly():
    """runtime remembers the off-steps' results in a WeakValueDictionary: the result classes both
    adapters return must take weak references (a plain dataclass does; slots=True would not)."""
    import weakref

    torch = pytest.importorskip("torch")
    from sglang.srt.managers.utils import GenerationBatchResult

    from sglang_dynspec import compat

    classes = {GenerationBatchResult, compat.v2_worker_module().GenerationBatchResult}
    for cls in classes:
        res = cls(logits_output=None, next_token_ids=torch.tensor([1]), can_run_cuda_graph=False)
        remembered = weakref.WeakValueDictionary({id(res): res})
        assert remembered[id(res)] is res
        del res
        assert len(remembered) == 0, cls


@pytest.mark.parametrize("greedy", [True, False])
def test_a_batch_says_whether_it_samples_greedily(greedy):
    """The controller keeps acceptance per sampling regime; compat reads the regime from SGLang's
    own flag on a real ScheduleBatch's real SamplingBatchInfo (its other fields do not matter here)."""
    import dataclasses

    from sglang.srt.managers import schedule_batch
    from sglang.srt.managers.schedule_batch import ScheduleBatch
    from sglang.srt.sampling.sampling_batch_info import SamplingBatchInfo

    from sglang_dynspec import compat

    required = {f.name: None for f in dataclasses.fields(SamplingBatchInfo)
                if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING}
    info = SamplingBatchInfo(**{**required, "is_all_greedy": greedy})
    assert compat.batch_is_greedy(ScheduleBatch(reqs=[], sampling_info=info)) is greedy
    worker_batch = getattr(schedule_batch, "ModelWorkerBatch", None)  # what spec_v2 gets up to 0.5.12
    if worker_batch is not None:
        assert "sampling_info" in {f.name for f in dataclasses.fields(worker_batch)}
    assert compat.batch_is_greedy(ScheduleBatch(reqs=[])) is None  # no sampling info yet
