"""Every SGLang-version quirk sglang-dynspec depends on, in one place.

Nothing here imports SGLang at module import time: the version comes from package metadata,
so the cheap paths (disabled plugin, CLI) stay cheap.
"""

from __future__ import annotations

import dataclasses
import importlib.metadata
import importlib.util
import os
import pkgutil
from functools import lru_cache

from packaging.version import Version

# Releases whose internals the adapters were written against (and CPU-tested in tox).
MIN_SUPPORTED = Version("0.5.9")
MAX_SUPPORTED = Version("0.5.23")
FIRST_PLUGIN_FRAMEWORK = Version("0.5.11")
LAST_V1_WORKER = Version("0.5.12")  # EAGLEWorker removed in 0.5.13
FIRST_SCHEDULE_BATCH_V2 = Version("0.5.13")  # V2 worker receives ScheduleBatch + on_publish
FIRST_SPLIT_GRAPH_RUNNERS = Version("0.5.14")

V1_FORWARD = "sglang.srt.speculative.eagle_worker.EAGLEWorker.forward_batch_generation"
V2_FORWARD = "sglang.srt.speculative.eagle_worker_v2.EAGLEWorkerV2.forward_batch_generation"
INIT_MODEL_WORKER = "sglang.srt.managers.scheduler.Scheduler.init_model_worker"
HANDLE_GENERATE = "sglang.srt.managers.scheduler.Scheduler.handle_generate_request"

# Per-request opt-out: sampling_params.custom_params carries it (present in 0.5.9 - 0.5.23).
OPTOUT_KEY = "dynspec"
OPTOUT_VALUES = ("off", False)
RESULT_DECODE_MIXIN = (
    "sglang.srt.managers.scheduler_output_processor_mixin."
    "SchedulerOutputProcessorMixin.process_batch_result_decode"
)
RESULT_DECODE_PROCESSOR = (
    "sglang.srt.managers.scheduler_components.batch_result_processor."
    "SchedulerBatchResultProcessor.process_batch_result_decode"
)
GRAPH_CAN_RUN_OLD = "sglang.srt.model_executor.cuda_graph_runner.CudaGraphRunner.can_run"
GRAPH_CAN_RUN_NEW = (
    "sglang.srt.model_executor.runner.decode_cuda_graph_runner.DecodeCudaGraphRunner.can_run_graph"
)
SERVER_ARGS_ADD_CLI = "sglang.srt.server_args.ServerArgs.add_cli_args"
SERVER_ARGS_FROM_CLI = "sglang.srt.server_args.ServerArgs.from_cli_args"

# Accepted-draft count on GenerationBatchResult, by release (first match wins).
ACCEPTED_FIELDS = ("num_correct_drafts", "num_accepted_drafts", "num_accepted_tokens")
ACCEPTED_PER_REQ_FIELDS = (
    "num_correct_drafts_per_req_cpu",
    "num_accepted_drafts_per_req_cpu",
    "accept_length_per_req_cpu",
)


@lru_cache(maxsize=None)
def sglang_version() -> Version | None:
    try:
        return Version(importlib.metadata.version("sglang"))
    except importlib.metadata.PackageNotFoundError:
        return None


def base_version(v: Version) -> Version:
    return Version(v.base_version)


def support_problem(v: Version | None = None) -> str | None:
    """Why the installed release is not supported, or None if it is."""
    v = sglang_version() if v is None else v
    if v is None:
        return "SGLang is not installed"
    b = base_version(v)
    if b < MIN_SUPPORTED or b > MAX_SUPPORTED:
        return (
            f"SGLang {v} is not supported (supported: {MIN_SUPPORTED} to {MAX_SUPPORTED}); "
            "its speculative-decoding internals were not checked"
        )
    return None


def has_plugin_framework(v: Version | None = None) -> bool:
    v = sglang_version() if v is None else v
    if v is None:
        return False
    if base_version(v) >= FIRST_PLUGIN_FRAMEWORK:
        return True
    # A dev build may carry the framework early: look for the file without importing sglang.
    spec = importlib.util.find_spec("sglang")
    if spec is None or not spec.submodule_search_locations:
        return False
    return any(
        os.path.exists(os.path.join(loc, "srt", "plugins", "hook_registry.py"))
        for loc in spec.submodule_search_locations
    )


def has_v1_worker(v: Version | None = None) -> bool:
    v = sglang_version() if v is None else v
    return v is not None and base_version(v) <= LAST_V1_WORKER


def v2_takes_schedule_batch(v: Version | None = None) -> bool:
    v = sglang_version() if v is None else v
    return v is not None and base_version(v) >= FIRST_SCHEDULE_BATCH_V2


def result_decode_target(v: Version | None = None) -> str:
    v = sglang_version() if v is None else v
    return RESULT_DECODE_PROCESSOR if v is not None and base_version(v) >= FIRST_SCHEDULE_BATCH_V2 else RESULT_DECODE_MIXIN


def graph_guard_target(v: Version | None = None) -> str:
    v = sglang_version() if v is None else v
    return GRAPH_CAN_RUN_NEW if v is not None and base_version(v) >= FIRST_SPLIT_GRAPH_RUNNERS else GRAPH_CAN_RUN_OLD


def resolve(target: str):
    """(owner object, attribute name, current value) of a dotted target; imports its module."""
    obj_path, attr = target.rsplit(".", 1)
    owner = pkgutil.resolve_name(obj_path)
    return owner, attr, getattr(owner, attr)


def first_field(cls, names) -> str | None:
    """The first of ``names`` that the dataclass ``cls`` has (release-dependent field names)."""
    have = {f.name for f in dataclasses.fields(cls)}
    return next((n for n in names if n in have), None)


def worker_path(worker) -> str:
    """"v1" or "spec_v2" for an EAGLE worker instance."""
    mod = type(worker).__module__
    for klass in type(worker).__mro__:
        if klass.__name__ == "EAGLEWorkerV2":
            return "spec_v2"
        if klass.__name__ == "EAGLEWorker":
            return "v1"
    return "spec_v2" if "v2" in mod else "v1"


SUPPORTED_ALGORITHMS = ("EAGLE", "EAGLE3")  # NEXTN is turned into EAGLE by SGLang itself


def server_args_problems(sa) -> list[str]:
    """Server flags dynspec cannot work with, each naming the flag (checked before serving)."""
    problems = []
    algo = getattr(sa, "speculative_algorithm", None)
    algo = getattr(algo, "name", algo)  # an enum on some releases
    if not algo:
        problems.append("speculative_algorithm (--speculative-algorithm): not set; sglang-dynspec "
                        "controls EAGLE/EAGLE3 speculation and would have nothing to do")
    elif str(algo).upper() not in SUPPORTED_ALGORITHMS:
        problems.append(f"speculative_algorithm (--speculative-algorithm): {algo} is not supported; "
                        f"sglang-dynspec supports {', '.join(SUPPORTED_ALGORITHMS)}")
    if getattr(sa, "enable_dp_attention", False):
        problems.append("enable_dp_attention (--enable-dp-attention): not supported (every DP rank "
                        "would have to take the same decision)")
    if int(getattr(sa, "pp_size", 1) or 1) > 1:
        problems.append("pp_size (--pipeline-parallel-size): pipeline parallelism is not supported")
    return problems
