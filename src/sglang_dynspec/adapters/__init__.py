"""Adapters: what "speculation off" means on each SGLang worker path.

One module per worker path (`spec_v2.py` for `EAGLEWorkerV2`, `v1.py` for `EAGLEWorker`).
Each module exposes the same small contract, which `sglang_dynspec.runtime` drives.  The guard
that keeps a plain decode batch away from verify-only CUDA graphs is shared by both paths and
lives in `runtime.around_graph_can_run`.

``decode_batch_size(worker, batch) -> int | None``
    Number of decode rows when ``batch`` (exactly what ``forward_batch_generation`` received)
    is a decode batch that may run without speculation; ``None`` for extend / idle / mixed /
    anything the adapter cannot turn off.  Must be cheap (no GPU sync, no tensor reads).

``forward_off(worker, batch, *args, **kwargs) -> GenerationBatchResult``
    Run the step without speculation: plain one-token target decode + minimal draft KV sync,
    returning the result object the installed release's scheduler expects.  ``args``/``kwargs``
    are the remaining arguments of ``forward_batch_generation`` (e.g. ``on_publish``).

``prepare(worker, settings) -> None``
    Optional one-time setup before the worker serves (off-step graphs, light draft sync),
    following ``settings`` (the loaded ``DynspecSettings``).

``resume_pending(worker) -> bool``
    Optional: the last off-step left the draft without outputs to draft from, so a step that
    would speculate must run ``forward_off(..., full_sync=True)`` first.
"""
