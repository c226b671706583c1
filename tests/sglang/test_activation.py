"""Activation against the real installed SGLang, each scenario in a fresh process.

SGLang's load_plugins() runs once per process and HookRegistry is class-global, so every
scenario runs in its own interpreter (which is also how SGLang's processes see us).
"""

import importlib.metadata
import json
import logging
import os
import subprocess
import sys
import textwrap

import pytest
from packaging.version import Version

pytestmark = pytest.mark.sglang

FRAMEWORK = Version("0.5.11")


def run_py(code: str, env_extra: dict, timeout=240) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SGLANG_DYNSPEC_")}
    env["PYTHONWARNINGS"] = "ignore"
    env.update(env_extra)
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], env=env, capture_output=True,
                          text=True, timeout=timeout)


# SGLang's own argument parser with the plugins loaded (what launch_server builds); indented
# like the test snippets it is prepended to, which run_py dedents as a whole.
PARSER = """
        import argparse
        from sglang.srt.plugins import load_plugins
        load_plugins()
        from sglang.srt.server_args import ServerArgs
        p = argparse.ArgumentParser()
        ServerArgs.add_cli_args(p)
"""

CHECK = """
    import json
    from sglang_dynspec import activation, compat, runtime
    hooks = activation.planned_hooks()
    print("RESULT", json.dumps({
        "problems": activation.verify(hooks),
        "targets": [h.target for h in hooks],
        "settings": runtime.SETTINGS.policy if runtime.SETTINGS else None,
    }))
"""


def start(sglang_version) -> str:
    """What server start runs in every SGLang process, by activation route."""
    if sglang_version >= FRAMEWORK:
        return "from sglang.srt.plugins import load_plugins\nload_plugins()\n"
    return "import sglang.srt.managers.scheduler  # the startup hook activates when SGLang is imported\n"


def _installed(dist):
    try:
        importlib.metadata.distribution(dist)
        return True
    except importlib.metadata.PackageNotFoundError:
        return False


def result(proc):
    assert proc.returncode == 0, proc.stderr[-3000:]
    line = [l for l in proc.stdout.splitlines() if l.startswith("RESULT ")]
    assert line, proc.stdout[-2000:] + proc.stderr[-2000:]
    return json.loads(line[-1][len("RESULT "):])


def test_load_plugins_wraps_real_targets(sglang_version):
    if sglang_version < FRAMEWORK:
        pytest.skip("no plugin framework before 0.5.11; the startup hook test covers it")
    code = "from sglang.srt.plugins import load_plugins\nload_plugins()\n" + textwrap.dedent(CHECK)
    r = result(run_py(code, {"SGLANG_DYNSPEC_ENABLED": "1", "SGLANG_DYNSPEC_POLICY": "threshold"}))
    assert r["problems"] == []
    assert r["settings"] == "threshold"
    assert "sglang.srt.speculative.eagle_worker_v2.EAGLEWorkerV2.forward_batch_generation" in r["targets"]
    has_v1 = sglang_version <= Version("0.5.12")
    assert ("sglang.srt.speculative.eagle_worker.EAGLEWorker.forward_batch_generation" in r["targets"]) == has_v1


def test_disabled_plugin_wraps_nothing(sglang_version):
    if sglang_version < FRAMEWORK:
        pytest.skip("no plugin framework before 0.5.11")
    code = """
        from sglang.srt.plugins import load_plugins
        load_plugins()
        import sys, json
        from sglang.srt.speculative.eagle_worker_v2 import EAGLEWorkerV2
        print("RESULT", json.dumps({
            "wrapped": hasattr(EAGLEWorkerV2.forward_batch_generation, "__wrapped__"),
            # disabled = an env read and two flag hooks; settings (pydantic) are not even imported
            "config_loaded": "sglang_dynspec.config" in sys.modules,
        }))
    """
    assert result(run_py(code, {})) == {"wrapped": False, "config_loaded": False}


def test_missing_target_fails_loudly(sglang_version):
    if sglang_version < FRAMEWORK:
        pytest.skip("no plugin framework before 0.5.11")
    code = """
        from sglang_dynspec import activation, compat
        compat.V2_FORWARD = "sglang.srt.speculative.eagle_worker_v2.EAGLEWorkerV2.no_such_method"
        from sglang.srt.plugins import load_plugins
        load_plugins()
        print("SERVED")
    """
    p = run_py(code, {"SGLANG_DYNSPEC_ENABLED": "1"})
    assert p.returncode != 0 and "SERVED" not in p.stdout
    assert "hook targets missing" in p.stderr and "no_such_method" in p.stderr


def test_cli_flags_mirror_settings(sglang_version):
    if sglang_version < FRAMEWORK:
        pytest.skip("--dynspec-* flags need the plugin framework (>= 0.5.11)")
    code = PARSER + """
        import os, json
        args = p.parse_args(["--model-path", "x", "--speculative-algorithm", "EAGLE3",
                             "--speculative-draft-model-path", "y", "--dynspec-enabled",
                             "--dynspec-policy", "threshold", "--dynspec-policy-args", '{"n": 3}'])
        try:
            ServerArgs.from_cli_args(args)
        except SystemExit:
            raise
        except Exception:
            pass  # ServerArgs may reject the fake model path later; flags were exported before
        print("RESULT", json.dumps({k: v for k, v in os.environ.items() if k.startswith("SGLANG_DYNSPEC_")}))
    """
    r = result(run_py(code, {}))
    assert r == {"SGLANG_DYNSPEC_ENABLED": "true", "SGLANG_DYNSPEC_POLICY": "threshold",
                 "SGLANG_DYNSPEC_POLICY_ARGS": '{"n": 3}'}


def test_cli_flag_validation_same_as_env(sglang_version):
    if sglang_version < FRAMEWORK:
        pytest.skip("--dynspec-* flags need the plugin framework (>= 0.5.11)")
    code = PARSER + """
        args = p.parse_args(["--model-path", "x", "--dynspec-enabled", "--dynspec-sync-interval-steps", "0"])
        ServerArgs.from_cli_args(args)
        print("SERVED")
    """
    p = run_py(code, {})
    assert p.returncode != 0 and "SERVED" not in p.stdout
    assert "sync_interval_steps (flag/env SGLANG_DYNSPEC_SYNC_INTERVAL_STEPS)" in p.stderr


def test_incompatible_server_flags_refused(sglang_version):
    if sglang_version < FRAMEWORK:
        pytest.skip("--dynspec-* flags need the plugin framework (>= 0.5.11)")

    code = PARSER + """
        from unittest import mock
        args = p.parse_args(["--model-path", "x", "--dynspec-enabled"])
        # ServerArgs' own checks need the model's config on disk; the flag check runs on its result.
        with mock.patch.object(ServerArgs, "__post_init__", lambda self: None):
            ServerArgs.from_cli_args(args)
        print("SERVED")
    """
    p = run_py(code, {})
    assert p.returncode != 0 and "SERVED" not in p.stdout
    assert "incompatible server flags" in p.stderr
    assert "speculative_algorithm (--speculative-algorithm): not set" in p.stderr


def test_startup_hook_in_spawned_subprocess(sglang_version):
    """Releases without a plugin framework: the .pth hook wraps targets in spawned children."""
    if sglang_version >= FRAMEWORK:
        pytest.skip("SGLang >= 0.5.11 activates through its plugin entry point")
    code = """
        import json, multiprocessing as mp

        def child(q):
            from sglang_dynspec import activation
            import sglang.srt.speculative.eagle_worker_v2, sglang.srt.speculative.eagle_worker  # noqa
            import sglang.srt.managers.scheduler  # noqa
            q.put(activation.verify(activation.planned_hooks()))

        if __name__ == "__main__":
            ctx = mp.get_context("spawn")   # what SGLang uses for scheduler processes
            q = ctx.Queue()
            p = ctx.Process(target=child, args=(q,))
            p.start(); problems = q.get(timeout=200); p.join()
            print("RESULT", json.dumps({"problems": problems, "exitcode": p.exitcode}))
    """
    import tempfile

    with tempfile.NamedTemporaryFile("w", suffix=".py", delete=False) as f:
        f.write(textwrap.dedent(code))
    env = {k: v for k, v in os.environ.items() if not k.startswith("SGLANG_DYNSPEC_")}
    env.update(SGLANG_DYNSPEC_ENABLED="1", PYTHONWARNINGS="ignore")
    p = subprocess.run([sys.executable, f.name], env=env, capture_output=True, text=True, timeout=300)
    r = result(p)
    assert r["problems"] == [] and r["exitcode"] == 0


def test_startup_hook_cost_when_disabled():
    """Without the env var the .pth line does not import sglang_dynspec at all."""
    p = run_py("import sys; print('RESULT', '{\"loaded\": %s}' % str('sglang_dynspec' in sys.modules).lower())", {})
    assert result(p)["loaded"] is False


BAD_SETTINGS = [
    {"SGLANG_DYNSPEC_POLICY": "doesnotexist"},
    {"SGLANG_DYNSPEC_POLICY": "threshold", "SGLANG_DYNSPEC_POLICY_ARGS": '{"n": -3}'},
    {"SGLANG_DYNSPEC_POLICY": "no_such_pkg_dynspec.mod:Class"},
    {"SGLANG_DYNSPEC_ENABLED": "maybe"},
]


@pytest.mark.parametrize("env", BAD_SETTINGS, ids=["unknown-policy", "bad-args", "unimportable", "enabled-maybe"])
def test_server_start_refuses_what_config_refuses_with_the_same_message(sglang_version, env):
    env = {"SGLANG_DYNSPEC_ENABLED": "1", **env}
    cfg = run_py("from sglang_dynspec.cli import main; raise SystemExit(main(['config']))", env)
    assert cfg.returncode == 2, cfg.stdout
    served = run_py(start(sglang_version) + "print('SERVED')", env)
    assert served.returncode != 0 and "SERVED" not in served.stdout
    message = [line.strip() for line in cfg.stderr.splitlines() if line.strip()]
    assert message and all(line in served.stderr for line in message), (message, served.stderr[-3000:])
    assert "(env SGLANG_DYNSPEC_" in cfg.stderr  # the source is named


def test_doctor_reports_a_bad_config_and_finishes(sglang_version):
    p = run_py("from sglang_dynspec.cli import main; raise SystemExit(main(['doctor']))",
               {"SGLANG_DYNSPEC_ENABLED": "1", "SGLANG_DYNSPEC_POLICY": "doesnotexist", "PYTHONWARNINGS": "default"})
    lines = p.stdout.splitlines()
    assert p.returncode == 1, p.stdout + p.stderr[-2000:]
    assert "hook targets:" in lines and "adapters:" in lines
    assert "config: INVALID (server start refuses it)" in lines
    assert "policy 'doesnotexist' (env SGLANG_DYNSPEC_POLICY): unknown policy" in p.stdout
    assert lines[-1].startswith("status: PROBLEMS FOUND")
    # SGLang's import noise is summarised, not mixed in; one short line per adapter
    assert "Warning" not in p.stderr and "warnings.warn" not in p.stdout
    assert all(len(line) < 200 for line in lines if line.startswith("  v1:") or line.startswith("  spec_v2:"))
    assert f"SGLang: {sglang_version}" in p.stdout and any(l.strip().startswith("tested:") for l in lines)


@pytest.mark.parametrize("raw", ["y", "T", "on"])
def test_every_accepted_spelling_activates(sglang_version, raw):
    r = result(run_py(start(sglang_version) + textwrap.dedent(CHECK), {"SGLANG_DYNSPEC_ENABLED": raw}))
    assert r["problems"] == [] and r["settings"] == "goodput"


def test_disabled_spelling_wraps_nothing(sglang_version):
    code = start(sglang_version) + textwrap.dedent("""
        import json
        from sglang.srt.speculative.eagle_worker_v2 import EAGLEWorkerV2
        print("RESULT", json.dumps({"wrapped": hasattr(EAGLEWorkerV2.forward_batch_generation, "__wrapped__")}))
    """)
    assert result(run_py(code, {"SGLANG_DYNSPEC_ENABLED": "f"})) == {"wrapped": False}


def test_trace_file_and_log_level_take_effect(sglang_version, tmp_path):
    """Both activation routes run the same activate(): the decision trace and log level too."""
    code = start(sglang_version) + textwrap.dedent("""
        import json, logging
        from sglang_dynspec import runtime
        from sglang_dynspec.plugins import pm
        trace = pm.get_plugin("dynspec-trace")
        res = {"level": logging.getLogger("sglang_dynspec").level, "trace_observer": trace is not None}
        if trace is not None:
            ctl = runtime.new_controller()
            for bs in (1, 2, 3):
                ctl.on_decode(bs)
            trace.close()
        print("RESULT", json.dumps(res))
    """)
    env = {"SGLANG_DYNSPEC_ENABLED": "1", "SGLANG_DYNSPEC_POLICY": "never",
           "SGLANG_DYNSPEC_TRACE_FILE": str(tmp_path / "dec.jsonl"), "SGLANG_DYNSPEC_LOG_LEVEL": "debug"}
    assert result(run_py(code, env)) == {"level": logging.DEBUG, "trace_observer": True}
    (trace,) = tmp_path.glob("dec.*.jsonl")
    assert [json.loads(l)["bs"] for l in trace.read_text().splitlines()] == [1, 2, 3]


FLAKY = """
class Flaky:
    name = "flaky"

    def __init__(self, args):
        pass

    def decide(self, x):
        if x.step == 2:
            raise RuntimeError("boom")
        return x.decode_bs < 3
"""


@pytest.mark.skipif(not (_installed("dynspec-observer-example") and _installed("dynspec-policy-example")),
                    reason="the example plugins are not installed (tox installs them)")
def test_observers_of_installed_plugins_are_called_for_any_policy(sglang_version, tmp_path):
    """An observer-only plugin and a policy package's observer both run beside a module:Class policy."""
    (tmp_path / "flaky_dynspec_policy.py").write_text(FLAKY)
    code = start(sglang_version) + textwrap.dedent("""
        import json
        import dynspec_observer_example as obs, dynspec_policy_example as pol
        from sglang_dynspec import runtime
        ctl = runtime.new_controller()
        for bs in (1, 5, 1, 1):
            ctl.on_decode(bs)
        print("RESULT", json.dumps({"failures": obs.FAILURES, "switches": pol.SWITCHES}))
    """)
    env = {"SGLANG_DYNSPEC_ENABLED": "1", "SGLANG_DYNSPEC_POLICY": "flaky_dynspec_policy:Flaky",
           "PYTHONPATH": os.pathsep.join(p for p in (str(tmp_path), os.environ.get("PYTHONPATH")) if p)}
    r = result(run_py(code, env))
    assert r == {"failures": [["flaky", "decide() raised RuntimeError: boom"]], "switches": [1, 2]}
