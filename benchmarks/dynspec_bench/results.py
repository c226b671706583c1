"""Result records: run metadata, the documented JSON shape, atomic writes."""

from __future__ import annotations

import contextlib
import datetime as _dt
import json
import os
import re
import shlex
import subprocess
import sys
import tempfile
import time
from importlib import metadata
from pathlib import Path

KINDS = ("sweep", "fuzz", "offstep", "pair", "trace")

_NUM = {"type": ["number", "null"]}
_INT = {"type": "integer", "minimum": 0}

LEVEL_SCHEMA = {
    "type": "object",
    "required": ["output_tok_per_s", "tpot_p50_ms", "tpot_p99_ms", "ttft_p50_ms",
                 "accept_length", "requests", "failed", "switches"],
    "properties": {
        "output_tok_per_s": _NUM, "tpot_p50_ms": _NUM, "tpot_p99_ms": _NUM, "ttft_p50_ms": _NUM,
        "accept_length": _NUM, "requests": _INT, "failed": _INT,
        "switches": {"type": ["integer", "null"]},
    },
}

CORRECTNESS_SCHEMA = {
    "type": "object",
    "required": ["requests", "mismatched", "first_mismatch"],
    "properties": {
        "requests": _INT, "mismatched": _INT,
        "first_mismatch": {"type": "array", "items": {"type": ["integer", "null"]}},
    },
}

COMMON_REQUIRED = ["kind", "sglang_version", "torch_version", "gpu", "worker_path", "topk", "num_steps",
                   "num_draft_tokens", "model", "command", "created", "git_commit", "flags", "phase_times_s"]

RESULT_SCHEMA = {
    "type": "object",
    "required": COMMON_REQUIRED,
    "properties": {
        "kind": {"enum": list(KINDS)},
        "created": {"type": "string"},
        "command": {"type": "string"},
        "flags": {"type": "object", "additionalProperties": {
            "type": "object", "required": ["args", "env"],
            "properties": {"args": {"type": "array", "items": {"type": "string"}}, "env": {"type": "object"}},
        }},
        "phase_times_s": {"type": "object", "additionalProperties": {"type": "number"}},
        "modes": {"type": "object", "additionalProperties": {
            "type": "object", "additionalProperties": LEVEL_SCHEMA}},
        "correctness": {"type": "object", "additionalProperties": CORRECTNESS_SCHEMA},
        "per_C": {"type": "object", "additionalProperties": {
            "type": "object",
            "required": ["decode_steps", "switches", "crashed", "leak_reports", "requests", "mismatched",
                         "accept_length_after_resume", "accept_length_static_on"],
            "properties": {"crashed": {"type": "boolean"}, "decode_steps": {"type": ["integer", "null"]},
                           "switches": {"type": ["integer", "null"]}, "leak_reports": _INT,
                           "requests": _INT, "mismatched": {"type": ["integer", "null"]},
                           "accept_length_after_resume": _NUM, "accept_length_static_on": _NUM},
        }},
        "per_bs": {"type": "object", "additionalProperties": {
            "type": "object", "required": ["off_step_ms", "plain_step_ms", "ratio"],
            "properties": {"off_step_ms": _NUM, "plain_step_ms": _NUM, "ratio": _NUM},
        }},
    },
    "allOf": [
        {"if": {"properties": {"kind": {"enum": ["sweep", "trace", "pair"]}}},
         "then": {"required": ["modes", "correctness"]}},
        {"if": {"properties": {"kind": {"const": "fuzz"}}}, "then": {"required": ["policy", "per_C"]}},
        {"if": {"properties": {"kind": {"const": "offstep"}}}, "then": {"required": ["per_bs"]}},
    ],
}


def validate(record: dict) -> None:
    """Raise ValueError naming the first problem. Uses jsonschema when installed."""
    try:
        import jsonschema
    except ImportError:
        missing = [k for k in COMMON_REQUIRED if k not in record]
        if missing:
            raise ValueError(f"result record lacks field(s): {missing}") from None
        if record["kind"] not in KINDS:
            raise ValueError(f"result field 'kind' must be one of {KINDS}, got {record['kind']!r}") from None
        return
    try:
        jsonschema.validate(record, RESULT_SCHEMA)
    except jsonschema.ValidationError as exc:
        where = "/".join(str(p) for p in exc.absolute_path) or "<root>"
        raise ValueError(f"result field {where!r}: {exc.message}") from None


def _dist_version(name: str) -> str | None:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def gpu_name() -> str | None:
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=20)
        names = [l.strip() for l in out.stdout.splitlines() if l.strip()]
        if names:
            return names[0] if len(set(names)) == 1 else "; ".join(names)
    except (OSError, subprocess.SubprocessError):
        pass
    return None


def gpu_memory_used_mib() -> list[int] | None:
    """Per-GPU used memory (MiB) from nvidia-smi; None where there is no NVIDIA driver."""
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits"],
                             capture_output=True, text=True, timeout=20)
        vals = [int(x) for x in out.stdout.split() if x.strip().isdigit()]
        return vals or None
    except (OSError, subprocess.SubprocessError):
        return None


def git_commit() -> str | None:
    if os.environ.get("DYNSPEC_GIT_COMMIT"):
        return os.environ["DYNSPEC_GIT_COMMIT"]
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, timeout=10,
                             cwd=Path(__file__).resolve().parent)
        return out.stdout.strip() or None if out.returncode == 0 else None
    except (OSError, subprocess.SubprocessError):
        return None


def base_record(kind: str, model: str | None, argv: list[str] | None = None) -> dict:
    if kind not in KINDS:
        raise ValueError(f"kind must be one of {KINDS}, got {kind!r}")
    argv = sys.argv if argv is None else argv
    return {
        "kind": kind,
        "sglang_version": _dist_version("sglang"),
        "torch_version": _dist_version("torch"),
        "gpu": gpu_name(),
        "worker_path": None, "topk": None, "num_steps": None, "num_draft_tokens": None,
        "model": model,
        "command": os.environ.get("DYNSPEC_COMMAND") or shlex.join([sys.executable, *argv]),
        "created": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "git_commit": git_commit(),
        "flags": {},
        "phase_times_s": load_phase_times(os.environ.get("DYNSPEC_PHASE_TIMES")),
    }


def load_phase_times(path: str | None) -> dict:
    """Phase times the shell driver measured before Python started (lines 'name seconds')."""
    out: dict[str, float] = {}
    if path and Path(path).exists():
        for line in Path(path).read_text().splitlines():
            parts = line.split()
            if len(parts) == 2:
                try:
                    out[parts[0]] = round(float(parts[1]), 3)
                except ValueError:
                    pass
    return out


@contextlib.contextmanager
def phase(record: dict, name: str, add: bool = False):
    """Time a block into record['phase_times_s'][name] (also when it raises); ``add``: onto the
    time already there (a phase measured in several pieces)."""
    t0 = time.monotonic()
    try:
        yield
    finally:
        times = record.setdefault("phase_times_s", {})
        times[name] = round((times.get(name, 0.0) if add else 0.0) + time.monotonic() - t0, 3)


def finish(path: str | Path, record: dict) -> Path:
    """Validate (a problem is recorded in the file, not raised: the numbers still count) and write."""
    try:
        validate(record)
    except ValueError as exc:
        record["validation_error"] = str(exc)
    return write_json(path, record)


REPO_ROOT = Path(__file__).resolve().parents[2]
TMP_PLACEHOLDER = "<tmp>"
# Not inside another path or word: /var/tmp/x stays as it is.
_START = r"(?<![\w.\-/<>])"


def portable_text(text: str, roots=(REPO_ROOT,)) -> str:
    """Paths of the machine that ran, made comparable across machines: under the repository
    relative to it, under the temp directory as ``<tmp>/...``."""
    for root in sorted({str(r).rstrip("/") for r in roots}, key=len, reverse=True):
        text = re.sub(_START + re.escape(root) + "/", "", text)
        text = re.sub(_START + re.escape(root) + r"(?![\w.\-/])", ".", text)
    for tmp in {"/tmp", tempfile.gettempdir().rstrip("/")}:
        text = re.sub(_START + re.escape(tmp) + "/", TMP_PLACEHOLDER + "/", text)
    return text


def portable(value, roots=(REPO_ROOT,)):
    """``portable_text`` on every string of a record, keys included (rank_traces keys its
    agreement by trace path)."""
    if isinstance(value, str):
        return portable_text(value, roots)
    if isinstance(value, dict):
        return {portable(k, roots) if isinstance(k, str) else k: portable(v, roots) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [portable(v, roots) for v in value]
    return value


def write_json(path: str | Path, record: dict) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(portable(record), indent=1, sort_keys=False, default=str) + "\n")
    os.replace(tmp, path)
    return path
