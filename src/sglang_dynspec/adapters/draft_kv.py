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
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

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
class LightSync:
    """The light sync of one worker's draft: what a draft input after it is filled with."""

    topk: int
    draft_hidden: int
    draft_dtype: Any
    placeholders: Placeholders = field(default_factory=lambda: Placeholders())

    def placeholder_rows(self, bs: int, device) -> dict:
        """Zero ``topk_p`` / ``topk_index`` / ``hidden_states`` rows for ``bs`` requests."""
        return self.placeholders.get(bs, self.topk, self.draft_hidden, self.draft_dtype, device)


def prepare(draft_model_runner, topk: int, who: str, mode: str) -> LightSync | None:
    """The light sync for an adapter's worker where ``mode`` (the ``offstep_draft_sync``
    setting) and the draft allow, else None; logs the choice."""
    log = logging.getLogger("sglang_dynspec.adapters.draft_kv")
    if mode != "light":
        log.info("dynspec %s: off-steps sync the draft through its draft-extend (offstep_draft_sync=full)", who)
        return None
    reason = compat.light_sync_draft_problem(draft_model_runner)
    if reason:
        log.info("dynspec %s: off-steps sync the draft through its draft-extend (%s)", who, reason)
        return None
    mc = draft_model_runner.model_config
    light = LightSync(topk=int(topk), draft_hidden=int(mc.hidden_size), draft_dtype=mc.dtype)
    log.info("dynspec %s: off-steps write the draft KV directly (light sync; a resume step precedes speculation)", who)
    return light


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
