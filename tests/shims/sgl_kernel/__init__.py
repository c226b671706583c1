"""Test-only stand-in for ``sgl_kernel`` (not shipped with sglang-dynspec).

SGLang 0.5.9-0.5.12 import ``sgl_kernel`` unguarded while importing the scheduler and the
EAGLE workers, and the real package cannot load without the CUDA driver. tests/conftest.py
puts this directory on the path only after the real ``import sgl_kernel`` has failed, so the
hook targets can be imported and inspected on a CPU-only machine.

Every attribute (and every ``sgl_kernel.<sub>`` module) is a stub that raises when called:
a test that really reaches a kernel must fail loudly, never run on fake results.
"""

import importlib.abc
import importlib.machinery
import sys
import types

IS_DYNSPEC_TEST_SHIM = True
__version__ = "0.0.0+dynspec.test.shim"

_WHY = (
    "is a sglang-dynspec test shim: the real sgl_kernel could not be imported on this machine "
    "(no CUDA driver), so its kernels cannot run. Run this test on a GPU machine."
)


class KernelStub:
    """Any name SGLang pulls from sgl_kernel; attribute access chains (e.g. scalar_types.uint4b8)."""

    def __init__(self, name):
        self._name = name

    def __call__(self, *args, **kwargs):
        raise RuntimeError(f"{self._name} {_WHY}")

    def __getattr__(self, attr):
        # Dunders must stay absent so introspection (inspect, copy, pickle) behaves normally.
        if attr.startswith("__") and attr.endswith("__"):
            raise AttributeError(attr)
        return KernelStub(f"{self._name}.{attr}")

    def __repr__(self):
        return f"<sgl_kernel test-shim stub {self._name}>"


def _module_getattr(module_name):
    def __getattr__(attr):
        if attr.startswith("__") and attr.endswith("__"):
            raise AttributeError(f"module {module_name!r} has no attribute {attr!r}")
        return KernelStub(f"{module_name}.{attr}")

    return __getattr__


class _SubmoduleFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Serves any ``sgl_kernel.x.y`` as a stub package, so deep ``from ... import`` works."""

    def find_spec(self, fullname, path=None, target=None):
        if fullname.startswith(__name__ + "."):
            return importlib.machinery.ModuleSpec(fullname, self, is_package=True)
        return None

    def create_module(self, spec):
        module = types.ModuleType(spec.name)
        module.__path__ = []
        module.__getattr__ = _module_getattr(spec.name)
        return module

    def exec_module(self, module):
        pass


__getattr__ = _module_getattr(__name__)

# Appended, not prepended: a real submodule file would win, and only misses reach the stubs.
if not any(isinstance(f, _SubmoduleFinder) for f in sys.meta_path):
    sys.meta_path.append(_SubmoduleFinder())
