"""Settings: precedence env > file > default, and every error names field and source."""

import pytest

from sglang_dynspec import gate
from sglang_dynspec.config import load_settings, validate
from sglang_dynspec.errors import ConfigError


def write(tmp_path, text, name="dynspec.toml"):
    p = tmp_path / name
    p.write_text(text)
    return str(p)


def test_defaults_are_disabled_goodput():
    loaded = load_settings({})
    assert loaded.settings.enabled is False
    assert loaded.settings.policy == "goodput"
    assert all(src == "default" for _, _, src in loaded.rows())


def test_env_overrides_file(tmp_path):
    path = write(tmp_path, 'enabled = true\npolicy = "threshold"\n[policy_args]\nn = 4\n')
    loaded = load_settings({"SGLANG_DYNSPEC_CONFIG": path, "SGLANG_DYNSPEC_POLICY": "random"})
    s = loaded.settings
    assert s.enabled is True and s.policy == "random" and s.policy_args == {"n": 4}
    assert loaded.sources["policy"] == "env SGLANG_DYNSPEC_POLICY"
    assert loaded.sources["enabled"] == f"file {path}"
    assert loaded.sources["safe_mode"] == "default"


def test_dynspec_table_accepted(tmp_path):
    path = write(tmp_path, '[dynspec]\npolicy = "never"\n')
    assert load_settings({"SGLANG_DYNSPEC_CONFIG": path}).settings.policy == "never"


def test_policy_args_json_from_env():
    s = load_settings({"SGLANG_DYNSPEC_POLICY_ARGS": '{"n": 5, "band": 2}'}).settings
    assert s.policy_args == {"n": 5, "band": 2}


@pytest.mark.parametrize(
    "env, needle",
    [
        ({"SGLANG_DYNSPEC_POLICY_ARGS": "{n: 5"}, "policy_args (env SGLANG_DYNSPEC_POLICY_ARGS): not valid JSON"),
        ({"SGLANG_DYNSPEC_POLICY_ARGS": "[1, 2]"}, "must be a JSON object"),
        ({"SGLANG_DYNSPEC_SYNC_INTERVAL_STEPS": "0"}, "sync_interval_steps (env SGLANG_DYNSPEC_SYNC_INTERVAL_STEPS)"),
        ({"SGLANG_DYNSPEC_ENABLED": "maybe"}, "enabled (env SGLANG_DYNSPEC_ENABLED)"),
        ({"SGLANG_DYNSPEC_SAFE_MODE": "sideways"}, "safe_mode (env SGLANG_DYNSPEC_SAFE_MODE)"),
        ({"SGLANG_DYNSPEC_POLICY_DEADLINE_MS": "-1"}, "policy_deadline_ms (env"),
        ({"SGLANG_DYNSPEC_POLICY_DEADLINE_STRIKES": "0"}, "policy_deadline_strikes (env"),
        ({"SGLANG_DYNSPEC_POLICY": "  "}, "policy (env SGLANG_DYNSPEC_POLICY)"),
        ({"SGLANG_DYNSPEC_POLCY": "never"}, "SGLANG_DYNSPEC_POLCY (env): unknown setting"),
        ({"SGLANG_DYNSPEC_CONFIG": "/nonexistent/dynspec.toml"}, "config (env SGLANG_DYNSPEC_CONFIG): TOML file not found"),
    ],
)
def test_env_errors_name_field_and_source(env, needle):
    with pytest.raises(ConfigError) as e:
        load_settings(env)
    assert needle in str(e.value)


def test_file_errors_name_field_and_file(tmp_path):
    path = write(tmp_path, "sync_interval_steps = -3\n")
    with pytest.raises(ConfigError) as e:
        load_settings({"SGLANG_DYNSPEC_CONFIG": path})
    assert f"sync_interval_steps (file {path})" in str(e.value)


def test_unknown_file_key_refused(tmp_path):
    path = write(tmp_path, "polcy = 'never'\n")
    with pytest.raises(ConfigError, match=r"polcy \(file .*\): unknown setting"):
        load_settings({"SGLANG_DYNSPEC_CONFIG": path})


def test_unreadable_toml(tmp_path):
    path = write(tmp_path, "enabled = = true\n")
    with pytest.raises(ConfigError, match="is not valid TOML"):
        load_settings({"SGLANG_DYNSPEC_CONFIG": path})


def test_example_config_shows_every_setting():
    """The example is where users read what each setting does: none missing, none stale."""
    import re
    from pathlib import Path

    from sglang_dynspec.config import FIELDS

    text = (Path(__file__).resolve().parents[2] / "examples" / "dynspec.toml").read_text()
    keys = set(re.findall(r"^#? ?(\w+) =", text, flags=re.M)) | set(re.findall(r"^\[(\w+)\]", text, flags=re.M))
    assert sorted(set(FIELDS) - {"config"} - keys) == []
    deadline_comment = text.split("policy_deadline_ms =")[0].rsplit("\n\n", 1)[-1]
    assert "policy_deadline_strikes" in deadline_comment  # one late call does not fail a policy


def test_example_config_loads_as_is():
    from pathlib import Path

    example = Path(__file__).resolve().parents[2] / "examples" / "dynspec.toml"
    loaded = load_settings({"SGLANG_DYNSPEC_CONFIG": str(example)})
    assert loaded.settings.enabled is True
    assert any(src.startswith("file ") for _, _, src in loaded.rows())


@pytest.mark.parametrize("raw", sorted(gate.TRUE | gate.FALSE) + ["Y", "T", "Off", " yes "])
def test_gate_and_settings_read_enabled_alike(raw):
    """What the startup hook / plugin entry point enable is what the settings call enabled."""
    env = {"SGLANG_DYNSPEC_ENABLED": raw}
    assert gate.wanted(env) is load_settings(env).settings.enabled


@pytest.mark.parametrize("raw", ["maybe", "2", "", "enable"])
def test_enabled_spelling_nobody_accepts_is_refused_by_name(raw):
    env = {"SGLANG_DYNSPEC_ENABLED": raw}
    assert gate.wanted(env) is True  # activation runs, so that it refuses the value
    with pytest.raises(ConfigError, match=r"enabled \(env SGLANG_DYNSPEC_ENABLED\): not a boolean"):
        load_settings(env)


@pytest.mark.parametrize(
    "env, expected",
    [({}, False), ({"SGLANG_DYNSPEC_ENABLED": "1"}, True), ({"SGLANG_DYNSPEC_ENABLED": "0", "SGLANG_DYNSPEC_CONFIG": "x"}, False),
     ({"SGLANG_DYNSPEC_CONFIG": "x.toml"}, True)],
)
def test_gate(env, expected):
    assert gate.wanted(env) is expected


def test_bool_settings_share_the_gate_parser(tmp_path):
    path = write(tmp_path, 'enabled = "yes"\nmetrics = "off"\n')
    s = load_settings({"SGLANG_DYNSPEC_CONFIG": path, "SGLANG_DYNSPEC_OFFSTEP_GRAPHS": "N"}).settings
    assert (s.enabled, s.metrics, s.offstep_graphs) == (True, False, False)
    with pytest.raises(ConfigError, match=rf"metrics \(file {path}\): not a boolean"):
        load_settings({"SGLANG_DYNSPEC_CONFIG": write(tmp_path, 'metrics = "sometimes"\n')})


@pytest.mark.parametrize(
    "env, needle",
    [
        ({"SGLANG_DYNSPEC_POLICY": "doesnotexist"},
         "policy 'doesnotexist' (env SGLANG_DYNSPEC_POLICY): unknown policy; registered: always, goodput"),
        ({"SGLANG_DYNSPEC_POLICY": "threshold", "SGLANG_DYNSPEC_POLICY_ARGS": '{"n": -3}'},
         "policy 'threshold' (env SGLANG_DYNSPEC_POLICY), policy_args (env SGLANG_DYNSPEC_POLICY_ARGS): "
         "invalid arguments for policy 'threshold'"),
        ({"SGLANG_DYNSPEC_POLICY": "no_such_pkg_dynspec.mod:Class"},
         "policy 'no_such_pkg_dynspec.mod:Class' (env SGLANG_DYNSPEC_POLICY): cannot import: "
         "No module named 'no_such_pkg_dynspec'"),
    ],
)
def test_validate_builds_the_policy_and_names_the_source(env, needle):
    with pytest.raises(ConfigError) as e:
        validate({"SGLANG_DYNSPEC_ENABLED": "1", **env})
    assert needle in str(e.value)


def test_validate_names_the_file(tmp_path):
    path = write(tmp_path, 'policy = "threshold"\n[policy_args]\nn = -3\n')
    with pytest.raises(ConfigError, match=rf"policy_args \(file {path}\)"):
        validate({"SGLANG_DYNSPEC_CONFIG": path})
