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


@pytest.mark.parametrize("temperatures, greedy", [((0.0, 0.0), True), ((0.0, 0.7), False)])
def test_a_decode_step_and_its_result_agree_on_the_sampling_regime(temperatures, greedy):
    """The controller keeps acceptance per sampling regime, read at the decision from the running
    batch's requests and at the result from the batch result processing gets: on 0.5.12 a
    ScheduleBatch.copy() without sampling info (a GPU run with the batch flag left every
    temperature-0.7 result unattributed, and its policy learning forever).  Real Req, SamplingParams
    and ScheduleBatch; SGLang makes temperature 0 top_k 1."""
    from sglang.srt.managers.schedule_batch import Req, ScheduleBatch
    from sglang.srt.sampling.sampling_params import SamplingParams

    from sglang_dynspec import compat

    reqs = []
    for i, t in enumerate(temperatures):
        params = SamplingParams(temperature=t, max_new_tokens=8)
        params.normalize(None)
        reqs.append(Req(f"r{i}", "", [1, 2, 3], params))
    batch = ScheduleBatch(reqs=reqs)
    assert compat.reqs_are_greedy(compat.decode_batch_reqs(batch, None)) is greedy
    assert compat.reqs_are_greedy(batch.copy().reqs) is greedy
    assert compat.reqs_are_greedy([]) is None
