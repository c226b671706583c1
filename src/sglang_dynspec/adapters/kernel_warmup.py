"""Compile, before serving, the Triton kernels a speculative step launches with batch-size-keyed
constants, so that the first speculative step at a new batch size does not stall.

SGLang's speculative prepare-for-decode, verify and (topk > 1) accepted-KV move launch small eager
Triton kernels that take ``next_power_of_2(bs)`` as a ``tl.constexpr`` (``compat.SPEC_STEP_KERNELS``),
and so do the Triton attention backends' kv-splits and draft KV-index kernels around every graph
replay.  Triton compiles each variant on its first launch (a new constant, or another argument
dtype, alignment or integer class), 0.1-0.7 s without a warm disk cache.  A server that always
speculates meets each size as its batches grow; with dynspec the first speculative step at a size
can come at any time, right after a switch (``pair2i-row2``: 639 ms at bs 30).  Off-steps never
launch these kernels, so they do not warm them either.

``warm`` launches SGLang's own functions at ``batch_sizes()`` with empty work: zero-length ranges
over scratch tensors (a row as wide as ``req_to_token``; nothing is written to the request pools),
an accepted-KV move that accepts nothing (its only copy: the KV pool's reserved slot 0 onto
itself), and the draft backend's index fill for empty requests (its own buffers, rewritten before
every draft step).  ``CompileWatch`` then logs each Triton compile that still happens while
serving, with the time its launch waited and its argument types.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Callable

logger = logging.getLogger("sglang_dynspec.adapters.kernel_warmup")


@dataclass
class WarmupShape:
    """What the warm-up launches must look like to hit the variants serving will launch."""

    max_batch: int  # the largest running batch (the model runner's max_running_requests)
    draft_tokens: int  # verify rows per request (speculative_num_draft_tokens)
    topk: int
    accept_width: int  # accept_index's row width: speculative_num_steps + 1


@dataclass
class WarmupReport:
    batch_sizes: int = 0  # how many sizes were launched (batch_sizes())
    compiled: list[str] = field(default_factory=list)  # kernel variants compiled (or loaded) meanwhile
    failed: dict[str, str] = field(default_factory=dict)  # kernel name -> why its warm-up stopped
    seconds: float = 0.0


@dataclass
class _Scratch:
    """Device tensors the empty launches read, sliced per batch size (slices keep alignment)."""

    row: object  # (1, req_to_token width), req_to_token's dtype
    pool_indices: object  # int64 zeros, as ScheduleBatch.req_pool_indices
    lens32: object  # int32 zeros, as the prepare-for-decode's KV lengths
    lens64: object  # int64 zeros, as ScheduleBatch.seq_lens (and positions: max_batch * topk)
    locs: object  # int64 zeros, as out_cache_loc
    splits: object  # int32, as the attention backend's num_kv_splits
    no_accept: object  # int32 -1s, as accept_index / num_correct_drafts with nothing accepted


def _scratch(req_to_token, shape: WarmupShape) -> _Scratch:
    import torch

    dev, n = req_to_token.device, shape.max_batch
    return _Scratch(
        row=req_to_token.new_zeros((1, req_to_token.shape[1])),
        pool_indices=torch.zeros(n, dtype=torch.int64, device=dev),
        lens32=torch.zeros(n, dtype=torch.int32, device=dev),
        lens64=torch.zeros(n * max(shape.topk, 1), dtype=torch.int64, device=dev),
        locs=torch.zeros(n * max(shape.draft_tokens, 1) + 1, dtype=torch.int64, device=dev),
        splits=torch.zeros(n * max(shape.draft_tokens, shape.topk, 1), dtype=torch.int32, device=dev),
        no_accept=torch.full((n * max(shape.accept_width, 1),), -1, dtype=torch.int32, device=dev),
    )


def _assign_req_to_token_pool(fn, s: _Scratch, shape: WarmupShape, bs: int, _allocator) -> None:
    # The allocator hands out slices of its free list, at any offset: Triton specialises a pointer
    # on 16-byte alignment, so both (an int64 slice at an odd offset is not aligned).
    for locs in (s.locs, s.locs[1:]):
        fn(s.pool_indices[:bs], s.row, s.lens32[:bs], s.lens32[:bs], locs, bs)


def _assign_extend_cache_locs(fn, s: _Scratch, shape: WarmupShape, bs: int, _allocator) -> None:
    fn(req_pool_indices=s.pool_indices[:bs], req_to_token=s.row, start_offset=s.lens64[:bs],
       end_offset=s.lens64[:bs], batch_size=bs, draft_token_num=shape.draft_tokens, device=s.row.device)


def _move_accept_tokens(fn, s: _Scratch, shape: WarmupShape, bs: int, allocator) -> None:
    batch = SimpleNamespace(seq_lens=s.lens64[:bs], req_pool_indices=s.pool_indices[:bs],
                            req_to_token_pool=SimpleNamespace(req_to_token=s.row),
                            out_cache_loc=s.locs[:bs * shape.draft_tokens])
    accept_index = s.no_accept[:bs * shape.accept_width].view(bs, shape.accept_width)
    fn(batch, accept_index, s.no_accept[:bs], allocator)


def _attention_kv_splits(fn, s: _Scratch, shape: WarmupShape, bs: int, _allocator) -> None:
    # fn: the Triton attention backend's get_num_kv_splits(num_kv_splits, seq_lens); its kernel keys
    # on the row count (== 1, multiple of 16), the rows per request and seq_lens' dtype.  Rows per request: 1 (decode, draft-extend), topk (draft decode), draft_tokens (verify);
    # seq_lens arrive as int64 (a batch's) or int32 (a graph runner's buffer).
    for group in sorted({1, shape.topk, shape.draft_tokens}):
        for lens in (s.lens64, s.lens32):
            fn(s.splits[:bs * group], lens[:bs])


def _draft_kv_indices(fn, s: _Scratch, shape: WarmupShape, bs: int, _allocator) -> None:
    # fn: the draft's multi-step backend's common_template(forward_batch, kv_indices, call_fn); its
    # kernel keys on the batch size and, at a graph replay without padding, gets the batch's own int64
    # seq_lens, where the capture used the runner's int32 buffer.  Zero-length requests: only the backend's own index buffers are written, which every draft
    # step (graph replay or eager) rewrites before reading.
    batch = SimpleNamespace(batch_size=bs, req_pool_indices=s.pool_indices[:bs], seq_lens=s.lens64[:bs],
                            positions=s.lens64[:bs * shape.topk], seq_lens_sum=0, spec_info=None,
                            req_to_token_pool=SimpleNamespace(req_to_token=s.row))
    fn(batch, None, None)


DENSE_UP_TO = 256  # every batch size up to this one; beyond it, the sizes near powers of two only
DIVISIBILITY = 16  # Triton specialises integers (and pointers) on divisibility by 16


def batch_sizes(shape: WarmupShape) -> list[int]:
    """The batch sizes to launch at: every one up to DENSE_UP_TO, and beyond it those within
    DIVISIBILITY of a size where bs × w crosses a power of two, for each number w of rows per request
    a kernel sizes itself by (1, topk, accept_width, draft_tokens).  Between such sizes no kernel's
    constants change, and 16 consecutive sizes cover the divisibility classes on each side; the KV
    copy's chunk remainders (a chunk is at most 256 rows) repeat within the dense range.  So
    max_running_requests of 4096 costs ~10 % of its sizes, not all of them."""
    top = shape.max_batch
    sizes = set(range(1, min(top, DENSE_UP_TO) + 1))
    widths = {1, max(shape.topk, 1), max(shape.accept_width, 1), max(shape.draft_tokens, 1)}
    for w in widths:
        power = 1
        while power <= top * w:
            edge = power // w  # the largest bs with bs * w <= power
            sizes.update(range(max(edge - DIVISIBILITY, 1), min(edge + DIVISIBILITY, top) + 1))
            power *= 2
    sizes.add(top)
    return sorted(b for b in sizes if 1 <= b <= top)


# name (compat.SPEC_STEP_KERNELS, BACKEND_KERNELS) -> the empty launch; which ones a worker needs: _wanted
_LAUNCHES: dict[str, Callable] = {
    "assign_req_to_token_pool": _assign_req_to_token_pool,
    "assign_extend_cache_locs": _assign_extend_cache_locs,
    "move_accept_tokens": _move_accept_tokens,
    "attention_kv_splits": _attention_kv_splits,
    "draft_kv_indices": _draft_kv_indices,
}


def _wanted(name: str, shape: WarmupShape) -> bool:
    return name != "move_accept_tokens" or shape.topk > 1


BACKEND_KERNELS = ("attention_kv_splits", "draft_kv_indices")  # named by the caller, from the worker's backends


def warm(kernels: dict, req_to_token, allocator, shape: WarmupShape) -> WarmupReport:
    """Launch each of ``kernels`` ({name: SGLang's function}: compat.spec_step_kernels() and the
    worker's BACKEND_KERNELS) with empty work at ``batch_sizes(shape)``; a kernel whose launch
    raises is reported and left to compile lazily."""
    import torch

    sizes = batch_sizes(shape)
    report = WarmupReport(batch_sizes=len(sizes))
    todo = {name: fn for name, fn in kernels.items() if name in _LAUNCHES and _wanted(name, shape)}
    if not todo or shape.max_batch < 1:
        return report
    t0 = time.perf_counter()
    first = len(WATCH.compiled)
    scratch = _scratch(req_to_token, shape)
    for bs in sizes:
        for name in list(todo):
            try:
                _LAUNCHES[name](todo[name], scratch, shape, bs, allocator)
            except Exception as exc:  # noqa: BLE001 - a release quirk must not stop serving
                report.failed[name] = f"bs {bs}: {type(exc).__name__}: {exc}"
                del todo[name]
    if req_to_token.is_cuda:  # the compiles are done once the launches ran
        torch.cuda.synchronize(req_to_token.device)
    report.seconds = time.perf_counter() - t0
    report.compiled = WATCH.compiled[first:]
    return report


# --------------------------------------------------------------------------------------------


def _runtime_knobs():
    try:
        import triton.knobs
    except Exception:  # noqa: BLE001 - Triton < 3.4 has no knobs: nothing to watch
        return None
    rt = getattr(triton.knobs, "runtime", None)
    return rt if hasattr(rt, "jit_post_compile_hook") and hasattr(rt, "jit_cache_hook") else None


def _arg_types(fn, compile_info) -> str:
    """``name:*i64/16, ...``: each runtime argument's type, /16 where Triton specialised it on
    divisibility by 16 (a pointer's alignment, an integer's value)."""
    params = getattr(getattr(fn, "jit_function", None), "params", [])
    signature = compile_info.get("signature") or {}
    configs = compile_info.get("configs") or [{}]
    attrs = configs[0] if configs and isinstance(configs[0], dict) else {}
    shown = []
    for p in params:
        kind = signature.get(p.name)
        if getattr(p, "is_constexpr", False) or kind in (None, "constexpr"):
            continue
        div16 = any("divisibility" in str(a) for a in attrs.get((p.num,), []))
        shown.append(f"{p.name}:{kind}{'/16' if div16 else ''}")
    return ", ".join(shown)


def _describe(fn, constants) -> str:
    """``kernel(constexpr=value, ...)`` from the hook's JitFunctionInfo and constants."""
    params = getattr(getattr(fn, "jit_function", None), "params", [])
    names = {(p.num,): p.name for p in params if getattr(p, "is_constexpr", False)}
    shown = ", ".join(f"{names[k]}={v}" for k, v in (constants or {}).items() if k in names)
    return f"{getattr(fn, 'name', '?')}({shown})"


class CompileWatch:
    """Records every Triton JIT compile (or disk-cache load) in this process with the time its
    launch waited, through Triton's compile hooks (chained to hooks set before); once ``serving``
    is set, each is also logged, because it stalled a step."""

    def __init__(self) -> None:
        self.installed = False
        self.serving = False
        self.compiled: list[str] = []
        self._started: dict[str, float] = {}

    def install(self) -> bool:
        if self.installed:
            return True
        rt = _runtime_knobs()
        if rt is None:
            return False
        before_pre, before_post = rt.jit_cache_hook, rt.jit_post_compile_hook

        def pre(**kw):
            self._started[str(kw.get("key"))] = time.perf_counter()
            return before_pre(**kw) if before_pre else None

        def post(**kw):
            try:
                self._record(kw)
            except Exception:  # noqa: BLE001 - a diagnostic must never break a launch
                pass
            return before_post(**kw) if before_post else None

        rt.jit_cache_hook, rt.jit_post_compile_hook = pre, post
        self.installed = True
        return True

    def _record(self, kw) -> None:
        t0 = self._started.pop(str(kw.get("key")), None)
        ms = (time.perf_counter() - t0) * 1e3 if t0 is not None else float("nan")
        what = _describe(kw.get("fn"), (kw.get("compile") or {}).get("constants"))
        self.compiled.append(f"{what} {ms:.0f} ms")
        if self.serving:
            # The argument types too: a variant differs by dtype, pointer alignment and integer
            # divisibility as well as by its constants.
            logger.info("dynspec: Triton compiled %s while serving; the launching step waited %.0f ms [%s]",
                        what, ms, _arg_types(kw.get("fn"), kw.get("compile") or {}))


WATCH = CompileWatch()
