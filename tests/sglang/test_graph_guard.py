"""The shared guard that keeps an off-step's plain DECODE batch away from verify-only CUDA graphs."""

import importlib
import inspect
from types import SimpleNamespace

import pytest
from packaging.version import Version

from sglang_dynspec import activation, compat, runtime

pytestmark = pytest.mark.sglang


def _expected_graph_runner(sglang_version):
    """(module, class, can-run method) of the target decode graph runner, by release."""
    if Version(sglang_version.base_version) >= Version("0.5.14"):
        return "sglang.srt.model_executor.runner.decode_cuda_graph_runner", "DecodeCudaGraphRunner", "can_run_graph"
    return "sglang.srt.model_executor.cuda_graph_runner", "CudaGraphRunner", "can_run"


def test_guard_refuses_decode_on_a_verify_runner():
    from sglang.srt.model_executor.forward_batch_info import ForwardMode as FM

    called = []

    def original(self, fb, *a, **k):
        called.append(fb.forward_mode)
        return "deferred"

    verify_runner = SimpleNamespace(capture_forward_mode=FM.TARGET_VERIFY)
    decode_runner = SimpleNamespace(capture_forward_mode=FM.DECODE)
    guard = runtime.around_graph_can_run
    assert guard(original, verify_runner, SimpleNamespace(forward_mode=FM.DECODE)) is False
    assert called == []
    for mode in (FM.TARGET_VERIFY, FM.IDLE, FM.EXTEND):
        assert guard(original, verify_runner, SimpleNamespace(forward_mode=mode)) == "deferred"
    assert guard(original, decode_runner, SimpleNamespace(forward_mode=FM.DECODE)) == "deferred"
    assert len(called) == 4


def test_guard_target_is_the_installed_runner(sglang_version):
    mod, cls_name, method = _expected_graph_runner(sglang_version)
    cls = getattr(importlib.import_module(mod), cls_name)
    target = compat.graph_guard_target()
    owner, attr, value = compat.resolve(target)
    assert owner is cls and attr == method and callable(value)
    # The guard reads capture_forward_mode; the runner must set it to TARGET_VERIFY under spec.
    assert "self.capture_forward_mode = ForwardMode.TARGET_VERIFY" in inspect.getsource(cls.__init__)
    # registered exactly once, for both worker paths
    guards = [h for h in activation.planned_hooks() if h.fn is runtime.around_graph_can_run]
    assert [(h.target, h.kind) for h in guards] == [(target, "around")]
