"""Helpers for tests: free ports, the fake SGLang server run through the real ServerProcess, and a
bundle that carries it."""

from __future__ import annotations

import os
import socket
import sys
import tarfile
from pathlib import Path

from ..server import ServerProcess, ServerSpec

REPO = Path(__file__).resolve().parents[3]
SHIM = Path(__file__).resolve().parent / "shim"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def free_port_bases(count: int, start: int, width: int = 3) -> list[int]:
    """``count`` bases of ``width`` free consecutive ports each, from ``start`` (spread by pid so
    parallel runs differ) up to 32000: below the ephemeral range, where another run's client
    connections could take a server's port."""
    def free(port: int) -> bool:
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
                return True
            except OSError:
                return False

    bases: list[int] = []
    for base in range(start + (os.getpid() % 400) * 20, 32000, 10):
        if all(free(base + i) for i in range(width)):
            bases.append(base)
            if len(bases) == count:
                return bases
    raise RuntimeError("no free ports for the dry run")


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


def fake_bundle(root: Path) -> Path:
    """A ``.gpu-bundle`` under ``root`` whose site.tar.xz holds the fake ``sglang`` (its
    launch_server starts the fake server): the device scripts' CPU dry runs unpack it."""
    bundle = root / "bundle"
    bundle.mkdir()
    with tarfile.open(bundle / "site.tar.xz", "w:xz") as tar:
        tar.add(SHIM / "sglang", arcname="sglang", filter=lambda ti: None if "__pycache__" in ti.name else ti)
    return bundle
