"""Activation against the real installed SGLang, each scenario in a fresh process.

SGLang's load_plugins() runs once per process and HookRegistry is class-global, so every
scenario runs in its own interpreter (which is also how SGLang's processes see us).
"""

import json
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
    env.update(env_extra)
    env["PYTHONWARNINGS"] = "ignore"
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


def test_bad_config_stops_the_process_with_one_message(sglang_version):
    if sglang_version < FRAMEWORK:
        pytest.skip("no plugin framework before 0.5.11")
    code = "from sglang.srt.plugins import load_plugins\nload_plugins()\nprint('SERVED')"
    p = run_py(code, {"SGLANG_DYNSPEC_ENABLED": "1", "SGLANG_DYNSPEC_POLICY": "threshold",
                      "SGLANG_DYNSPEC_POLICY_ARGS": '{"n": -2}'})
    assert p.returncode != 0 and "SERVED" not in p.stdout
    assert "sglang-dynspec: invalid arguments for policy 'threshold'" in p.stderr
    assert "policy_args.n" in p.stderr


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
