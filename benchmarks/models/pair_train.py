"""Training and offline checks for the realistic pair (target LM, then EAGLE-3 draft on it).

Runs are bounded by wall time (the GPU call is 600 s) and/or a step count (CPU tests need
exact, repeatable runs); the learning-rate schedule follows whichever bound is nearer.
"""

from __future__ import annotations

import contextlib
import math
import time
from dataclasses import dataclass

import torch
import torch.nn.functional as F


@dataclass
class TrainBudget:
    seconds: float | None = None
    max_steps: int | None = None
    lr: float = 1.5e-3
    batch: int = 64
    seq: int = 512
    warmup_frac: float = 0.03
    weight_decay: float = 0.1
    seed: int = 0

    def __post_init__(self) -> None:
        if not self.seconds and not self.max_steps:
            raise ValueError("give a time budget (seconds) or max_steps, or both")

    def progress(self, step: int, elapsed: float) -> float:
        p = 0.0
        if self.max_steps:
            p = max(p, step / self.max_steps)
        if self.seconds:
            p = max(p, elapsed / self.seconds)
        return p


def lr_factor(progress: float, warmup_frac: float, floor: float = 0.1) -> float:
    """Linear warm-up, then cosine down to floor × peak at progress 1."""
    if warmup_frac > 0 and progress < warmup_frac:
        return max(progress / warmup_frac, 1e-3)
    t = min(1.0, (progress - warmup_frac) / max(1e-9, 1 - warmup_frac))
    return floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * t))


def autocast_for(device: torch.device, dtype: torch.dtype | None):
    if dtype is None or dtype == torch.float32:
        return contextlib.nullcontext()
    return torch.autocast(device_type=device.type, dtype=dtype)


def sample_batch(stream: torch.Tensor, batch: int, length: int, gen: torch.Generator) -> torch.Tensor:
    """(batch, length) int64 windows at seeded random offsets; stream may live on the GPU."""
    if len(stream) <= length:
        raise ValueError(f"token stream ({len(stream)}) shorter than one window ({length + 1})")
    starts = torch.randint(0, len(stream) - length, (batch,), generator=gen).to(stream.device)
    return stream[starts[:, None] + torch.arange(length, device=stream.device)].long()


def _optimizer(params, budget: TrainBudget, device: torch.device):
    decay = [p for p in params if p.requires_grad and p.dim() >= 2]
    no_decay = [p for p in params if p.requires_grad and p.dim() < 2]
    groups = [{"params": decay, "weight_decay": budget.weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    # Fused AdamW is one kernel per step on CUDA; the CPU tests use the reference loop.
    return torch.optim.AdamW(groups, lr=budget.lr, betas=(0.9, 0.95), fused=device.type == "cuda")


def _loop(params, loss_fn, budget: TrainBudget, device, log, label: str) -> dict:
    opt = _optimizer(params, budget, device)
    gen = torch.Generator().manual_seed(budget.seed)
    t0 = time.perf_counter()
    step, last, tokens = 0, float("nan"), 0
    while budget.progress(step, time.perf_counter() - t0) < 1.0:
        f = lr_factor(budget.progress(step, time.perf_counter() - t0), budget.warmup_frac)
        for g in opt.param_groups:
            g["lr"] = budget.lr * f
        loss = loss_fn(gen)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        step += 1
        tokens += budget.batch * budget.seq
        if step % 50 == 0 or step == 1:
            last = loss.item()  # also syncs, so the time check above stays honest
            log(f"{label} step {step} loss {last:.3f} lr {budget.lr * f:.2e} "
                f"{tokens / (time.perf_counter() - t0):,.0f} tok/s")
    last = loss.item() if step else last
    secs = time.perf_counter() - t0
    return {"steps": step, "tokens": tokens, "seconds": round(secs, 2), "final_loss": round(last, 4),
            "tok_per_s": round(tokens / secs) if secs else None}


def train_target(model, stream: torch.Tensor, budget: TrainBudget, device, dtype=None, log=print) -> dict:
    """Next-token cross-entropy on random windows of the token stream."""
    model.train()
    params = [p for p in model.parameters()]

    def loss_fn(gen):
        ids = sample_batch(stream, budget.batch, budget.seq + 1, gen).to(device)
        with autocast_for(device, dtype):
            logits = model(ids[:, :-1])
        return F.cross_entropy(logits.float().flatten(0, 1), ids[:, 1:].flatten())

    return _loop(params, loss_fn, budget, device, log, "target")


@torch.no_grad()
def eval_loss(model, wins: list[list[int]], device, dtype=None, batch: int = 16) -> float | None:
    """Mean next-token cross-entropy over held-out windows."""
    if not wins:
        return None
    model.eval()
    total, count = 0.0, 0
    for i in range(0, len(wins), batch):
        ids = torch.tensor(wins[i:i + batch], device=device)
        with autocast_for(device, dtype):
            logits = model(ids[:, :-1])
        total += F.cross_entropy(logits.float().flatten(0, 1), ids[:, 1:].flatten(), reduction="sum").item()
        count += ids[:, 1:].numel()
    return total / count


def draft_losses(draft, target, ids: torch.Tensor, aux_layers, device, dtype=None, weights=(1.0, 0.8)):
    """(weighted soft cross-entropy, [top-1 agreement per step]) of the draft against the frozen
    target's own next-token distribution (EAGLE-3 training-time test with len(weights) steps)."""
    t = ids.shape[1]
    with torch.no_grad(), autocast_for(device, dtype):
        tlog, aux = target(ids, capture=tuple(aux_layers))
    with autocast_for(device, dtype):
        outs = draft.unrolled([a.detach() for a in aux], target.model.embed_tokens, ids, steps=len(weights))
    loss, agree = 0.0, []
    for k, (w, dl) in enumerate(zip(weights, outs)):
        rows = t - k - 1  # row i predicts token i+k+2: the target's distribution at position i+k+1
        want = tlog[:, k + 1:].float()
        got = dl[:, :rows].float()
        loss = loss + w * -(want.softmax(-1) * got.log_softmax(-1)).sum(-1).mean()
        agree.append((got.argmax(-1) == want.argmax(-1)).float().mean().item())
    return loss, agree


def train_draft(draft, target, stream: torch.Tensor, aux_layers, budget: TrainBudget, device, dtype=None,
                weights=(1.0, 0.8), log=print) -> dict:
    target.eval()
    for p in target.parameters():
        p.requires_grad_(False)
    draft.train()
    params = [p for p in draft.parameters()]
    agree: list[float] = []

    def loss_fn(gen):
        nonlocal agree
        ids = sample_batch(stream, budget.batch, budget.seq, gen).to(device)
        loss, agree = draft_losses(draft, target, ids, aux_layers, device, dtype, weights)
        return loss

    out = _loop(params, loss_fn, budget, device, log, "draft")
    out["last_batch_top1_agreement"] = [round(a, 4) for a in agree]
    return out


@torch.no_grad()
def greedy_continue(model, prompts: list[list[int]], new_tokens: int, device, dtype=None,
                    batch: int = 64) -> list[list[int]]:
    """Greedy continuations (no KV cache: a few seconds on the GPU, and nothing to get wrong)."""
    model.eval()
    out: list[list[int]] = []
    for i in range(0, len(prompts), batch):
        ids = torch.tensor(prompts[i:i + batch], device=device)
        start = ids.shape[1]
        for _ in range(new_tokens):
            with autocast_for(device, dtype):
                nxt = model(ids)[:, -1].argmax(-1, keepdim=True)
            ids = torch.cat([ids, nxt], dim=1)
        out += ids[:, start:].tolist()
    return out


@torch.no_grad()
def offline_accept_length(draft, target, prompts: list[list[int]], continuations: list[list[int]],
                          aux_layers, device, dtype=None, batch: int = 32) -> dict:
    """Expected SGLang accept length for greedy EAGLE-3 with topk 1 and 2 draft steps, on the
    target's own greedy text: 1 + [step 1 right] + [step 1 and step 2 right], averaged over the
    positions where the continuation is being decoded."""
    draft.eval()
    target.eval()
    n1 = n12 = rows = 0
    for i in range(0, len(prompts), batch):
        ids = torch.tensor([p + c for p, c in zip(prompts[i:i + batch], continuations[i:i + batch])],
                           device=device)
        p_len, t = len(prompts[i]), ids.shape[1]
        with autocast_for(device, dtype):
            tlog, aux = target(ids, capture=tuple(aux_layers))
            s1, s2 = draft.unrolled(aux, target.model.embed_tokens, ids, steps=2)
        lo, hi = max(0, p_len - 2), t - 3  # rows whose first guess lands inside the continuation
        want1 = tlog[:, lo + 1:hi + 1].argmax(-1)
        want2 = tlog[:, lo + 2:hi + 2].argmax(-1)
        ok1 = s1[:, lo:hi].argmax(-1) == want1
        ok2 = ok1 & (s2[:, lo:hi].argmax(-1) == want2)
        n1 += ok1.sum().item()
        n12 += ok2.sum().item()
        rows += ok1.numel()
    if not rows:
        return {"accept_length": None, "rows": 0}
    return {"accept_length": round(1 + (n1 + n12) / rows, 4), "step1_accept": round(n1 / rows, 4),
            "step2_given_step1": round(n12 / n1, 4) if n1 else None, "rows": rows}
