"""A third-party policy package installed in the environment is found through its entry point.

tox installs examples/dynspec-policy-example into every env (see tox.ini).
"""

import importlib.metadata
import subprocess
import sys

import pytest


def _installed():
    try:
        importlib.metadata.distribution("dynspec-policy-example")
        return True
    except importlib.metadata.PackageNotFoundError:
        return False


pytestmark = pytest.mark.skipif(not _installed(), reason="examples/dynspec-policy-example not installed (tox installs it)")


def test_discovered_by_entry_point_and_built_like_builtins():
    from sglang_dynspec.plugins import get_policies
    from sglang_dynspec.policies import StepInputs, build_policy

    info = get_policies()["queue_aware"]
    assert info.plugin == "queue_aware"  # the entry point's name, not a built-in module
    p = build_policy("queue_aware", {"max_waiting": 1})
    x = StepInputs(0, 8, 8, 3, 0.0, 0, None, 0, None)
    assert p.decide(x) is False


def test_cli_lists_it():
    out = subprocess.run([sys.executable, "-m", "sglang_dynspec.cli", "policies"], capture_output=True, text=True)
    assert out.returncode == 0
    assert "queue_aware" in out.stdout and "[plugin queue_aware]" in out.stdout


def test_its_observer_sees_switches():
    import dynspec_policy_example as ext

    from sglang_dynspec.decisions import Controller
    from sglang_dynspec.plugins import load_plugins, pm
    from sglang_dynspec.policies import build_policy

    load_plugins()
    c = Controller(build_policy("threshold", {"n": 2}), hook=pm.hook)
    before = len(ext.SWITCHES)
    for bs in (1, 5, 1):
        c.on_decode(bs)
    assert len(ext.SWITCHES) - before == 2
