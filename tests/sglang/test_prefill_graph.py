"""EAGLE target prefills and the piecewise prefill graph of SGLang 0.5.11-0.5.13.

The real runner class's ``can_run`` decides; only its ``self`` (a GPU-built runner) is a stand-in
holding the fields ``can_run`` reads.  The GPU side (prefills reported with ``cuda graph: True`` by
the speculative server, ``prefill_graph_replays`` in its stats, greedy outputs equal to ``off``) is
in benchmarks/results (see the README's measured section).
"""

import importlib
import inspect
from types import SimpleNamespace

import pytest
from packaging.version import Version

from sglang_dynspec import activation, compat, runtime
from sglang_dynspec.config import DynspecSettings

pytestmark = pytest.mark.sglang

AFFECTED = (Version("0.5.11"), Version("0.5.14"))


def _affected(sglang_version) -> bool:
    return AFFECTED[0] <= Version(sglang_version.base_version) < AFFECTED[1]


class _Algo:
    def __init__(self, eagle: bool):
        self.eagle = eagle

    def is_eagle(self):
        return self.eagle


def _runner(mode, *, eagle=True, draft=False):
    from sglang.srt.model_executor.forward_batch_info import ForwardMode

    return SimpleNamespace(
        capture_hidden_mode=mode, capture_forward_mode=ForwardMode.EXTEND, max_num_tokens=8192,
        model_runner=SimpleNamespace(spec_algorithm=_Algo(eagle), is_draft_worker=draft),
    )


def _prefill(mode, tokens=2560):
    import torch
    from sglang.srt.model_executor.forward_batch_info import ForwardMode

    return SimpleNamespace(
        input_embeds=None, replace_embeds=None, forward_mode=ForwardMode.EXTEND, capture_hidden_mode=mode,
        input_ids=torch.zeros(tokens, dtype=torch.int64), return_logprob=False,
    )


@pytest.fixture
def affected(sglang_version):
    """(CaptureHiddenMode, PiecewiseCudaGraphRunner) of a release whose graph refuses EAGLE prefills."""
    if not _affected(sglang_version):
        pytest.skip("the prefill graph refuses EAGLE prefills only on SGLang 0.5.11-0.5.13")
    from sglang.srt.model_executor.forward_batch_info import CaptureHiddenMode
    from sglang.srt.model_executor.piecewise_cuda_graph_runner import PiecewiseCudaGraphRunner

    return CaptureHiddenMode, PiecewiseCudaGraphRunner


@pytest.fixture
def settings(monkeypatch):
    monkeypatch.setattr(runtime, "SETTINGS", DynspecSettings(enabled=True))
    monkeypatch.setattr(runtime, "STATE", None)
    return runtime.SETTINGS


def test_hook_planned_exactly_where_the_graph_refuses_eagle_prefills(sglang_version):
    targets = [h.target for h in activation.planned_hooks() if h.fn is runtime.around_prefill_graph_can_run]
    if not _affected(sglang_version):
        assert targets == []
        return
    assert targets == [compat.PREFILL_GRAPH_CAN_RUN]
    owner, attr, value = compat.resolve(compat.PREFILL_GRAPH_CAN_RUN)
    mod = importlib.import_module("sglang.srt.model_executor.piecewise_cuda_graph_runner")
    assert owner is mod.PiecewiseCudaGraphRunner and attr == "can_run" and callable(value)
    # Why lifting the check is sound on these releases: the replay builds its batch with the
    # caller's hidden-state mode, so the eager logits processor gathers what EAGLE asks for.
    assert "capture_hidden_mode=forward_batch.capture_hidden_mode" in inspect.getsource(owner.replay_prepare)


def test_eagle_prefill_replays_the_graph_and_the_runner_keeps_its_mode(affected, settings):
    H, PiecewiseCudaGraphRunner = affected

    can_run = PiecewiseCudaGraphRunner.can_run
    runner = _runner(H.NULL)
    # The release's own check: an EAGLE prefill (FULL) is refused, a plain one (NULL) runs.
    assert can_run(runner, _prefill(H.FULL)) is False
    assert can_run(runner, _prefill(H.NULL)) is True

    hook = runtime.around_prefill_graph_can_run
    assert hook(can_run, runner, _prefill(H.FULL)) is True
    assert runner.capture_hidden_mode == H.NULL
    # Everything else the release checks still holds: a prefill above the largest graph is eager.
    assert hook(can_run, runner, _prefill(H.FULL, tokens=8193)) is False
    assert runner.capture_hidden_mode == H.NULL
    assert hook(can_run, runner, _prefill(H.NULL)) is True


@pytest.mark.parametrize("case", ["setting off", "draft runner", "not eagle", "LAST mode"])
def test_left_to_sglang(affected, settings, monkeypatch, case):
    H, PiecewiseCudaGraphRunner = affected

    runner, mode = _runner(H.NULL), H.FULL
    if case == "setting off":
        monkeypatch.setattr(runtime, "SETTINGS", DynspecSettings(enabled=True, target_prefill_graph=False))
    elif case == "draft runner":
        runner = _runner(H.NULL, draft=True)
    elif case == "not eagle":
        runner = _runner(H.NULL, eagle=False)
    else:
        mode = H.LAST
    assert runtime.around_prefill_graph_can_run(PiecewiseCudaGraphRunner.can_run, runner, _prefill(mode)) is False
    assert runner.capture_hidden_mode == H.NULL


def test_replays_are_counted_in_the_stats(affected, settings, monkeypatch):
    H, PiecewiseCudaGraphRunner = affected

    st = SimpleNamespace(prefill_graph_replays=0, calls=[])
    st.spent = lambda hook, t0: st.calls.append(hook)
    monkeypatch.setattr(runtime, "STATE", st)
    runner = _runner(H.NULL)
    runtime.around_prefill_graph_can_run(PiecewiseCudaGraphRunner.can_run, runner, _prefill(H.FULL))
    runtime.around_prefill_graph_can_run(PiecewiseCudaGraphRunner.can_run, runner, _prefill(H.FULL, tokens=9000))
    assert st.prefill_graph_replays == 1
    assert st.calls == ["prefill_graph", "prefill_graph"]
