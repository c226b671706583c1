"""Plain DECODE CUDA graphs for the target, captured beside its verify graphs, for off-steps.

With speculation on, SGLang captures only TARGET_VERIFY graphs for the target, so an off-step's
one-token decode would otherwise run eager (several times a graph replay at small batch).  Both
adapters use the same recipe, the one SGLang's own adaptive speculation uses for its extra
runtime states: a *new* attention backend (``_get_attention_backend(init_new_workspace=True)``)
and a graph runner built on it while the model runner is presented as non-speculative, swapped
in around the off-step's target forward.  The live backend is never re-initialised: its
CUDA-graph buffers belong to the verify graphs.
"""

from __future__ import annotations

import contextlib
import logging

from .. import compat

logger = logging.getLogger("sglang_dynspec.adapters.offstep_graphs")


def worker_unsupported(server_args, model_runner) -> str | None:
    """Why this server's configuration rules the graphs out (None: it does not)."""
    if getattr(server_args, "disable_cuda_graph", False):
        return "--disable-cuda-graph"
    for flag in ("enable_lora", "enable_pdmux", "enable_two_batch_overlap", "enable_return_hidden_states"):
        if getattr(server_args, flag, False):
            return f"--{flag.replace('_', '-')}"
    if getattr(model_runner, "is_draft_worker", False):
        return "unexpected draft model runner"
    return None


def hidden_mode(graphs, need_hidden: bool, eager_mode: str = "FULL"):
    """The capture mode an off-step must request: the graph runner's own (else no replay)."""
    from sglang.srt.model_executor.forward_batch_info import CaptureHiddenMode

    if not need_hidden:
        return CaptureHiddenMode.NULL
    if graphs:
        return graphs["runner"].capture_hidden_mode
    return getattr(CaptureHiddenMode, eager_mode)


def capture(model_runner, need_hidden: bool) -> dict:
    """Capture DECODE graphs for ``model_runner`` on a new attention backend.

    While the backend and runner are built, the model runner is presented as non-speculative
    (so the runner captures DECODE, one token per request) and ``enable_return_hidden_states``
    is set when the draft needs target hidden states (the graphs then capture FULL, which for
    one token per request is the LAST state the draft consumes).
    """
    import torch
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

    mr = model_runner
    sa = mr.server_args
    cls = compat.target_graph_runner_class()
    saved = (mr.spec_algorithm, sa.enable_return_hidden_states, getattr(mr, "init_new_workspace", None))
    # Capture must not overlap in-flight work queued by the (overlap) scheduler.
    torch.cuda.synchronize()
    free_before = torch.cuda.mem_get_info()[0]
    try:
        mr.spec_algorithm = SpeculativeAlgorithm.NONE
        if need_hidden:
            sa.enable_return_hidden_states = True
        backend = mr._get_attention_backend(init_new_workspace=True)
        runner = cls(mr, attn_backend=backend)
    finally:
        mr.spec_algorithm = saved[0]
        sa.enable_return_hidden_states = saved[1]
        if saved[2] is not None:
            mr.init_new_workspace = saved[2]
    torch.cuda.synchronize()
    used_gb = (free_before - torch.cuda.mem_get_info()[0]) / 2**30
    logger.info(
        "dynspec: captured off-step DECODE graphs for the target with %s (bs %s, hidden %s, %.2f GiB)",
        cls.__name__, getattr(runner, "capture_bs", "?"), runner.capture_hidden_mode, used_gb,
    )
    return {
        "attn_backend": backend,
        "runner": runner,
        "runner_attr": compat.target_graph_runner_attr(mr),
        "gib": used_gb,
    }


def capture_sizes(graphs) -> list[int] | None:
    """The batch sizes the off-step graphs cover (None without them): the light draft write is
    recorded at the same sizes, so a graphed off-step is graphed throughout."""
    if not graphs:
        return None
    sizes = getattr(graphs["runner"], "capture_bs", None)
    return sorted(int(b) for b in sizes) if sizes else None


@contextlib.contextmanager
def active(model_runner, graphs):
    """Swap the target's attention backend and decode graph runner for the off-step ones."""
    if not graphs:
        yield
        return
    mr = model_runner
    attr = graphs["runner_attr"]
    saved = (mr.attn_backend, getattr(mr, attr))
    mr.attn_backend = graphs["attn_backend"]
    setattr(mr, attr, graphs["runner"])
    try:
        yield
    finally:
        mr.attn_backend = saved[0]
        setattr(mr, attr, saved[1])


def prepare(worker, need_hidden: bool, enabled: bool) -> dict | None:
    """Capture for ``worker``'s target if ``enabled`` (the setting) and possible; logs why not;
    never raises."""
    if not enabled:
        logger.info("dynspec: off-step target decode runs eager (offstep_graphs disabled)")
        return None
    mr = worker.target_worker.model_runner
    reason = compat.offstep_graphs_release_problem(need_hidden) or worker_unsupported(worker.server_args, mr)
    if reason:
        logger.info("dynspec: off-step target decode runs eager (%s)", reason)
        return None
    try:
        return capture(mr, need_hidden)
    except Exception:  # noqa: BLE001 - a failed capture must not take the server down
        logger.exception("dynspec: capturing off-step DECODE graphs failed; off-steps run eager")
        return None
