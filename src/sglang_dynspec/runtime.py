"""The hooks SGLang calls, and the per-process state behind them.

One scheduler process holds at most one EAGLE worker, so the state is process-global.
Wrappers stay cheap on every step: attribute reads, one policy call, no GPU sync (a switch to
plain-batch off-steps waits once for the last speculative step: adapters/plain_batch.to_plain).
"""

from __future__ import annotations

import importlib
import logging
import os
import time
import weakref
from typing import TYPE_CHECKING, Any

from . import compat
from .adapters import plain_batch
from .config import DynspecSettings
from .controller import Controller, StepMode

if TYPE_CHECKING:
    from .adapters import Adapter

logger = logging.getLogger("sglang_dynspec")

ADAPTER_MODULES = {"v1": "sglang_dynspec.adapters.v1", "spec_v2": "sglang_dynspec.adapters.spec_v2"}


class WorkerState:
    """What the wrappers need for one EAGLE worker."""

    def __init__(self, settings: DynspecSettings, controller: Controller, scheduler: Any, worker: Any,
                 path: str, adapter: Adapter | None):
        self.settings = settings
        self.controller = controller
        self.scheduler = scheduler
        self.worker = worker
        self.path = path
        self.adapter = adapter  # None: no adapter for this path, every step runs upstream
        # The off-step results handed to SGLang and not yet seen by the result hook, by id()
        # (weak: one dropped without processing leaves no entry behind).
        self.off_results: weakref.WeakValueDictionary = weakref.WeakValueDictionary()
        self.stats_writer = None
        self.prometheus = None
        self.accepted_field: str | None = None
        self.optout_rids: set = set()  # requests that asked for no speculation, still possibly running
        self.optout_absent: set = set()  # opt-outs not seen in any queue at the last check
        self.optout_not_honoured = 0  # opted-out batches the adapter could not run without speculation
        # CPU seconds and calls spent in dynspec's own code per hook (SGLang's calls and off-steps
        # excluded): what the plugin adds to a step where it decides nothing (stats file).
        self.hook_cpu = dict.fromkeys(HOOK_NAMES, 0.0)
        self.hook_calls = dict.fromkeys(HOOK_NAMES, 0)
        self.prefill_graph_replays = 0  # EAGLE prefills that replayed the target's prefill graph
        self.light_prefills = 0  # prefills while off that wrote the draft KV directly (no draft extend)
        # Host seconds and count of the worker's prefill forwards: the light one (while off) and
        # SGLang's EAGLE prefill.  Under the overlap scheduler a forward only launches GPU work, so
        # a large figure is CPU work or a wait inside it (row 4's high phases, pair2k-rows34).
        self.prefill_host_s = {"light": 0.0, "upstream": 0.0}
        self.prefill_calls = {"light": 0, "upstream": 0}
        # Off-steps run as plain decode batches (adapters/plain_batch.py): then every running batch's
        # step is decided at its memory check, and the forward runs what was decided there.
        self.plain = False
        self.planned: StepMode | None = None  # that decision, for the forward of the same step
        self.plain_steps = 0  # off-steps that ran as plain decode batches

    def spent(self, hook: str, since: float) -> None:
        self.hook_cpu[hook] += time.perf_counter() - since
        self.hook_calls[hook] += 1

    def prefill_took(self, kind: str, since: float) -> None:
        self.prefill_host_s[kind] += time.perf_counter() - since
        self.prefill_calls[kind] += 1

    def took_off_result(self, result) -> bool:
        """Whether ``result`` came from an off-step (forgotten once asked: one hook call per result)."""
        # A live entry under id(result) can only be result itself.
        return result is not None and self.off_results.pop(id(result), None) is result

    def snapshot(self) -> dict:
        s = self.controller.snapshot()
        s["worker_path"] = self.path
        s["optout_not_honoured"] = self.optout_not_honoured
        c = self.controller.stats
        # lifetime mean over speculative steps only (off-steps excluded), for resume checks
        s["accept_length_on_steps"] = 1.0 + c["accepted_drafts"] / c["spec_rows"] if c["spec_rows"] else None
        s["hook_cpu_s"] = {k: round(v, 6) for k, v in self.hook_cpu.items()}
        s["hook_calls"] = dict(self.hook_calls)
        s["prefill_graph_replays"] = self.prefill_graph_replays
        s["light_prefills"] = self.light_prefills
        s["prefill_forward_host_ms"] = {k: round(1e3 * t / self.prefill_calls[k], 3) if self.prefill_calls[k] else None
                                        for k, t in self.prefill_host_s.items()}
        s["offstep_batch"] = "plain" if self.plain else "speculative"
        s["plain_steps"] = self.plain_steps
        steps = c["decode_steps"]
        s["hook_cpu_us_per_decode_step"] = round(1e6 * sum(self.hook_cpu.values()) / steps, 2) if steps else None
        v = self.controller.view
        bs = self.controller.last_decode_bs
        if v is not None and bs:
            s["decode_bs"] = bs
            s["cost_on_s"] = v.estimate(True, bs)  # decode step alone
            s["cost_off_s"] = v.estimate(False, bs)
            # what the policy uses at this batch size and acceptance
            s["prefill_per_request_on_s"] = v.prefill_per_request(True, bs, self.controller.accept_length)
            s["prefill_per_request_off_s"] = v.prefill_per_request(False)
            s["requests_per_token"] = v.requests_per_token()
            s["arrivals_per_s"] = v.arrivals_per_s
            s["prefill_mode_factor_off"], s["prefill_mode_factor_on"] = v.mode_factor
        return s


HOOK_NAMES = ("forward", "result", "graph_guard", "generate", "prefill_graph", "memcheck", "store")

STATE: WorkerState | None = None
SETTINGS: DynspecSettings | None = None  # set by activation before any hook can run
POLICY: Any = None  # the policy activation built and validated from SETTINGS (one per process)


def _load_adapter(path: str):
    try:
        return importlib.import_module(ADAPTER_MODULES[path])
    except ImportError as e:
        logger.warning("sglang-dynspec: no %s adapter (%s); off decisions are recorded, not applied", path, e)
        return None


def _agree_fn(scheduler):
    group = getattr(scheduler, "tp_cpu_group", None)
    if group is None:
        return None

    def agree(vec: list) -> list:
        import torch
        import torch.distributed as dist

        t = torch.tensor(vec, dtype=torch.float64)
        dist.all_reduce(t, group=group)
        return t.tolist()

    return agree


def attach(scheduler: Any) -> WorkerState | None:
    """Build the controller for this scheduler's EAGLE worker (AFTER init_model_worker)."""
    global STATE
    settings = SETTINGS
    if settings is None or not settings.enabled:
        return None
    from .compat import server_args_problems
    from .errors import ActivationError

    problems = server_args_problems(getattr(scheduler, "server_args", None))
    if problems:
        # Also caught here for the Engine API and releases without --dynspec-* flags.
        raise ActivationError("incompatible server flags:\n  " + "\n  ".join(problems))
    worker = getattr(scheduler, "draft_worker", None)
    algo = getattr(worker, "speculative_algorithm", None) or getattr(scheduler, "spec_algorithm", None)
    if worker is None or algo is None or not algo.is_eagle():
        raise ActivationError(f"no EAGLE worker in this scheduler (draft worker: {type(worker).__name__}); "
                              "nothing to control")
    tp_rank = int(getattr(scheduler, "tp_rank", 0) or 0)
    tp_size = int(getattr(scheduler, "tp_size", 1) or 1)
    sa = getattr(scheduler, "server_args", None)
    ctl = new_controller(tp_rank=tp_rank, tp_size=tp_size,
                         agree=_agree_fn(scheduler) if tp_size > 1 else None,
                         verify_rows=getattr(sa, "speculative_num_draft_tokens", None))
    path = compat.worker_path(worker)
    adapter = _load_adapter(path)
    st = WorkerState(settings, ctl, scheduler, worker, path, adapter)
    try:
        from sglang.srt.managers.utils import GenerationBatchResult

        st.accepted_field = compat.first_field(GenerationBatchResult, compat.ACCEPTED_FIELDS)
    except Exception:  # pragma: no cover - reported by doctor
        st.accepted_field = None
    extra = {"policy": ctl.policy_name, "tp_rank": tp_rank, "worker_path": path}
    if settings.stats_dir is not None:
        from .metrics import StatsWriter

        st.stats_writer = StatsWriter(settings.stats_dir, extra)
    if settings.metrics and os.environ.get("PROMETHEUS_MULTIPROC_DIR") and getattr(sa, "enable_metrics", False):
        try:
            from .metrics import PrometheusExporter

            st.prometheus = PrometheusExporter({"tp_rank": str(tp_rank)})
        except Exception:
            logger.exception("sglang-dynspec: Prometheus metrics unavailable")
    STATE = st
    # Off-step graphs are captured now, right after SGLang's own capture and before serving,
    # rather than stalling the first off-step.
    if adapter is not None and settings.policy != "always":
        try:
            adapter.prepare(worker, settings)
            st.plain = adapter.runs_plain_batches(worker)
        except Exception:
            logger.exception("sglang-dynspec: adapter prepare() failed; off-steps stay eager")
    logger.warning(
        "sglang-dynspec: controlling %s worker (%s) with policy %r on tp rank %d/%d",
        path, type(worker).__name__, ctl.policy_name, tp_rank, tp_size,
    )
    return st


def new_controller(tp_rank: int = 0, tp_size: int = 1, agree=None, verify_rows: int | None = None) -> Controller:
    """A controller for the settings and policy activation validated, with every installed observer;
    ``verify_rows``: the server's speculative_num_draft_tokens."""
    from .plugins import pm

    settings = SETTINGS
    if settings is None or POLICY is None:
        from .errors import ActivationError

        raise ActivationError("no policy: sglang_dynspec.activation.activate() has not run in this process")
    return Controller(
        POLICY,
        safe_mode_on=settings.safe_mode == "on",
        deadline_s=settings.policy_deadline_ms / 1e3,
        deadline_strikes=settings.policy_deadline_strikes,
        sync_interval=settings.sync_interval_steps,
        tp_rank=tp_rank,
        tp_size=tp_size,
        agree=agree,
        hook=pm.hook if _has_observers(pm) else None,
        verify_rows=verify_rows,
    )


OBSERVER_HOOKS = ("dynspec_decision", "dynspec_switch", "dynspec_policy_failed")


def _has_observers(pm) -> bool:
    # Without observers the controller skips the per-step hook calls altogether.
    return any(getattr(pm.hook, name).get_hookimpls() for name in OBSERVER_HOOKS)


# --- hooks ------------------------------------------------------------------------------

def after_init_model_worker(result, scheduler, *args, **kwargs):
    attach(scheduler)
    return None


def _forward(original, worker, batch, *args, **kwargs):
    st = STATE
    if st is None or st.worker is not worker or st.adapter is None:
        return original(worker, batch, *args, **kwargs)
    t0 = time.perf_counter()
    adapter = st.adapter
    ctl = st.controller
    if st.plain:
        fm = getattr(batch, "forward_mode", None)
        if fm is not None and fm.is_decode():
            # Decided at the running batch's memory check (around_check_decode_mem).
            mode, st.planned = st.planned, None
            st.spent("forward", t0)
            if batch.spec_info is None and batch.spec_algorithm.is_none():
                result = adapter.forward_plain(worker, batch, st.scheduler.future_map)
                st.plain_steps += 1
            elif mode is None or mode is StepMode.ON:
                return original(worker, batch, *args, **kwargs)
            else:
                result = adapter.forward_off(worker, batch, mode, *args, **kwargs)
            st.off_results[id(result)] = result
            return result
    bs = None if st.plain else adapter.decode_batch_size(worker, batch)
    rb = getattr(st.scheduler, "running_batch", None)
    if bs is None:
        rows = compat.prefill_rows(batch)
        ctl.on_other(rows)
        fm = getattr(batch, "forward_mode", None)
        if st.optout_rids and fm is not None and fm.is_decode() and _has_optout(st, batch, rb):
            # a decode batch the adapter declines (e.g. logprobs on spec_v2) speculates anyway
            st.optout_not_honoured += 1
        st.spent("forward", t0)
        # A prefill while off (the last, agreed decision): rank-identical like the decode steps.
        t1 = time.perf_counter()
        if rows and ctl.prev is False:
            result = adapter.forward_prefill_off(worker, batch, *args, **kwargs)
            if result is not None:
                st.light_prefills += 1
                st.prefill_took("light", t1)
                return result
        result = original(worker, batch, *args, **kwargs)
        if rows:
            st.prefill_took("upstream", t1)
        return result
    mode = _decide(st, batch, bs, rb)
    st.spent("forward", t0)  # the decision; an off-step's own work is the step, timed as one
    if mode is StepMode.ON:
        return original(worker, batch, *args, **kwargs)
    result = adapter.forward_off(worker, batch, mode, *args, **kwargs)
    st.off_results[id(result)] = result  # the result hook skips acceptance accounting for it
    return result


def _decide(st: WorkerState, batch, bs: int, running_batch) -> StepMode:
    """One decode step's mode from the controller (the one place a step is decided)."""
    sched = st.scheduler
    running = len(running_batch.reqs) if running_batch is not None and running_batch.reqs is not None else 0
    waiting = len(getattr(sched, "waiting_queue", ()) or ())
    force_off = bool(st.optout_rids) and _has_optout(st, batch, running_batch)
    # After a light off-step the draft has no outputs to draft from: a step the policy wants
    # speculative runs as a resume step (an off-step that refreshes the draft fully).
    # Rank-identical: it depends only on the previous (agreed) decisions.
    mode = st.controller.step_mode(bs, running, waiting, force_off=force_off,
                                   resume_pending=st.adapter.resume_pending(st.worker),
                                   greedy=compat.reqs_are_greedy(compat.decode_batch_reqs(batch, running_batch)))
    if st.stats_writer is not None or st.prometheus is not None:
        _report(st)
    return mode


def around_check_decode_mem(original, batch, *args, **kwargs):
    """Decide the running batch's next step where the scheduler checks its memory, and move the
    batch to that mode's path first (plain decode batch or speculative), so the check and any
    retraction it triggers are that mode's (off-steps as plain batches only)."""
    st = STATE
    if st is None or not st.plain or args or kwargs or batch is not getattr(st.scheduler, "running_batch", None):
        return original(batch, *args, **kwargs)
    t0 = time.perf_counter()
    sched = st.scheduler
    if plain_batch.declines(batch):
        # Runs upstream, speculatively, like a batch the speculative off-step declines.
        st.planned = None
        st.controller.on_other(0)
        if st.optout_rids and _has_optout(st, batch, batch):
            st.optout_not_honoured += 1
        mode = StepMode.ON
    else:
        mode = _decide(st, batch, len(batch.reqs), batch)
        st.planned = mode
    if mode is StepMode.OFF:
        if not plain_batch.is_plain(batch):
            plain_batch.to_plain(batch, sched)
    elif plain_batch.is_plain(batch):
        plain_batch.to_speculative(batch, sched, compat.v2_worker_module().EagleDraftInput)
    st.spent("memcheck", t0)
    return original(batch)


def around_future_store(original, future_map, future_indices, result, *args, **kwargs):
    """A plain off-step's tokens go to the speculative FutureMap's token buffer (plain batches)."""
    st = STATE
    if st is None or not st.plain:
        return original(future_map, future_indices, result, *args, **kwargs)
    t0 = time.perf_counter()
    stored = plain_batch.store(future_map, future_indices, result)
    st.spent("store", t0)
    return None if stored else original(future_map, future_indices, result, *args, **kwargs)


def around_v1_forward(original, worker, batch, *args, **kwargs):
    return _forward(original, worker, batch, *args, **kwargs)


def around_v2_forward(original, worker, batch, *args, **kwargs):
    return _forward(original, worker, batch, *args, **kwargs)


def _has_optout(st: WorkerState, batch, running_batch) -> bool:
    """Whether a request of this batch opted out (only called while some opt-out may be live)."""
    reqs = compat.decode_batch_reqs(batch, running_batch)
    rids = st.optout_rids
    found = any(r.rid in rids for r in reqs)
    if st.controller.step % 512 == 0:
        _prune_optouts(st, reqs)
    return found


def _prune_optouts(st: WorkerState, reqs) -> None:
    """Forget opt-outs that finished, were aborted, or never ran (max_new_tokens=1).

    A rid is dropped once it was absent from every queue dynspec can see at two checks in a
    row (>= 512 decode steps apart), so a request in transit between queues is not lost.
    """
    sched = st.scheduler
    current = {r.rid for r in reqs}
    for q in (getattr(sched, "waiting_queue", None), getattr(sched, "grammar_queue", None),
              getattr(getattr(sched, "running_batch", None), "reqs", None)):
        current.update(r.rid for r in (q or ()))
    chunked = getattr(sched, "chunked_req", None)
    if chunked is not None:
        current.add(chunked.rid)
    absent = st.optout_rids - current
    gone = absent & st.optout_absent
    st.optout_rids -= gone
    st.optout_absent = absent - gone


def after_handle_generate(ret, scheduler, recv_req, *args, **kwargs):
    st = STATE
    if st is None:
        return None
    t0 = time.perf_counter()
    if compat.request_opts_out(recv_req):
        st.optout_rids.add(recv_req.rid)
    st.spent("generate", t0)
    return None


def around_graph_can_run(original, runner, forward_batch, *args, **kwargs):
    """No verify-graph replay for a plain DECODE batch (both worker paths, every release).

    With speculation on, the target runner captured only TARGET_VERIFY graphs sized
    ``bs * num_draft_tokens``; replaying one for an off-step decode fails with shape errors
    ("tensor a (160) must match tensor b (2)").  Everything else defers to SGLang.
    """
    st = STATE
    t0 = time.perf_counter()
    mode = getattr(forward_batch, "forward_mode", None)
    captured = getattr(runner, "capture_forward_mode", None)
    refuse = mode is not None and captured is not None and mode.is_decode() and captured.is_target_verify()
    if st is not None:
        st.spent("graph_guard", t0)
    return False if refuse else original(runner, forward_batch, *args, **kwargs)


def around_prefill_graph_can_run(original, runner, forward_batch, *args, **kwargs):
    """Let an EAGLE target prefill replay the piecewise prefill graph (SGLang 0.5.11-0.5.13).

    Those releases capture the graph without hidden states and refuse it to any batch that asks for
    them, which every EAGLE target prefill does: a speculative server prefills eagerly where a plain
    one replays graphs (~2x slower for ten 256-token prompts on the H200 pair, and it is what an
    off-step server loses against a plain one). The replayed layers do not depend on that mode: the
    hidden states, EAGLE-3's auxiliary layers included (set before capture), are graph outputs, and
    the logits processor that gathers them runs eagerly after the replay with the batch's own mode,
    as SGLang's --enable-return-hidden-states relies on. So the check is made against the batch's mode.
    """
    st = STATE
    t0 = time.perf_counter()
    wanted = getattr(forward_batch, "capture_hidden_mode", None)
    captured = getattr(runner, "capture_hidden_mode", None)
    settings = SETTINGS
    lift = (
        settings is not None and settings.target_prefill_graph
        and wanted is not None and captured is not None
        and getattr(wanted, "name", None) == "FULL" and getattr(captured, "name", None) == "NULL"
        and _is_eagle_target(getattr(runner, "model_runner", None))
    )
    if st is not None:
        st.spent("prefill_graph", t0)
    if not lift:
        return original(runner, forward_batch, *args, **kwargs)
    # The scheduler thread is the only caller: the swap is not seen by anyone else.
    runner.capture_hidden_mode = wanted
    try:
        ok = original(runner, forward_batch, *args, **kwargs)
    finally:
        runner.capture_hidden_mode = captured
    if ok and st is not None:
        st.prefill_graph_replays += 1
    return ok


def _is_eagle_target(model_runner) -> bool:
    algo = getattr(model_runner, "spec_algorithm", None)
    return (model_runner is not None and not getattr(model_runner, "is_draft_worker", True)
            and algo is not None and bool(algo.is_eagle()))


def after_process_decode(ret, processor, batch, result, *args, **kwargs):
    st = STATE
    if st is None:
        return None
    t0 = time.perf_counter()
    if st.took_off_result(result):
        if st.plain and batch.spec_algorithm.is_none():
            # The decode log divides by the speculative forward count, which only speculative
            # results advance: a log interval of plain steps alone would divide by zero.
            compat.decode_log_counter(processor).update_spec_metrics(batch.batch_size(), 0)
    elif st.accepted_field is not None:
        n = getattr(result, st.accepted_field, None)
        if n is not None:
            st.controller.on_result(batch.batch_size(), int(n), compat.reqs_are_greedy(batch.reqs))
    st.spent("result", t0)
    return None


_last_report = [float("-inf")]


def _report(st: WorkerState) -> None:
    now = time.monotonic()
    if now - _last_report[0] < 1.0:
        return
    _last_report[0] = now
    snap = st.snapshot()
    if st.stats_writer is not None:
        st.stats_writer.maybe_write(lambda: snap, force=True)
    if st.prometheus is not None:
        try:
            vr = st.controller.verify_rows
            st.prometheus.update(snap, vr and vr - 1)
        except Exception:
            logger.exception("sglang-dynspec: metrics update failed; metrics disabled")
            st.prometheus = None
