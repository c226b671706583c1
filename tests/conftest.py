"""Suite-wide test setup: sgl_kernel import shim, marker skips, the ``sglang_version`` fixture, and the
``high_phase_view`` cost view that the policy tests and the decision-cost benchmark share."""

import importlib.metadata
import os
import sys
from pathlib import Path

import pytest
from packaging.version import Version

from sglang_dynspec.costs import CostTable, CostView, PrefillMeter

SHIM_DIR = Path(__file__).resolve().parent / "shims"

# Releases before this import sgl_kernel unguarded on CPU (0.5.9 and 0.5.12 verified; 0.5.15
# and later only import it when CUDA/ROCm is present). Later releases never get the shim, so
# their own "no sgl_kernel" code paths are what we test.
_SHIM_BELOW = Version("0.5.15")


def _installed_sglang_version():
    # Distribution metadata, not find_spec: pytest puts tests/ on sys.path, where the
    # tests/sglang folder would pass for a (namespace) package named sglang.
    try:
        return Version(importlib.metadata.version("sglang"))
    except importlib.metadata.PackageNotFoundError:
        return None


def _activate_sgl_kernel_shim(sglang_version):
    """Return a one-line status for the report header."""
    if sglang_version is None:
        return "sgl_kernel: not needed (SGLang not installed)"
    try:
        import sgl_kernel  # noqa: F401
    except Exception as exc:  # ImportError, or OSError when libcuda.so.1 is missing
        reason = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
    else:
        return f"sgl_kernel: real ({getattr(sgl_kernel, '__file__', '?')})"
    if sglang_version >= _SHIM_BELOW:
        return f"sgl_kernel: not importable ({reason}); no shim, sglang {sglang_version} does not need it"
    # A failed import can leave submodules behind; the shim must be the only sgl_kernel seen.
    for name in [n for n in sys.modules if n == "sgl_kernel" or n.startswith("sgl_kernel.")]:
        del sys.modules[name]
    sys.path.insert(0, str(SHIM_DIR))
    # Subprocesses spawned by tests (scheduler processes, CLI runs) must see the shim too.
    os.environ["PYTHONPATH"] = os.pathsep.join(
        p for p in (str(SHIM_DIR), os.environ.get("PYTHONPATH")) if p
    )
    return f"sgl_kernel: TEST SHIM ACTIVE ({SHIM_DIR}); real import failed: {reason}"


def _torch_versions():
    """(installed torch, the release's pin from tox's DYNSPEC_TORCH_PIN or None)."""
    try:
        installed = importlib.metadata.version("torch")
    except importlib.metadata.PackageNotFoundError:
        installed = None
    return installed, os.environ.get("DYNSPEC_TORCH_PIN") or None


def _torch_status(installed, pin):
    if installed is None:
        return "torch: not installed"
    if pin is None:
        return f"torch: {installed}"
    if Version(installed).public == Version(pin).public:
        return f"torch: {installed} (this release's pin)"
    # .ci/run does this on a machine short of disk (DYNSPEC_CI_TORCH): say it, never hide it.
    return f"torch: {installed} SHARED, not this release's pin {pin} (DYNSPEC_CI_TORCH)"


_SGLANG_VERSION = _installed_sglang_version()
_SHIM_STATUS = _activate_sgl_kernel_shim(_SGLANG_VERSION)
_TORCH, _TORCH_PIN = _torch_versions()


def pytest_report_header(config):
    sglang = f"sglang: {_SGLANG_VERSION}" if _SGLANG_VERSION else "sglang: not installed"
    return [sglang, _torch_status(_TORCH, _TORCH_PIN), _SHIM_STATUS]


@pytest.fixture(scope="session", autouse=True)
def _record_versions(record_testsuite_property):
    # Read back by benchmarks/collect_cpu_matrix.py, so the matrix says which torch each env had.
    record_testsuite_property("sglang", str(_SGLANG_VERSION) if _SGLANG_VERSION else "")
    record_testsuite_property("torch", _TORCH or "")
    record_testsuite_property("torch_pin", _TORCH_PIN or "")


def _cuda_available():
    try:
        import torch
    except ImportError:
        return False
    return torch.cuda.is_available()


def pytest_collection_modifyitems(config, items):
    # Markers, not keywords: "sglang" is also the tests/sglang directory's node name.
    if _SGLANG_VERSION is None:
        skip = pytest.mark.skip(reason="needs a real SGLang install (not installed)")
        for item in items:
            if item.get_closest_marker("sglang"):
                item.add_marker(skip)
    gpu_items = [item for item in items if item.get_closest_marker("gpu")]
    # Only import torch (slow) when some selected test actually asks for a GPU.
    if gpu_items and not _cuda_available():
        skip = pytest.mark.skip(reason="needs an NVIDIA GPU (torch.cuda.is_available() is False)")
        for item in gpu_items:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def sglang_version():
    """The installed SGLang release as a packaging Version, or None without SGLang."""
    return _SGLANG_VERSION


def _high_phase_view(arrivals_per_s: float | None):
    """The H200 pair in a high phase (pair2k-rows34, t=389.6 re-driven): plain decode 4.8 ms at
    bs 34 rising ~40 us per request, speculation 11.3 ms rising ~130 us per request at 2.49
    tokens per request, prefills of 14.6 ms per admitted request after speculation (the draft's
    extend) and 10.9 ms after plain decode, ~150 tokens per request; ``arrivals_per_s`` requests
    per second admitted over the last seconds."""
    on_ms, off_ms = (lambda b: 6.9 + 0.13 * b), (lambda b: 3.4 + 0.041 * b)
    t = CostTable()
    for bs in (1, 2, 4, 8, 16, 32, 64, 128):
        for _ in range(5):
            t.observe(True, bs, on_ms(bs) / 1e3)
            t.observe(False, bs, off_ms(bs) / 1e3)
    m = PrefillMeter()
    for on, prefill_s in ((True, 0.0146), (False, 0.0109)):
        for _ in range(20):
            m.add_tokens(150)
            m.observe(on, prefill_s, 1)
    now = None
    if arrivals_per_s is not None:
        for i in range(int(3 * arrivals_per_s)):
            m.admit(1, i / arrivals_per_s)
        now = 3.0
    return CostView.from_table(t, m, now=now)


@pytest.fixture
def high_phase_view():
    """The builder of the H200 pair's cost view in a high phase (``_high_phase_view``), shared by the
    policy tests and the decision-cost benchmark."""
    return _high_phase_view
