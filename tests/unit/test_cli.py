"""The sglang-dynspec CLI without SGLang-specific expectations (doctor is tested per release)."""

import json

import pytest

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


BAD_POLICY_SETTINGS = [
    ({"SGLANG_DYNSPEC_POLICY": "doesnotexist"}, "policy 'doesnotexist' (env SGLANG_DYNSPEC_POLICY): unknown policy"),
    ({"SGLANG_DYNSPEC_POLICY": "threshold", "SGLANG_DYNSPEC_POLICY_ARGS": '{"n": -3}'},
     "policy_args (env SGLANG_DYNSPEC_POLICY_ARGS): invalid arguments for policy 'threshold'"),
    ({"SGLANG_DYNSPEC_POLICY": "no_such_pkg_dynspec.mod:Class"},
     "policy 'no_such_pkg_dynspec.mod:Class' (env SGLANG_DYNSPEC_POLICY): cannot import"),
]


@pytest.fixture(params=BAD_POLICY_SETTINGS, ids=["unknown", "bad-args", "no-module"])
def bad_settings(request, monkeypatch):
    """Enabled, with one invalid policy setting in the environment; yields what the error must say."""
    env, needle = request.param
    monkeypatch.setenv("SGLANG_DYNSPEC_ENABLED", "1")
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    return needle


def test_config_refuses_what_server_start_refuses(bad_settings, capsys):
    assert main(["config"]) == 2
    assert bad_settings in capsys.readouterr().err


def test_doctor_reports_invalid_settings_and_finishes(bad_settings, capsys):
    needle = bad_settings
    assert main(["doctor"]) == 1
    out = capsys.readouterr().out
    assert "config: INVALID" in out and needle in out
    assert out.splitlines()[-1].startswith("status: PROBLEMS FOUND") and "invalid settings" in out.splitlines()[-1]


def test_config_says_whether_server_start_enables(capsys, monkeypatch):
    monkeypatch.setenv("SGLANG_DYNSPEC_ENABLED", "y")
    assert main(["config"]) == 0
    out = capsys.readouterr().out
    assert "server start: plugin on, policy 'goodput' (SGLANG_DYNSPEC_ENABLED='y' (on))" in out
    monkeypatch.setenv("SGLANG_DYNSPEC_ENABLED", "off")
    assert main(["config"]) == 0
    assert "server start: plugin off (SGLANG_DYNSPEC_ENABLED='off' (off))" in capsys.readouterr().out


def test_help_is_plain_text_and_lists_every_command(capsys):
    with pytest.raises(SystemExit):
        main(["--help"])
    out = capsys.readouterr().out
    assert "`" not in out
    description = out.split("\n\n")[1]  # after the usage line
    for cmd in ("doctor", "config", "policies", "replay"):
        assert cmd in description


def test_kernel_note_tells_missing_package_from_missing_driver():
    from packaging.version import Version

    from sglang_dynspec.cli import _kernel_note

    missing = ModuleNotFoundError("No module named 'sgl_kernel'", name="sgl_kernel")
    note = _kernel_note([missing], Version("0.5.12"))
    assert "is not installed" in note and "pip install sglang==0.5.12" in note and "driver (" not in note
    no_driver = OSError("libcuda.so.1: cannot open shared object file")
    assert "needs the CUDA driver (libcuda.so.1)" in _kernel_note([no_driver], Version("0.5.12"))
    assert _kernel_note([AttributeError("x")], Version("0.5.12")) is None


def test_doctor_without_sglang_says_what_to_install(monkeypatch, capsys):
    from sglang_dynspec import compat

    monkeypatch.setattr(compat, "sglang_version", lambda: None)
    assert main(["doctor"]) == 1
    out = capsys.readouterr().out
    assert "SGLang: not installed; install a supported release (0.5.9 to 0.5.23)" in out
    assert "e.g. pip install 'sglang==" in out and "(GPU-tested: " in out


@pytest.mark.parametrize("generator", ["perf_table.py", "support_matrix.py"])
def test_readme_generated_block_is_current(generator):
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    p = subprocess.run([sys.executable, str(root / "benchmarks" / generator), "--check"],
                       capture_output=True, text=True)
    assert p.returncode == 0, p.stderr


def test_perf_table_rows_from_result_files(tmp_path):
    import json
    from benchmarks import perf_table, readme_block

    def rec(kind, ratios, stats=True, tp=None):
        flags = {"dynspec:goodput": {"args": ["--model-path", "m"] + (["--tp", str(tp)] if tp else [])}}
        return {"kind": kind, "sglang_version": "0.5.12", "padded": True, "flags": flags,
                "modes": {"off": {}, "on": {}, "dynspec:goodput": {}},
                "server_stats": {"dynspec:goodput": {"dynspec_stats": {"steps_off": 5}} if stats else {}},
                "ratio_to_best_static": {"dynspec:goodput": ratios, "off": {c: 1.0 for c in ratios},
                                         "on": {c: 0.9 for c in ratios}}}

    (tmp_path / "a.json").write_text(json.dumps(rec("pair", {"10": 0.98, "2": 0.97, "250": 1.01})))
    (tmp_path / "b.json").write_text(json.dumps(rec("sweep", {"1": 0.5}, tp=2)))
    (tmp_path / "c.json").write_text(json.dumps(rec("sweep", {"1": 0.9}, stats=False)))  # plugin absent
    (tmp_path / "d.json").write_text(json.dumps({"kind": "fuzz"}))
    # A static server that died at C=2 (pair2b-rows34: `on` OOM on an H100): that level's ratio is to
    # `off` alone, so it is named and counts for neither the lowest nor the goal.
    died = rec("pair", {"1": 0.99, "2": 0.8})
    died["ratio_to_best_static"].update({"off": {"1": 0.9, "2": 1.0}, "on": {"1": 1.0}})
    died["gpu"] = "NVIDIA H100 80GB HBM3"
    (tmp_path / "e.json").write_text(json.dumps(died))
    only = rec("pair", {"2": 0.8})
    only["ratio_to_best_static"].update({"off": {"2": 1.0}, "on": {}})
    (tmp_path / "f.json").write_text(json.dumps(only))
    # Row 3's C=1 with one request per mode (pair2c-rows34): no measurement; a trace level has no C
    short = rec("pair", {"1": 0.93, "10": 0.99, "trace": 1.0})
    short["modes"] = {m: {"1": {"requests": n}, "10": {"requests": 80}, "trace": {"requests": 9}}
                      for m, n in (("off", 1), ("on", 1), ("dynspec:goodput", 8))}
    (tmp_path / "g.json").write_text(json.dumps(short))
    rows = perf_table.rows(tmp_path)
    assert [(r["file"], r["tp"], r["min"]) for r in rows] == [
        ("a.json", 1, 0.97), ("b.json", 2, 0.5), ("e.json", 1, 0.99), ("f.json", 1, None), ("g.json", 1, 0.99)]
    lines = perf_table.table(tmp_path).splitlines()
    assert "2: 0.97, 10: 0.98, 250: 1.01" in lines[2] and lines[2].endswith("| yes |")
    assert lines[3].endswith("| no |") and "0.5.12, 2" in lines[3]
    assert "| H100 |" in lines[4] and "1: 0.99, 2: 0.80 (no on) | 0.99 | no |" in lines[4]
    assert "2: 0.80 (no on) | – | no level with every static mode |" in lines[5]
    assert "1: 0.93 (1 req), 10: 0.99, trace: 1.00 | 0.99 | no |" in lines[6]
    # The block helper refuses a README without markers and rewrites only between them.
    readme = tmp_path / "README.md"
    readme.write_text("head\n<!-- t:start -->\nold\n<!-- t:end -->\ntail\n")
    assert readme_block.main("t", lambda: "new", ["--check"], readme=readme) == 1
    assert readme_block.main("t", lambda: "new", ["--write"], readme=readme) == 0
    assert readme.read_text() == "head\n<!-- t:start -->\nnew\n<!-- t:end -->\ntail\n"
    assert readme_block.main("t", lambda: "new", ["--check"], readme=readme) == 0
    assert readme_block.main("u", lambda: "x", ["--write"], readme=readme) == 1


def test_cpu_matrix_records_each_envs_torch(tmp_path):
    from benchmarks import collect_cpu_matrix as collect, support_matrix as matrix

    xml = tmp_path / "junit-sglang-0.5.9.xml"
    xml.write_text(
        '<testsuites><testsuite name="pytest"><properties>'
        '<property name="sglang" value="0.5.9"/><property name="torch" value="2.14.1"/>'
        '<property name="torch_pin" value="2.9.1"/></properties>'
        '<testcase classname="tests.sglang.test_adapter_v1" name="a"/>'
        '<testcase classname="tests.sglang.test_adapter_v1" name="b"><skipped/></testcase>'
        '</testsuite></testsuites>')
    env = collect.summarise(xml)
    assert (env["sglang"], env["torch"], env["torch_pin"]) == ("0.5.9", "2.14.1", "2.9.1")
    assert env["adapters"]["v1"] == {"passed": 1, "failed": 0, "skipped": 1}
    assert matrix._torch_note(env) == "; torch 2.14.1, not its pin 2.9.1"
    assert matrix._torch_note({**env, "torch": "2.9.1"}) == ""
    assert matrix._torch_note({"passed": 3}) == ""  # files collected before versions were recorded
