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
    prefill = {v: compat.prefill_graph_target(Version(v)) for v in ("0.5.9", "0.5.11", "0.5.13.post2", "0.5.14")}
    assert prefill == {"0.5.9": None, "0.5.11": compat.PREFILL_GRAPH_CAN_RUN,
                       "0.5.13.post2": compat.PREFILL_GRAPH_CAN_RUN, "0.5.14": None}


def test_plain_batch_hooks_follow_release():
    from sglang_dynspec.activation import planned_hooks

    for v, plain, store in (("0.5.11", False, None), ("0.5.12", True, compat.FUTURE_STORE_RING),
                            ("0.5.12.post1", True, compat.FUTURE_STORE_RING), ("0.5.13", False, None),
                            ("0.5.15", True, compat.FUTURE_STORE_POOL), ("0.5.23", False, None)):
        assert (compat.plain_batch_release_problem(Version(v)) is None) is plain, v
        targets = {h.target for h in planned_hooks(Version(v))}
        assert (compat.CHECK_DECODE_MEM in targets) is plain, v
        assert {compat.FUTURE_STORE_RING, compat.FUTURE_STORE_POOL} & targets == ({store} if plain else set()), v
        assert not plain or compat.V2_FORWARD in targets
    assert "0.5.12, 0.5.15" in compat.plain_batch_release_problem(Version("0.5.14"))


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


def test_compat_imports_no_sglang():
    """The adapter helpers moved into compat keep their SGLang imports inside functions."""
    import subprocess
    import sys

    code = ("import sys, sglang_dynspec.compat as c; "
            "assert callable(c.v2_input_kind) and callable(c.draft_extend_layout); "
            "assert not [m for m in sys.modules if m == 'sglang' or m.startswith('sglang.')], 'sglang imported'")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr


def test_dataclass_field_helpers():
    import dataclasses

    @dataclasses.dataclass
    class OldDraftInput:
        verified_id: object = None

    @dataclasses.dataclass
    class NewDraftInput:
        bonus_tokens: object = None

    @dataclasses.dataclass
    class Result:
        num_accepted_drafts: int = 0
        num_accepted_drafts_per_req_cpu: object = None

    assert compat.dataclass_field_names(Result) == frozenset({"num_accepted_drafts", "num_accepted_drafts_per_req_cpu"})
    assert compat.only_fields(OldDraftInput, verified_id=1, bonus_tokens=2) == {"verified_id": 1}
    assert compat.draft_input_bonus_field(OldDraftInput) == "verified_id"
    assert compat.draft_input_bonus_field(NewDraftInput) == "bonus_tokens"
    assert compat.last_token_ids(OldDraftInput(verified_id=[3])) == [3]
    assert compat.last_token_ids(NewDraftInput(bonus_tokens=[4])) == [4]
    assert compat.result_kwargs(Result, bs=2) == {"num_accepted_drafts": 0, "num_accepted_drafts_per_req_cpu": [0, 0]}
    with pytest.raises(RuntimeError, match="no accepted-draft count field"):
        compat.result_kwargs(OldDraftInput, bs=1)


def test_resolve_surfaces_the_real_import_error(tmp_path, monkeypatch):
    pkg = tmp_path / "fakepkg_dynspec"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "good.py").write_text("class Worker:\n    def forward(self):\n        return 1\n")
    (pkg / "broken.py").write_text("import no_such_kernel_lib\nclass Worker:\n    pass\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    owner, attr, value = compat.resolve("fakepkg_dynspec.good.Worker.forward")
    assert owner.__name__ == "Worker" and attr == "forward" and callable(value)
    with pytest.raises(ModuleNotFoundError) as e:
        compat.resolve("fakepkg_dynspec.broken.Worker.forward")
    assert e.value.name == "no_such_kernel_lib"  # not "module has no attribute 'broken'"
    with pytest.raises(AttributeError):
        compat.resolve("fakepkg_dynspec.good.Worker.no_such_method")
