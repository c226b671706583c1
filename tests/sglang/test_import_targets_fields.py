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
