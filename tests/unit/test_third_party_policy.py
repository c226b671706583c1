"""A third-party policy package installed in the environment is found through its entry point.

tox installs examples/dynspec-policy-example into every env (see tox.ini).
"""

import importlib.metadata
import subprocess
import sys

import pytest


def _installed(dist: str) -> bool:
    try:
        importlib.metadata.distribution(dist)
        return True
    except importlib.metadata.PackageNotFoundError:
        return False


pytestmark = pytest.mark.skipif(not _installed("dynspec-policy-example"),
                                reason="examples/dynspec-policy-example not installed (tox installs it)")


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

    from sglang_dynspec.controller import Controller
    from sglang_dynspec.plugins import load_plugins, pm
    from sglang_dynspec.policies import build_policy

    load_plugins()
    c = Controller(build_policy("threshold", {"n": 2}), hook=pm.hook)
    before = len(ext.SWITCHES)
    for bs in (1, 5, 1):
        c.on_decode(bs)
    assert len(ext.SWITCHES) - before == 2


@pytest.mark.skipif(not _installed("dynspec-observer-example"), reason="examples/dynspec-observer-example not installed (tox installs it)")
def test_observer_only_plugin_is_called_beside_a_module_policy(tmp_path, monkeypatch):
    """Activation's own steps (validate, configure) and runtime's controller, without SGLang:
    the observer-only plugin and the policy package's observer run although the policy is
    ``package.module:Class`` (no registered name that would load the entry points)."""
    import dynspec_observer_example as obs
    import dynspec_policy_example as pol

    from sglang_dynspec import activation, runtime
    from sglang_dynspec.config import validate

    (tmp_path / "flaky_unit_policy.py").write_text(
        "class Flaky:\n"
        "    def __init__(self, args):\n        pass\n"
        "    def decide(self, x):\n"
        "        if x.step == 2:\n            raise RuntimeError('boom')\n"
        "        return x.decode_bs < 3\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(runtime, "SETTINGS", None)
    monkeypatch.setattr(runtime, "POLICY", None)
    monkeypatch.setattr(obs, "FAILURES", [])
    monkeypatch.setattr(pol, "SWITCHES", [])
    activation.configure(validate({"SGLANG_DYNSPEC_ENABLED": "1", "SGLANG_DYNSPEC_POLICY": "flaky_unit_policy:Flaky"}))
    ctl = runtime.new_controller()
    for bs in (1, 5, 1, 1):
        ctl.on_decode(bs)
    assert obs.FAILURES == [("flaky_unit_policy:Flaky", "decide() raised RuntimeError: boom")]
    assert pol.SWITCHES == [1, 2]
