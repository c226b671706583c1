"""Every SGLang-version quirk sglang-dynspec depends on, in one place.

Nothing here imports SGLang at module import time: the version comes from package metadata,
so the cheap paths (disabled plugin, CLI) stay cheap.
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib
import importlib.metadata
import importlib.util
import inspect
import os
from functools import lru_cache

from packaging.version import Version

# Releases whose internals the adapters were written against (and CPU-tested in tox).
MIN_SUPPORTED = Version("0.5.9")
MAX_SUPPORTED = Version("0.5.23")
FIRST_PLUGIN_FRAMEWORK = Version("0.5.11")
LAST_V1_WORKER = Version("0.5.12")  # EAGLEWorker removed in 0.5.13
FIRST_SCHEDULE_BATCH_V2 = Version("0.5.13")  # V2 worker receives ScheduleBatch + on_publish
FIRST_SPLIT_GRAPH_RUNNERS = Version("0.5.14")
# Off-steps as plain decode batches (adapters/plain_batch.py): the scheduler paths it relies on
# were read and run on these releases only.  0.5.12 keeps next tokens in a ring FutureMap
# (store_to_map, slots named by negated output ids); 0.5.15 in one indexed by req_pool_idx
# (stash / publish, lengths published there too), and branches on each batch's own
# spec_algorithm in run_batch and result processing.
PLAIN_BATCH_RELEASES = (Version("0.5.12"), Version("0.5.15"))

V1_FORWARD = "sglang.srt.speculative.eagle_worker.EAGLEWorker.forward_batch_generation"
V2_FORWARD = "sglang.srt.speculative.eagle_worker_v2.EAGLEWorkerV2.forward_batch_generation"
V2_MODULE = "sglang.srt.speculative.eagle_worker_v2"
V2_CLASS = "EAGLEWorkerV2"
INIT_MODEL_WORKER = "sglang.srt.managers.scheduler.Scheduler.init_model_worker"
HANDLE_GENERATE = "sglang.srt.managers.scheduler.Scheduler.handle_generate_request"
CHECK_DECODE_MEM = "sglang.srt.managers.schedule_batch.ScheduleBatch.check_decode_mem"
FUTURE_STORE_RING = "sglang.srt.managers.overlap_utils.FutureMap.store_to_map"  # <= 0.5.12
FUTURE_STORE_POOL = "sglang.srt.managers.overlap_utils.FutureMap.stash"  # >= 0.5.13

# Per-request opt-out: sampling_params.custom_params carries it (present in 0.5.9 - 0.5.23).
OPTOUT_KEY = "dynspec"
OPTOUT_VALUES = ("off", False)


def request_opts_out(recv_req) -> bool:
    """Whether a generate request asks to run without speculation (its custom_params)."""
    sp = getattr(recv_req, "sampling_params", None)
    # A SamplingParams object, or a plain dict where the request was not converted.
    custom = getattr(sp, "custom_params", None) if sp is not None and not isinstance(sp, dict) else \
        (sp or {}).get("custom_params")
    return isinstance(custom, dict) and custom.get(OPTOUT_KEY) in OPTOUT_VALUES


def reqs_are_greedy(reqs) -> bool | None:
    """Whether every request samples greedily (``top_k`` 1, what SGLang makes of temperature 0, and
    its own greedy test); None without requests or where a request does not say.  Read from the
    requests, not the batch's ``sampling_info.is_all_greedy``: the batch that result processing gets
    is a copy without sampling info (0.5.12's ``ScheduleBatch.copy``), and a running batch keeps the
    flag False after its sampled requests left, so decision and result would disagree."""
    if not reqs:
        return None
    try:
        return all(r.sampling_params.top_k <= 1 for r in reqs)
    except (AttributeError, TypeError):
        return None


def decode_batch_reqs(batch, running_batch):
    """The requests of a decode batch the worker received."""
    # spec_v2 <= 0.5.12 receives a ModelWorkerBatch without reqs: its rows are the running batch's.
    return getattr(batch, "reqs", None) or getattr(running_batch, "reqs", None) or ()


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
# 0.5.11-0.5.13 capture the target's piecewise prefill graph with no hidden-state output, then refuse
# it to every batch asking for hidden states - every EAGLE target prefill: it is captured, never replayed.
# From 0.5.14 SGLang decides this itself (eager, or breakable graphs captured for hidden states).
PREFILL_GRAPH_CAN_RUN = (
    "sglang.srt.model_executor.piecewise_cuda_graph_runner.PiecewiseCudaGraphRunner.can_run"
)
FIRST_PREFILL_GRAPH_MODE_CHECK = Version("0.5.11")  # 0.5.9 replays it for EAGLE prefills as is
SERVER_ARGS_ADD_CLI = "sglang.srt.server_args.ServerArgs.add_cli_args"
SERVER_ARGS_FROM_CLI = "sglang.srt.server_args.ServerArgs.from_cli_args"

# Accepted-draft count on GenerationBatchResult, by release (first match wins).
# GenerationBatchResult names, newest first: 0.5.12 / 0.5.11 / 0.5.9-0.5.10.
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


def plain_batch_release_problem(v: Version | None = None) -> str | None:
    """Why off-steps cannot run as plain decode batches on this release (None: they can)."""
    v = sglang_version() if v is None else v
    if v is None or base_version(v) not in PLAIN_BATCH_RELEASES:
        return (f"plain batches are built on SGLang {', '.join(map(str, PLAIN_BATCH_RELEASES))}'s scheduler; "
                f"this is {v}")
    return None


def future_store_target(v: Version | None = None) -> str:
    """Where a step's next tokens enter the FutureMap on this release."""
    v = sglang_version() if v is None else v
    return FUTURE_STORE_POOL if v is not None and base_version(v) >= FIRST_SCHEDULE_BATCH_V2 else FUTURE_STORE_RING


@lru_cache(maxsize=None)
def future_map_by_pool() -> bool:
    """Whether the installed FutureMap keys its slots by req_pool_idx (>= 0.5.13: stash / publish)
    rather than by indices handed out per step (<= 0.5.12: store_to_map)."""
    return future_store_target() == FUTURE_STORE_POOL


@lru_cache(maxsize=None)
def future_token_resolver():
    """SGLang's in-place resolve of a plain batch's future token ids from a token buffer (<= 0.5.12's
    ring FutureMap: one JIT kernel on CUDA, its torch ops elsewhere); None where the release has none."""
    from sglang.srt.managers import overlap_utils

    return getattr(overlap_utils, "_resolve_future_token_ids", None)


def decode_log_counter(processor):
    """What holds the decode log's speculative counts (``update_spec_metrics``): the result
    processor itself (<= 0.5.12's mixin), or its metrics reporter (0.5.15)."""
    return getattr(processor, "metrics_reporter", processor)


def speculative_algorithm_none():
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

    return SpeculativeAlgorithm.NONE


def future_indices(indices):
    """The FutureMap's handle on the slots ``indices`` (what a speculative batch's draft input carries)."""
    from sglang.srt.managers.overlap_utils import FutureIndices

    return FutureIndices(indices=indices)


def result_decode_target(v: Version | None = None) -> str:
    v = sglang_version() if v is None else v
    return RESULT_DECODE_PROCESSOR if v is not None and base_version(v) >= FIRST_SCHEDULE_BATCH_V2 else RESULT_DECODE_MIXIN


def graph_guard_target(v: Version | None = None) -> str:
    v = sglang_version() if v is None else v
    return GRAPH_CAN_RUN_NEW if v is not None and base_version(v) >= FIRST_SPLIT_GRAPH_RUNNERS else GRAPH_CAN_RUN_OLD


def prefill_graph_target(v: Version | None = None) -> str | None:
    """The piecewise prefill graph's ``can_run`` where it refuses EAGLE prefills; None elsewhere."""
    v = sglang_version() if v is None else v
    if v is None or not FIRST_PREFILL_GRAPH_MODE_CHECK <= base_version(v) < FIRST_SPLIT_GRAPH_RUNNERS:
        return None
    return PREFILL_GRAPH_CAN_RUN


def target_graph_runner_class():
    """The target's decode graph runner class of the installed release (the owner of the guarded
    ``can_run``; renamed and moved in 0.5.14)."""
    owner, _attr, _fn = resolve(graph_guard_target())
    return owner


def resolve(target: str):
    """(owner object, attribute name, current value) of a dotted target; imports its module.

    Unlike pkgutil.resolve_name, an import that fails inside SGLang (e.g. its kernels needing a
    CUDA driver) surfaces with its real cause instead of as a missing attribute.
    """
    obj_path, attr = target.rsplit(".", 1)
    parts = obj_path.split(".")
    for i in range(len(parts), 0, -1):
        mod_name = ".".join(parts[:i])
        try:
            obj = importlib.import_module(mod_name)
        except ModuleNotFoundError as e:
            if e.name == mod_name:  # that prefix is a class or attribute, not a module: go shorter
                continue
            raise
        for p in parts[i:]:
            obj = getattr(obj, p)
        return obj, attr, getattr(obj, attr)
    raise ModuleNotFoundError(f"no importable module in {obj_path}")


def first_field(cls, names) -> str | None:
    """The first of ``names`` that the dataclass ``cls`` has (release-dependent field names)."""
    have = dataclass_field_names(cls)
    return next((n for n in names if n in have), None)


@lru_cache(maxsize=None)
def dataclass_field_names(cls) -> frozenset:
    # Cached: called several times per off-step, and the classes never change in a process.
    return frozenset(f.name for f in dataclasses.fields(cls))


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


# --------------------------------------------------------------------------------------------
# spec_v2 worker path (EAGLEWorkerV2, adapters/spec_v2.py).  Version-dependent helpers, keyed by
# feature detection on the installed classes.


def v2_worker_module():
    return importlib.import_module(V2_MODULE)


def v2_worker_class():
    return getattr(v2_worker_module(), V2_CLASS)


@lru_cache(maxsize=None)
def v2_input_kind() -> str:
    """``"model_worker_batch"`` (<= 0.5.12) or ``"schedule_batch"`` (>= 0.5.13), from the
    first parameter name of the installed ``EAGLEWorkerV2.forward_batch_generation``."""
    fn = inspect.unwrap(v2_worker_class().forward_batch_generation)
    params = list(inspect.signature(fn).parameters)
    first = params[1] if len(params) > 1 else ""
    return "model_worker_batch" if first == "model_worker_batch" else "schedule_batch"


# Eager Triton helpers of a spec_v2 step that take next_power_of_2(bs) as a compile-time constant
# (so each new power of two compiles on first launch), by name; each lists where releases keep it.
SPEC_STEP_KERNELS = {
    # the speculative prepare-for-decode's req_to_token write (every release)
    "assign_req_to_token_pool": ("sglang.srt.speculative.spec_utils.assign_req_to_token_pool_func",),
    # the verify's cache locations (moved to triton_ops in 0.5.13)
    "assign_extend_cache_locs": ("sglang.srt.speculative.triton_ops.cache_locs.assign_extend_cache_locs_func",
                                 "sglang.srt.speculative.eagle_info_v2.assign_extend_cache_locs_func"),
    # topk > 1: the accepted path's KV move (a module function from 0.5.13; 0.5.12 runs topk > 1 on v1)
    "move_accept_tokens": ("sglang.srt.speculative.spec_utils.move_accept_tokens_to_target_kvcache",),
}


def spec_step_kernels() -> dict:
    """{name: SGLang's function} of the ``SPEC_STEP_KERNELS`` the installed release has."""
    found = {}
    for name, paths in SPEC_STEP_KERNELS.items():
        for path in paths:
            try:
                found[name] = resolve(path)[2]
                break
            except (ImportError, AttributeError):
                continue
    return found


def triton_kv_splits(model_runner):
    """The Triton attention backend's ``get_num_kv_splits`` of ``model_runner`` (None on other
    backends): its kernel is launched eagerly around every decode, verify and draft graph replay."""
    backend = getattr(model_runner, "attn_backend", None)
    fn = getattr(backend, "get_num_kv_splits", None)
    return fn if callable(fn) else None


TRITON_MULTI_STEP_DRAFT_BACKEND = "sglang.srt.layers.attention.triton_backend.TritonMultiStepDraftBackend"


def draft_kv_indices(worker):
    """The ``common_template`` of the draft's Triton multi-step attention backend (None on other
    backends, whose templates need a real draft input): it fills the draft steps' KV indices
    before every draft forward, graph replay included."""
    backend = getattr(getattr(worker, "draft_worker", None), "draft_attn_backend", None)
    try:
        triton_cls = resolve(TRITON_MULTI_STEP_DRAFT_BACKEND)[2]
    except (ImportError, AttributeError):
        return None
    return backend.common_template if isinstance(backend, triton_cls) else None


def only_fields(cls, **values) -> dict:
    """Keep the keyword values ``cls`` (a dataclass) knows; field names changed across releases."""
    names = dataclass_field_names(cls)
    return {k: v for k, v in values.items() if k in names}


def draft_input_bonus_field(draft_input_cls) -> str:
    # 0.5.12 renamed verified_id -> bonus_tokens.
    names = dataclass_field_names(draft_input_cls)
    return "bonus_tokens" if "bonus_tokens" in names else "verified_id"


@lru_cache(maxsize=None)
def target_capture_channel() -> str:
    """How the target forward is told which hidden states to capture.

    ``"batch_field"``: a ``capture_hidden_mode`` field on the batch it receives (ModelWorkerBatch
    <= 0.5.12; ScheduleBatch 0.5.13-0.5.15, read and cleared by ``ForwardBatch.init_new``).
    ``"kwarg"``: ``TpModelWorker.forward_batch_generation(..., capture_hidden_mode=)`` (0.5.23;
    ScheduleBatch has no such field, and an attribute set on it is silently ignored).
    ``""``: neither, so the draft-extend could not get the target hidden states.
    """
    from sglang.srt.managers.tp_worker import TpModelWorker

    if v2_input_kind() == "model_worker_batch":
        from sglang.srt.managers.schedule_batch import ModelWorkerBatch

        return "batch_field" if "capture_hidden_mode" in dataclass_field_names(ModelWorkerBatch) else ""
    params = inspect.signature(inspect.unwrap(TpModelWorker.forward_batch_generation)).parameters
    if "capture_hidden_mode" in params:
        return "kwarg"
    from sglang.srt.managers.schedule_batch import ScheduleBatch

    return "batch_field" if "capture_hidden_mode" in dataclass_field_names(ScheduleBatch) else ""


def target_graph_runner_attr(model_runner) -> str:
    # 0.5.14 renamed ModelRunner.graph_runner -> decode_cuda_graph_runner.
    return "decode_cuda_graph_runner" if hasattr(model_runner, "decode_cuda_graph_runner") else "graph_runner"


def draft_contexts(worker) -> contextlib.ExitStack:
    """The context managers upstream wraps every draft-model call in (TP group, MoE backends)."""
    mod = v2_worker_module()
    stack = contextlib.ExitStack()
    dw = worker.draft_worker
    tp_ctx = getattr(dw, "draft_tp_context", None)
    if callable(tp_ctx) and hasattr(getattr(dw, "draft_runner", None), "tp_group"):
        # <= 0.5.2x: per-worker callable taking the draft runner's tp_group.
        stack.enter_context(tp_ctx(dw.draft_runner.tp_group))
    elif hasattr(dw, "parallel_layout") and callable(getattr(mod, "draft_tp_context", None)):
        # 0.5.23: module-level draft_tp_context(parallel_layout).
        stack.enter_context(mod.draft_tp_context(dw.parallel_layout))
    _enter_moe_contexts(stack, mod)
    return stack


def _enter_moe_contexts(stack: contextlib.ExitStack, worker_module) -> None:
    # The speculative MoE backend contexts, imported into the worker module's namespace.
    for name in ("speculative_moe_backend_context", "speculative_moe_a2a_backend_context"):
        fn = getattr(worker_module, name, None)
        if callable(fn):
            stack.enter_context(fn())


# --------------------------------------------------------------------------------------------
# v1 worker path (EAGLEWorker, adapters/v1.py).  All of them feature-detect on the installed
# classes; none compares version strings.


def last_token_ids(draft_input):
    """Each request's newest output token (KV not written yet) on an EagleDraftInput."""
    tokens = getattr(draft_input, "bonus_tokens", None)  # 0.5.12
    if tokens is None:
        tokens = getattr(draft_input, "verified_id", None)  # <= 0.5.11
    return tokens


def build_draft_input(tokens, *, topk_p, topk_index, hidden_states):
    """A v1 ``EagleDraftInput`` for the next step under the installed field names (newest token
    in ``bonus_tokens`` on 0.5.12, ``verified_id`` before), hidden capture LAST as upstream sets."""
    from sglang.srt.model_executor.forward_batch_info import CaptureHiddenMode
    from sglang.srt.speculative import eagle_info

    cls = eagle_info.EagleDraftInput
    return cls(**{draft_input_bonus_field(cls): tokens}, topk_p=topk_p, topk_index=topk_index, hidden_states=hidden_states,
               capture_hidden_mode=CaptureHiddenMode.LAST)


def draft_extend_layout() -> str:
    """Which draft-extend input the installed release uses.

    ``extend_input``  0.5.12: separate ``EagleDraftExtendInput``; the worker returns the next
                      ``EagleDraftInput``.
    ``num_accepted``  0.5.11: ``EagleDraftInput`` with ``num_accepted_drafts/_tokens``.
    ``accept_length`` 0.5.9/0.5.10: ``EagleDraftInput`` with ``accept_length`` (drafts only).
    """
    from sglang.srt.speculative import eagle_info

    if hasattr(eagle_info, "EagleDraftExtendInput"):
        return "extend_input"
    names = dataclass_field_names(eagle_info.EagleDraftInput)
    if "num_accepted_tokens" in names and "num_accepted_drafts" in names:
        return "num_accepted"
    if "accept_length" in names:
        return "accept_length"
    raise RuntimeError("sglang-dynspec v1 adapter: unknown EagleDraftInput layout in this SGLang")


def build_draft_extend_input(*, hidden_states, tokens, seq_lens, seq_lens_cpu, req_pool_indices):
    """Draft-extend input for exactly one new token per request (zero accepted drafts).

    ``tokens`` is the token just sampled by the target; ``hidden_states`` the target's hidden
    state at the position before it (capture LAST of the off-step); ``seq_lens`` already
    include the new position.  Upstream's kernel then derives position ``seq_lens - 1`` and
    the next bonus token (= ``tokens``).
    """
    import torch
    from sglang.srt.speculative import eagle_info

    n = int(tokens.shape[0])
    device = tokens.device
    zeros = torch.zeros((n,), dtype=torch.int32, device=device)
    layout = draft_extend_layout()
    if layout == "extend_input":
        return eagle_info.EagleDraftExtendInput(
            hidden_states=hidden_states,
            num_correct_drafts=zeros,
            num_accept_tokens=zeros + 1,
            num_accept_tokens_cpu=[1] * n,
            input_ids=tokens,
            seq_lens=seq_lens,
            seq_lens_cpu=seq_lens_cpu,
            req_pool_indices=req_pool_indices,
        )
    common = dict(
        hidden_states=hidden_states,
        verified_id=tokens,
        seq_lens_for_draft_extend=seq_lens,
        seq_lens_for_draft_extend_cpu=seq_lens_cpu,
        req_pool_indices_for_draft_extend=req_pool_indices,
    )
    if layout == "num_accepted":
        return eagle_info.EagleDraftInput(
            num_accepted_drafts=zeros,
            num_accepted_tokens=zeros + 1,
            num_accepted_drafts_cpu=[0] * n,
            num_accepted_tokens_cpu=[1] * n,
            **common,
        )
    # accept_length counts accepted drafts; prepare_extend_after_decode adds the bonus.
    return eagle_info.EagleDraftInput(accept_length=zeros, accept_length_cpu=[0] * n, **common)


def result_kwargs(result_cls, *, bs: int) -> dict:
    """Accepted-draft fields (all zero) under the installed GenerationBatchResult's names."""
    count = first_field(result_cls, ACCEPTED_FIELDS)
    if count is None:
        raise RuntimeError("sglang-dynspec v1 adapter: GenerationBatchResult has no accepted-draft count field")
    out = {count: 0}
    per_req = first_field(result_cls, ACCEPTED_PER_REQ_FIELDS)
    if per_req is not None:
        out[per_req] = [0] * bs
    return out


def spec_contexts(worker):
    """The context managers upstream enters around every draft-model forward."""
    from sglang.srt.speculative import eagle_worker as ew

    stack = contextlib.ExitStack()
    tp_ctx = getattr(worker, "draft_tp_context", None)
    if tp_ctx is not None:
        stack.enter_context(tp_ctx(worker.draft_model_runner.tp_group))
    _enter_moe_contexts(stack, ew)
    return stack




def draft_extend_hidden_width(worker):
    """Width of the draft-extend graph's hidden buffer, or None (no graph / not found)."""
    runner = getattr(worker, "cuda_graph_runner_for_draft_extend", None)
    if runner is None:
        return None
    buf = getattr(getattr(runner, "buffers", None), "hidden_states", None)  # 0.5.12
    if buf is None:
        buf = getattr(runner, "hidden_states", None)  # <= 0.5.11
    if buf is None or getattr(buf, "ndim", 0) != 2:
        return None
    return int(buf.shape[1])


def prefill_rows(batch) -> int:
    """Requests a non-decode batch prefills (0 for anything else): what the cost model charges
    prefill time per.  Shapes only, no GPU sync; a chunked prompt counts once per chunk."""
    fm = getattr(batch, "forward_mode", None)
    is_idle = getattr(fm, "is_idle", None)
    if fm is None or fm.is_decode() or (is_idle is not None and is_idle()):
        return 0
    seq_lens = getattr(batch, "seq_lens", None)
    shape = getattr(seq_lens, "shape", None)
    if shape:
        return int(shape[0])
    return len(getattr(batch, "reqs", None) or ())


# --------------------------------------------------------------------------------------------
# Which speculative algorithms, targets and drafts the off-step adapters can run, decided here
# once for both adapters.


def adapter_algorithm_problem(algo) -> str | None:
    """Why an adapter cannot run off-steps under this speculative algorithm (None: it can).

    The adapters also take STANDALONE (a draft that reads no target hidden states) although
    activation refuses it (``SUPPORTED_ALGORITHMS``): kept as the adapters always had it.
    """
    if algo is None or not (algo.is_eagle() or algo.is_standalone()):
        return f"speculative algorithm {algo!r} is not EAGLE/EAGLE3/STANDALONE"
    return None


def draft_reads_target_hidden(algo) -> bool:
    # STANDALONE drafts read no target hidden states.
    return not algo.is_standalone()


# ModelRunner attributes set for a hybrid (mamba / linear-attention) target, whose verify-time
# state commit the off-step does not replicate.
HYBRID_TARGET_MARKERS = ("hybrid_gdn_config", "mamba2_config", "hybrid_lightning_config")
# The spec_v2 adapter has only ever checked the first two: a lightning-attention hybrid target is
# not refused there.  Left so (a behaviour change that needs a GPU run to judge).
V2_HYBRID_TARGET_MARKERS = HYBRID_TARGET_MARKERS[:2]


def target_is_hybrid(model_runner, markers=HYBRID_TARGET_MARKERS) -> bool:
    return any(getattr(model_runner, a, None) is not None for a in markers)


def target_kv_is_compressed(kv_cache) -> bool:
    # A compressed-KV target (c128 draft states) needs a draft-state cleanup the off-step lacks.
    return getattr(kv_cache, "clear_unaccepted_c128_draft_states", None) is not None


def offstep_graphs_release_problem(need_hidden: bool = True) -> str | None:
    """Why the installed release cannot get off-step DECODE graphs (adapters/offstep_graphs.py)
    by a second backend and runner (None: it can)."""
    try:
        cls = target_graph_runner_class()
        from sglang.srt.model_executor.model_runner import ModelRunner
    except ImportError as exc:
        return f"graph runner not importable ({exc}); eager"
    # Without its own backend the runner would call init_cuda_graph_state on the live one,
    # reallocating buffers the verify graphs replay from (0.5.9 has no such parameter).
    if "attn_backend" not in inspect.signature(cls.__init__).parameters:
        return f"{cls.__name__} takes no separate attn_backend on this release; eager"
    if "init_new_workspace" not in inspect.signature(ModelRunner._get_attention_backend).parameters:
        return "ModelRunner._get_attention_backend cannot build a second backend on this release; eager"
    # No attribute tells which switches the runner's __init__ reads: its source text does.
    try:
        src = inspect.getsource(cls.__init__)
    except (OSError, TypeError):
        return f"source of {cls.__name__}.__init__ unavailable; eager"
    # The two switches capture() flips must be the ones this runner reads.
    if "spec_algorithm.is_speculative()" not in src:
        return f"{cls.__name__} does not pick its capture mode from spec_algorithm; eager"
    if need_hidden and "enable_return_hidden_states" not in src:
        return f"{cls.__name__} does not read enable_return_hidden_states; eager"
    return None


# What a light prefill (adapters/spec_v2.forward_prefill_off) reads from the batch the spec_v2
# worker receives: token ids, KV slots, lengths after the extend, and the per-request extend and
# cached-prefix lengths, which each input kind names its own way.
LIGHT_PREFILL_BATCH_FIELDS = ("input_ids", "out_cache_loc", "seq_lens", "capture_hidden_mode")
PREFILL_LENS_FIELDS = {"model_worker_batch": ("extend_seq_lens", "extend_prefix_lens"),
                       "schedule_batch": ("extend_lens", "prefix_lens")}
# Releases whose ScheduleBatch prefill branch (target extend, publication of the batch's lengths,
# draft extend with chunk-aware tail tokens) was read and is replicated by the light prefill.
LIGHT_PREFILL_SCHEDULE_BATCH_RELEASES = (Version("0.5.15"),)


def light_prefill_release_problem() -> str | None:
    """Why prefills while off must run the draft's extend forward on the installed release's
    spec_v2 worker (None: the light prefill can run)."""
    kind = v2_input_kind()
    if kind == "model_worker_batch":
        from sglang.srt.managers.schedule_batch import ModelWorkerBatch as batch_cls
    else:
        v = sglang_version()
        if v is None or base_version(v) not in LIGHT_PREFILL_SCHEDULE_BATCH_RELEASES:
            return (f"the light prefill of a ScheduleBatch is built on SGLang "
                    f"{', '.join(map(str, LIGHT_PREFILL_SCHEDULE_BATCH_RELEASES))}'s prefill; this is {v}")
        from sglang.srt.managers.schedule_batch import ScheduleBatch as batch_cls
    wanted = LIGHT_PREFILL_BATCH_FIELDS + PREFILL_LENS_FIELDS[kind]
    missing = [f for f in wanted if f not in dataclass_field_names(batch_cls)]
    if missing:
        return f"{batch_cls.__name__} has no {', '.join(missing)}"
    return None


def prefill_lens(batch) -> tuple:
    """(per-request extend lengths, per-request cached-prefix lengths) of an extend batch the
    installed spec_v2 worker receives; None for one it lacks."""
    extend, prefix = PREFILL_LENS_FIELDS[v2_input_kind()]
    return getattr(batch, extend, None), getattr(batch, prefix, None)


def prefill_tail_tokens(batch, next_token_ids):
    """The token after each request's last prompt token in the draft's prefill: its new token,
    except for a chunked request's non-final chunk on releases that give it the next prompt
    token (SGLang's own helper, where the installed release has one)."""
    helper = _prefill_tail_token_helper()
    return next_token_ids if helper is None else helper(batch, next_token_ids)


@lru_cache(maxsize=None)
def _prefill_tail_token_helper():
    try:
        from sglang.srt.speculative.eagle_utils import _eagle_prefill_tail_tokens
    except ImportError:
        return None
    return _eagle_prefill_tail_tokens


def light_sync_draft_problem(draft_model_runner) -> str | None:
    """Why the light draft sync (adapters/draft_kv.py) cannot be used with this draft (None: it can)."""
    model = getattr(draft_model_runner, "model", None)
    inner = getattr(model, "model", None)
    if model is None or inner is None:
        return "no draft model"
    if not type(model).__name__.endswith("Eagle3"):
        return f"draft {type(model).__name__} is not an EAGLE-3 draft"
    layers = getattr(inner, "layers", None)
    if layers is None or len(layers) != 1:
        return f"draft has {0 if layers is None else len(layers)} layers (the light sync needs exactly 1)"
    layer = layers[0]
    for attr in ("hidden_norm", "input_layernorm", "self_attn"):
        if not hasattr(layer, attr):
            return f"draft layer has no {attr}"
    if getattr(layer, "is_input_layer", True) is not True:
        return "draft layer 0 is not an input layer"
    if getattr(inner, "is_mrope_enabled", False):
        return "mrope draft"
    for attr in ("embed_tokens", "fc"):
        if not hasattr(inner, attr):
            return f"draft model has no {attr}"
    attn = layer.self_attn
    if not (hasattr(attn, "forward_prepare_native") or hasattr(attn, "qkv_proj")):
        return "draft attention exposes no q/k/v projection"
    pool = getattr(draft_model_runner, "token_to_kv_pool", None)
    if type(pool).__name__ != "MHATokenToKVPool":
        return f"draft KV pool {type(pool).__name__} (the light sync writes MHATokenToKVPool only)"
    return None
