"""Every dotted hook target the plugin relies on resolves in the installed SGLang release,
and the ones a release dropped are really gone (so version gating is not silently wrong)."""

import pkgutil
import subprocess
import sys
from pathlib import Path

import pytest
from packaging.version import Version

pytestmark = pytest.mark.sglang

V = Version

# (dotted target, first release that has it, first release without it or None)
TARGETS = [
    ("sglang.srt.speculative.eagle_worker.EAGLEWorker.forward_batch_generation", None, V("0.5.13")),
    ("sglang.srt.speculative.eagle_worker_v2.EAGLEWorkerV2.forward_batch_generation", None, None),
    (
        "sglang.srt.managers.scheduler_output_processor_mixin."
        "SchedulerOutputProcessorMixin.process_batch_result_decode",
        None,
        V("0.5.13"),
    ),
    (
        "sglang.srt.managers.scheduler_components.batch_result_processor."
        "SchedulerBatchResultProcessor.process_batch_result_decode",
        V("0.5.13"),
        None,
    ),
    ("sglang.srt.managers.scheduler.Scheduler.init_model_worker", None, None),
    ("sglang.srt.plugins.load_plugins", V("0.5.11"), None),
]


def _present_in(version, first, gone):
    return (first is None or version >= first) and (gone is None or version < gone)


def _resolve(target):
    # Same split SGLang's HookRegistry uses: module/class path, then the attribute.
    owner_path, attr = target.rsplit(".", 1)
    return getattr(pkgutil.resolve_name(owner_path), attr)


@pytest.mark.parametrize("target,first,gone", TARGETS, ids=[".".join(t[0].split(".")[-2:]) for t in TARGETS])
def test_hook_target(sglang_version, target, first, gone):
    if _present_in(sglang_version, first, gone):
        assert callable(_resolve(target)), f"{target} is not callable in sglang {sglang_version}"
    else:
        with pytest.raises((ImportError, AttributeError)):
            _resolve(target)


def _shim_active():
    # conftest puts tests/shims on sys.path only when it activates the shim.
    return str(Path(__file__).resolve().parents[1] / "shims") in sys.path


@pytest.mark.skipif(not _shim_active(), reason="sgl_kernel test shim not active in this env")
def test_sgl_kernel_shim_refuses_to_compute_and_reaches_subprocesses():
    from sgl_kernel.kvcacheio import transfer_kv_per_layer

    with pytest.raises(RuntimeError, match="test shim"):
        transfer_kv_per_layer()
    # Scheduler processes are spawned; they must import the same shim through PYTHONPATH.
    code = "import sgl_kernel.kvcacheio, sgl_kernel; print(sgl_kernel.IS_DYNSPEC_TEST_SHIM)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "True"
