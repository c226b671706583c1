"""Helpers for tests: free ports, and the fake SGLang server run through the real ServerProcess."""

from __future__ import annotations

import os
import socket
import sys
from pathlib import Path

from ..server import ServerProcess, ServerSpec

REPO = Path(__file__).resolve().parents[3]
SHIM = Path(__file__).resolve().parent / "shim"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def python_path_env(shim: bool = False) -> dict[str, str]:
    """PYTHONPATH for child processes: the repo (and the fake `sglang` package when asked)."""
    parts = ([str(SHIM)] if shim else []) + [str(REPO)]
    if os.environ.get("PYTHONPATH"):
        parts.append(os.environ["PYTHONPATH"])
    return {"PYTHONPATH": os.pathsep.join(parts)}


def use_fake_servers(monkeypatch, token_delay_s: float) -> None:
    """Make ``python -m sglang.launch_server`` start the fake server (the shim is that sglang),
    generating a token every ``token_delay_s``, ready after 0.2 s."""
    for k, v in python_path_env(shim=True).items():
        monkeypatch.setenv(k, v)
    monkeypatch.setenv("FAKE_SGLANG_TOKEN_DELAY_S", str(token_delay_s))
    monkeypatch.setenv("FAKE_SGLANG_STARTUP_S", "0.2")


def fake_spec(name: str, log_dir, env: dict | None = None, spec: bool = False, extra_args=None) -> ServerSpec:
    port = free_port()
    args = ["--port", str(port)] + (["--speculative-algorithm", "EAGLE3"] if spec else []) + list(extra_args or [])
    full_env = {"FAKE_SGLANG_STARTUP_S": "0.2", **python_path_env(), **(env or {})}
    return ServerSpec(name=name, args=args, env=full_env, port=port,
                      command=[sys.executable, "-m", "benchmarks.dynspec_bench.testing.fake_server"])


def start_fake(name: str, log_dir, env: dict | None = None, spec: bool = False, timeout_s: float = 60.0) -> ServerProcess:
    srv = ServerProcess(fake_spec(name, log_dir, env, spec), log_dir, grace_s=5.0)
    srv.start(timeout_s)
    return srv
