"""Light draft sync: write one token's draft KV directly, without the draft-extend forward.

An off-step must leave the draft's KV cache complete, or speculation resumes on a context
with holes.  The draft KV at position p depends only on that token's input to the draft's
first layer: ``cat(input_layernorm(embed(t_{p+1})), hidden_norm(fc(h_p)))`` projected to K/V
and rotated at position p.  For a single-layer EAGLE-3 draft (the usual shape) that is all the
draft-extend contributes that a *later* step reads; its other outputs (``topk_p``,
``topk_index``, the draft hidden state) only seed the very next draft round.

So an off-step can skip the draft-extend forward (its attention, MLP, LM head, top-k and all
the per-step Python that drives it: about half the CPU time of an off-step, measured) and
compute K/V with the draft model's own modules.  The next step must then not draft from the
skipped outputs: the runtime runs a *resume* step (one full-sync off-step) before speculating
again.  Drafts of any other shape (several layers, mrope, EAGLE-1/2, non-MHA pools) keep the
full draft-extend sync.

Run eagerly, the write is a dozen small kernels and their Python, paid on the scheduler's CPU
every off-step: profiled with Python stacks (prefill-0512, bs 10) about 40 % of the CPU time an
off-step adds to a plain step, which counts where a step is CPU-bound (small batches).  So with
off-step graphs on, ``capture_write`` records it once per batch size (single-GPU drafts) and an
off-step copies its rows in and replays one graph.
"""

from __future__ import annotations

import bisect
import contextlib
import logging
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

from .. import compat


def _qkv(attn, positions, x):
    # SGLang's own projection + rotary for this attention (0.5.12+); else the same by parts.
    prep = getattr(attn, "forward_prepare_native", None)
    if prep is not None:
        return prep(positions=positions, hidden_states=x)
    qkv, _ = attn.qkv_proj(x)
    q, k, v = qkv.split([attn.q_size, attn.kv_size, attn.kv_size], dim=-1)
    q, k = attn.rotary_emb(positions, q, k)
    return q, k, v


def write(draft_model_runner, tokens, target_hidden, positions, locs) -> None:
    """Write the draft KV of one token per row: token ``tokens[i]`` following a target position
    ``positions[i]`` whose (aux) hidden state is ``target_hidden[i]``, into slot ``locs[i]``."""
    import torch

    inner = draft_model_runner.model.model
    layer = inner.layers[0]
    with torch.no_grad():
        embeds = inner.embed_tokens(tokens.to(torch.int64))
        h = target_hidden
        if h.shape[-1] != embeds.shape[-1]:
            fc_norm = getattr(inner, "fc_norm", None)
            if fc_norm is not None:
                chunks = h.chunk(inner.num_aux_hidden_states, dim=-1)
                h = torch.cat([norm(c) for norm, c in zip(fc_norm, chunks)], dim=-1)
            h = inner.fc(h)
        x = torch.cat([layer.input_layernorm(embeds), layer.hidden_norm(h)], dim=-1)
        attn = layer.self_attn
        _q, k, v = _qkv(attn, positions.to(torch.int64), x)
        ra = attn.attn
        k = k.view(-1, ra.tp_k_head_num, ra.qk_head_dim)
        v = v.view(-1, ra.tp_v_head_num, ra.v_head_dim)
        pool = draft_model_runner.token_to_kv_pool
        if getattr(ra, "k_scale", None) is None:
            pool.set_kv_buffer(ra, locs, k, v)
        else:
            pool.set_kv_buffer(ra, locs, k, v, ra.k_scale, ra.v_scale)


@dataclass
class WriteGraphs:
    """``write`` recorded once per batch size in ``sizes`` (ascending), on static inputs of
    ``sizes[-1]`` rows.  A batch of n rows runs the smallest graph of at least n rows; the rows
    past n write slot 0, the KV pool's padding slot (as SGLang's own padded graphs do)."""

    sizes: tuple[int, ...]
    graphs: dict[int, Any]  # size -> a recorded graph (``replay()``)
    tokens: Any
    hidden: Any
    positions: Any
    locs: Any

    def size_for(self, n: int) -> int | None:
        i = bisect.bisect_left(self.sizes, n)
        return self.sizes[i] if i < len(self.sizes) else None

    def run(self, tokens, hidden, positions, locs, position_offset: int = 0) -> bool:
        """Write these rows (at ``positions + position_offset``) by a replay; False (nothing done)
        where no graph fits them."""
        import torch

        n = int(tokens.shape[0])
        size = self.size_for(n)
        if size is None or n == 0 or tuple(hidden.shape[1:]) != tuple(self.hidden.shape[1:]):
            return False
        self.tokens[:n].copy_(tokens)
        self.hidden[:n].copy_(hidden)
        if position_offset:
            torch.add(positions, position_offset, out=self.positions[:n])  # one op, not a subtraction and a copy
        else:
            self.positions[:n].copy_(positions)
        self.locs[:n].copy_(locs)
        if size > n:
            self.locs[n:size].zero_()  # a larger batch's slots may still be there
        self.graphs[size].replay()
        return True


@dataclass
class LightSync:
    """The light sync of one worker's draft: what a draft input after it is filled with, and
    the write's graphs where they were captured."""

    topk: int
    draft_hidden: int
    draft_dtype: Any
    placeholders: Placeholders = field(default_factory=lambda: Placeholders())
    graphs: WriteGraphs | None = None
    contexts: Callable[[], Any] = contextlib.nullcontext  # what an eager write of this draft runs inside

    def placeholder_rows(self, bs: int, device) -> dict:
        """Zero ``topk_p`` / ``topk_index`` / ``hidden_states`` rows for ``bs`` requests."""
        return self.placeholders.get(bs, self.topk, self.draft_hidden, self.draft_dtype, device)

    def write(self, draft_model_runner, tokens, target_hidden, positions, locs, position_offset: int = 0) -> None:
        """``write`` (at ``positions + position_offset``) by a graph replay where one fits, else
        eagerly inside the draft's contexts."""
        g = self.graphs
        if g is not None and g.run(tokens, target_hidden, positions, locs, position_offset):
            return
        if position_offset:
            positions = positions + position_offset
        with self.contexts():
            write(draft_model_runner, tokens, target_hidden, positions, locs)


def prepare(draft_model_runner, topk: int, who: str, mode: str, graph_sizes: Sequence[int] | None = None,
            contexts: Callable[[], Any] = contextlib.nullcontext) -> LightSync | None:
    """The light sync for an adapter's worker where ``mode`` (the ``offstep_draft_sync``
    setting) and the draft allow, else None; logs the choice.  ``graph_sizes``: the batch sizes
    to record the write at (None: eager); ``contexts``: what every draft call runs inside."""
    log = logging.getLogger("sglang_dynspec.adapters.draft_kv")
    if mode != "light":
        log.info("dynspec %s: off-steps sync the draft through its draft-extend (offstep_draft_sync=full)", who)
        return None
    reason = compat.light_sync_draft_problem(draft_model_runner)
    if reason:
        log.info("dynspec %s: off-steps sync the draft through its draft-extend (%s)", who, reason)
        return None
    mc = draft_model_runner.model_config
    light = LightSync(topk=int(topk), draft_hidden=int(mc.hidden_size), draft_dtype=mc.dtype, contexts=contexts)
    if graph_sizes:
        light.graphs = capture_write(draft_model_runner, graph_sizes, contexts, who)
    log.info("dynspec %s: off-steps write the draft KV directly (light sync%s; a resume step precedes speculation)",
             who, ", CUDA graphs" if light.graphs is not None else ", eager")
    return light


def _graph_problem(draft_model_runner) -> str | None:
    if int(getattr(draft_model_runner, "tp_size", 1) or 1) != 1:
        # The draft's embedding all-reduces across ranks: not recorded outside SGLang's capture.
        return "tensor-parallel draft"
    fc = getattr(draft_model_runner.model.model, "fc", None)
    if getattr(fc, "weight", None) is None or fc.weight.dim() != 2:
        return "the draft's fc has no 2-D weight to size the hidden-state input by"
    return None


def capture_write(draft_model_runner, sizes: Sequence[int], contexts: Callable[[], Any], who: str) -> WriteGraphs | None:
    """Record ``write`` for each batch size (dummy rows that write slot 0), then check one replay
    against the eager write; None (eager off-steps, logged) where that is not possible or differs.
    Never raises: called before serving, with the device idle."""
    import torch

    log = logging.getLogger("sglang_dynspec.adapters.draft_kv")
    problem = _graph_problem(draft_model_runner)
    if problem:
        log.info("dynspec %s: the light draft write runs eager (%s)", who, problem)
        return None
    try:
        sizes = tuple(sorted({int(b) for b in sizes if int(b) > 0}))
        fc = draft_model_runner.model.model.fc
        dev, top = fc.weight.device, sizes[-1]
        g = WriteGraphs(sizes, {}, torch.zeros(top, dtype=torch.int64, device=dev),
                        torch.zeros(top, fc.weight.shape[1], dtype=fc.weight.dtype, device=dev),
                        torch.zeros(top, dtype=torch.int64, device=dev), torch.zeros(top, dtype=torch.int64, device=dev))
        torch.cuda.synchronize()
        pool = torch.cuda.graph_pool_handle()
        with contexts():
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):  # warm-up off the capture (lazy inits, autotuning)
                write(draft_model_runner, g.tokens, g.hidden, g.positions, g.locs)
            torch.cuda.current_stream().wait_stream(side)
            for b in reversed(sizes):  # largest first: the smaller ones reuse its memory
                graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(graph, pool=pool):
                    write(draft_model_runner, g.tokens[:b], g.hidden[:b], g.positions[:b], g.locs[:b])
                g.graphs[b] = graph
            mismatch = _check_replay(draft_model_runner, g)
        torch.cuda.synchronize()
    except Exception:  # noqa: BLE001 - the eager write still works: never take the server down
        log.exception("dynspec %s: recording the light draft write failed; it runs eager", who)
        return None
    if mismatch:
        log.warning("dynspec %s: the recorded light draft write differs from the eager one (%s); it runs eager",
                    who, mismatch)
        return None
    log.info("dynspec %s: recorded the light draft write for batch sizes %s", who, list(sizes))
    return g


def _check_replay(draft_model_runner, g: WriteGraphs) -> str | None:
    """One row through the eager write and one through a replay, both into padding slot 0: the
    K/V they leave there must agree.  None if they do, else what differs."""
    import torch

    ra = draft_model_runner.model.model.layers[0].self_attn.attn
    pool = draft_model_runner.token_to_kv_pool
    gen = torch.Generator(device=g.hidden.device).manual_seed(0)
    hidden = torch.randn(1, g.hidden.shape[1], generator=gen, device=g.hidden.device).to(g.hidden.dtype)
    tokens = torch.tensor([7], dtype=torch.int64, device=g.hidden.device)
    positions = torch.tensor([11], dtype=torch.int64, device=g.hidden.device)
    slot = torch.zeros(1, dtype=torch.int64, device=g.hidden.device)

    def kv():
        return (pool.get_key_buffer(ra.layer_id)[0].float().clone(), pool.get_value_buffer(ra.layer_id)[0].float().clone())

    write(draft_model_runner, tokens, hidden, positions, slot)
    k_eager, v_eager = kv()
    pool.get_key_buffer(ra.layer_id)[0].zero_()
    pool.get_value_buffer(ra.layer_id)[0].zero_()
    if not g.run(tokens, hidden, positions, slot):
        return "no graph for one row"
    k_graph, v_graph = kv()
    if not (torch.allclose(k_eager, k_graph, rtol=1e-2, atol=1e-2) and torch.allclose(v_eager, v_graph, rtol=1e-2, atol=1e-2)):
        return f"max |dK| {float((k_eager - k_graph).abs().max()):.3g}, |dV| {float((v_eager - v_graph).abs().max()):.3g}"
    if float(k_eager.abs().sum()) == 0.0:
        return "the eager write left slot 0 empty"
    return None


class Placeholders:
    """Zero ``topk_p`` / ``topk_index`` / draft hidden rows for a draft input after a light sync.

    The scheduler stores and filters these like real ones; they are never drafted from (the
    runtime's resume step replaces them first).  One zero row per kind, broadcast (no allocation
    per step)."""

    def __init__(self) -> None:
        self._rows: dict[Any, Any] = {}

    def get(self, bs: int, topk: int, hidden_size: int, hidden_dtype, device) -> dict:
        import torch

        key = (topk, hidden_size, hidden_dtype, str(device))
        rows = self._rows.get(key)
        if rows is None:
            rows = (torch.zeros(1, topk, dtype=torch.float32, device=device),
                    torch.zeros(1, topk, dtype=torch.int64, device=device),
                    torch.zeros(1, hidden_size, dtype=hidden_dtype, device=device))
            self._rows[key] = rows
        p, i, h = rows
        return {"topk_p": p.expand(bs, topk), "topk_index": i.expand(bs, topk),
                "hidden_states": h.expand(bs, hidden_size)}
