"""The sglang-dynspec CLI without SGLang-specific expectations (doctor is tested per release)."""

import json

from sglang_dynspec.cli import main


def test_policies_lists_builtins(capsys):
    assert main(["policies"]) == 0
    out = capsys.readouterr().out
    for name in ("always", "never", "threshold", "random", "goodput"):
        assert name in out


def test_config_shows_sources(capsys, monkeypatch):
    monkeypatch.setenv("SGLANG_DYNSPEC_POLICY", "never")
    assert main(["config", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["policy"] == {"value": "never", "source": "env SGLANG_DYNSPEC_POLICY"}
    assert data["enabled"]["source"] == "default"


def test_config_error_exit_code(capsys, monkeypatch):
    monkeypatch.setenv("SGLANG_DYNSPEC_SAFE_MODE", "maybe")
    assert main(["config"]) == 2
    assert "safe_mode (env SGLANG_DYNSPEC_SAFE_MODE)" in capsys.readouterr().err


def test_readme_support_matrix_is_current():
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    p = subprocess.run([sys.executable, str(root / "benchmarks" / "support_matrix.py"), "--check"],
                       capture_output=True, text=True)
    assert p.returncode == 0, p.stderr
