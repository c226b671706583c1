"""Releases outside the checked range are refused, by doctor and at server start."""

import pytest
from packaging.version import Version

from sglang_dynspec import compat
from sglang_dynspec.cli import main


@pytest.mark.parametrize("v, ok", [("0.5.8", False), ("0.5.9", True), ("0.5.12.post1", True),
                                   ("0.5.23", True), ("0.5.24", False), ("0.6.0", False)])
def test_support_range(v, ok):
    assert (compat.support_problem(Version(v)) is None) is ok


def test_targets_follow_release():
    assert compat.result_decode_target(Version("0.5.12")) == compat.RESULT_DECODE_MIXIN
    assert compat.result_decode_target(Version("0.5.13")) == compat.RESULT_DECODE_PROCESSOR
    assert compat.graph_guard_target(Version("0.5.13")) == compat.GRAPH_CAN_RUN_OLD
    assert compat.graph_guard_target(Version("0.5.14")) == compat.GRAPH_CAN_RUN_NEW
    assert compat.has_v1_worker(Version("0.5.12")) and not compat.has_v1_worker(Version("0.5.13"))
    assert compat.has_plugin_framework(Version("0.5.11"))


def test_doctor_refuses_unsupported_release(monkeypatch, capsys):
    monkeypatch.setattr(compat, "sglang_version", lambda: Version("0.5.24"))
    assert main(["doctor"]) == 1
    out = capsys.readouterr().out
    assert "UNSUPPORTED: SGLang 0.5.24 is not supported (supported: 0.5.9 to 0.5.23)" in out
    assert "PROBLEMS FOUND" in out


def test_activation_refuses_unsupported_release(monkeypatch):
    from sglang_dynspec.activation import activate
    from sglang_dynspec.errors import ActivationError

    monkeypatch.setattr(compat, "sglang_version", lambda: Version("0.6.0"))
    with pytest.raises(ActivationError, match="SGLang 0.6.0 is not supported"):
        activate({"SGLANG_DYNSPEC_ENABLED": "1"})


def test_doctor_without_sglang(monkeypatch, capsys):
    monkeypatch.setattr(compat, "sglang_version", lambda: None)
    assert main(["doctor"]) == 1
    assert "SGLang: not installed" in capsys.readouterr().out
