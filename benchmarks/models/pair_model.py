"""The two networks of the realistic pair, written so their state_dicts export without renaming.

`TargetLM` is a plain Llama decoder whose parameter names are those of HF `LlamaForCausalLM`
(model.embed_tokens, model.layers.N.self_attn.q_proj, ..., model.norm, lm_head). `Eagle3Draft`
computes what SGLang 0.5.12's `LlamaForCausalLMEagle3` computes for one decoder layer; its names
are the EAGLE-3 checkpoint names (fc, midlayer.*, norm, lm_head) that SGLang's loader maps.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import torch
import torch.nn.functional as F
from torch import nn


@dataclass
class LlamaShape:
    vocab: int
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    rope_theta: float = 10000.0
    eps: float = 1e-5
    max_positions: int = 2048

    def __post_init__(self) -> None:
        if self.heads % self.kv_heads:
            raise ValueError(f"heads ({self.heads}) must be a multiple of kv_heads ({self.kv_heads})")
        if self.head_dim % 2:
            raise ValueError(f"head_dim must be even for RoPE, got {self.head_dim}")

    def as_dict(self) -> dict:
        return asdict(self)


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # fp32 statistics, then back to the input dtype before the gain: HF and SGLang do the same.
        dtype = x.dtype
        x32 = x.float()
        x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x32.to(dtype)


def rope_tables(positions: torch.Tensor, head_dim: int, theta: float, dtype: torch.dtype):
    """cos/sin of shape (T, head_dim) in the half-split ("rotate_half") layout Llama uses."""
    inv = 1.0 / (theta ** (torch.arange(0, head_dim, 2, device=positions.device, dtype=torch.float32) / head_dim))
    ang = positions.float()[:, None] * inv[None, :]
    ang = torch.cat([ang, ang], dim=-1)
    return ang.cos().to(dtype), ang.sin().to(dtype)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    rot = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return x * cos + rot * sin


class Attention(nn.Module):
    def __init__(self, s: LlamaShape, in_dim: int):
        super().__init__()
        self.s = s
        self.q_proj = nn.Linear(in_dim, s.heads * s.head_dim, bias=False)
        self.k_proj = nn.Linear(in_dim, s.kv_heads * s.head_dim, bias=False)
        self.v_proj = nn.Linear(in_dim, s.kv_heads * s.head_dim, bias=False)
        self.o_proj = nn.Linear(s.heads * s.head_dim, s.hidden, bias=False)

    def qkv(self, x: torch.Tensor, cos, sin):
        b, t, _ = x.shape
        s = self.s
        q = self.q_proj(x).view(b, t, s.heads, s.head_dim).transpose(1, 2)
        k = self.k_proj(x).view(b, t, s.kv_heads, s.head_dim).transpose(1, 2)
        v = self.v_proj(x).view(b, t, s.kv_heads, s.head_dim).transpose(1, 2)
        q, k = apply_rope(q, cos.to(q.dtype), sin.to(q.dtype)), apply_rope(k, cos.to(k.dtype), sin.to(k.dtype))
        rep = s.heads // s.kv_heads
        if rep > 1:
            k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
        return q, k, v

    def out(self, a: torch.Tensor) -> torch.Tensor:
        b, _, t, _ = a.shape
        return self.o_proj(a.transpose(1, 2).reshape(b, t, -1))

    def forward(self, x, cos, sin):
        q, k, v = self.qkv(x, cos, sin)
        return self.out(F.scaled_dot_product_attention(q, k, v, is_causal=True))


class MLP(nn.Module):
    def __init__(self, hidden: int, inter: int):
        super().__init__()
        self.gate_proj = nn.Linear(hidden, inter, bias=False)
        self.up_proj = nn.Linear(hidden, inter, bias=False)
        self.down_proj = nn.Linear(inter, hidden, bias=False)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class Block(nn.Module):
    def __init__(self, s: LlamaShape):
        super().__init__()
        self.input_layernorm = RMSNorm(s.hidden, s.eps)
        self.self_attn = Attention(s, s.hidden)
        self.post_attention_layernorm = RMSNorm(s.hidden, s.eps)
        self.mlp = MLP(s.hidden, s.intermediate)

    def forward(self, h, cos, sin):
        h = h + self.self_attn(self.input_layernorm(h), cos, sin)
        return h + self.mlp(self.post_attention_layernorm(h))


class _Body(nn.Module):
    def __init__(self, s: LlamaShape):
        super().__init__()
        self.embed_tokens = nn.Embedding(s.vocab, s.hidden)
        self.layers = nn.ModuleList(Block(s) for _ in range(s.layers))
        self.norm = RMSNorm(s.hidden, s.eps)


def init_weights(module: nn.Module, n_layers: int, std: float = 0.02) -> None:
    """GPT-2-style init: residual-output projections shrunk by 1/sqrt(2·layers) for stable depth."""
    for name, p in module.named_parameters():
        if name.endswith("norm.weight"):
            nn.init.ones_(p)
        elif name.endswith(("o_proj.weight", "down_proj.weight")):
            nn.init.normal_(p, 0.0, std / (2 * n_layers) ** 0.5)
        else:
            nn.init.normal_(p, 0.0, std)


class TargetLM(nn.Module):
    def __init__(self, s: LlamaShape):
        super().__init__()
        self.shape = s
        self.model = _Body(s)
        self.lm_head = nn.Linear(s.hidden, s.vocab, bias=False)
        init_weights(self, s.layers)

    def forward(self, ids: torch.Tensor, capture: tuple[int, ...] = ()):
        """Logits, plus the residual stream after each layer index in `capture` (what SGLang hands
        the EAGLE-3 draft for `eagle_aux_hidden_state_layer_ids`)."""
        s = self.shape
        pos = torch.arange(ids.shape[1], device=ids.device)
        cos, sin = rope_tables(pos, s.head_dim, s.rope_theta, torch.float32)
        h = self.model.embed_tokens(ids)
        aux = []
        for i, layer in enumerate(self.model.layers):
            h = layer(h, cos, sin)
            if i in capture:
                aux.append(h)
        logits = self.lm_head(self.model.norm(h))
        return (logits, aux) if capture else logits


class DraftLayer(nn.Module):
    """SGLang's EAGLE-3 input layer: norm(embeds) ‖ norm(hidden) → attention (2·hidden in) → MLP."""

    def __init__(self, s: LlamaShape):
        super().__init__()
        self.s = s
        self.hidden_norm = RMSNorm(s.hidden, s.eps)
        self.input_layernorm = RMSNorm(s.hidden, s.eps)
        self.self_attn = Attention(s, 2 * s.hidden)
        self.post_attention_layernorm = RMSNorm(s.hidden, s.eps)
        self.mlp = MLP(s.hidden, s.intermediate)

    def forward(self, hidden, embeds, cos, sin, past=None):
        """Returns (pre-norm output, k, v). With `past` = (k, v) of an earlier unrolled step, each row
        also sees the earlier step's keys at positions <= its own row and its own key (the
        training-time-test mask: what a draft decode step sees in SGLang's KV cache)."""
        x = torch.cat([self.input_layernorm(embeds), self.hidden_norm(hidden)], dim=-1)
        q, k, v = self.self_attn.qkv(x, cos, sin)
        if past is None:
            a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:
            pk, pv = past
            t = q.shape[2]
            keep = torch.cat([torch.ones(t, pk.shape[2], dtype=torch.bool, device=q.device).tril(),
                              torch.eye(t, dtype=torch.bool, device=q.device)], dim=-1)
            a = F.scaled_dot_product_attention(q, torch.cat([pk, k], 2), torch.cat([pv, v], 2), attn_mask=keep)
        h = hidden + self.self_attn.out(a)
        h = h + self.mlp(self.post_attention_layernorm(h))
        return h, k, v


class Eagle3Draft(nn.Module):
    """One-layer EAGLE-3 draft; token embeddings are the target's (SGLang shares them at load)."""

    def __init__(self, s: LlamaShape, n_aux: int = 3, target_hidden: int | None = None):
        super().__init__()
        self.shape = s
        self.fc = nn.Linear(n_aux * (target_hidden or s.hidden), s.hidden, bias=False)
        self.midlayer = DraftLayer(s)
        self.norm = RMSNorm(s.hidden, s.eps)
        self.lm_head = nn.Linear(s.hidden, s.vocab, bias=False)
        init_weights(self, 1)

    def unrolled(self, aux: list[torch.Tensor], embed: nn.Embedding, ids: torch.Tensor, steps: int = 2):
        """Logits of each unrolled step (1 or 2), each (B, T, V). Row i of step k (0-based) sees
        target hidden states up to i and the true tokens up to i+k+1, and predicts token i+k+2.
        Rows whose inputs run past the sequence end see zero-padded tokens; callers ignore them."""
        if steps not in (1, 2):
            raise ValueError(f"steps must be 1 or 2 (the mask covers one earlier step), got {steps}")
        s = self.shape
        t = ids.shape[1]
        hidden = self.fc(torch.cat(aux, dim=-1))
        out, past = [], None
        for k in range(steps):
            nxt = F.pad(ids[:, k + 1:], (0, k + 1))  # token i+k+1 for row i
            pos = torch.arange(t, device=ids.device) + k
            cos, sin = rope_tables(pos, s.head_dim, s.rope_theta, torch.float32)
            hidden, kk, vv = self.midlayer(hidden, embed(nxt), cos, sin, past)
            past = (kk, vv)
            out.append(self.lm_head(self.norm(hidden)))
        return out
