"""Greedy outputs of every mode compared token by token with a reference mode (normally `off`)."""

from __future__ import annotations

import asyncio

from .loadgen import closed_loop, sampling_params
from .prompts import random_prompts

DEFAULT_PROMPTS = 16
DEFAULT_NEW_TOKENS = 64
DEFAULT_CONCURRENCY = 8
CORRECTNESS_SEED = 424242  # fixed: every mode and every run must see the same prompts


def correctness_prompts(n: int = DEFAULT_PROMPTS, input_len: int = 256, seed: int = CORRECTNESS_SEED):
    return random_prompts(n, input_len, seed=seed)


def collect_outputs(
    base_url: str, prompts: list[list[int]], max_new_tokens: int = DEFAULT_NEW_TOKENS,
    concurrency: int = DEFAULT_CONCURRENCY,
) -> list[list[int] | None]:
    """Output ids per prompt (None where the request failed). Batched on purpose: at
    concurrency > 1 a dynspec server switches within running batches."""
    results, _ = asyncio.run(
        closed_loop(base_url, prompts, concurrency, sampling_params(max_new_tokens), desc="correctness")
    )
    by_index = {r.index: (r.output_ids if r.ok else None) for r in results}
    return [by_index.get(i) for i in range(len(prompts))]


def first_mismatch(ref: list[int], got: list[int]) -> int | None:
    """Index of the first differing token; a length difference counts at the shorter end."""
    for i, (a, b) in enumerate(zip(ref, got)):
        if a != b:
            return i
    return None if len(ref) == len(got) else min(len(ref), len(got))


def compare(reference: list[list[int] | None], outputs: list[list[int] | None]) -> dict:
    if len(reference) != len(outputs):
        raise ValueError(f"reference has {len(reference)} outputs, compared mode has {len(outputs)}")
    firsts: list[int | None] = []
    failed = 0
    for ref, got in zip(reference, outputs):
        if ref is None or got is None:
            failed += 1
            firsts.append(0)  # unknown output counts as wrong from the start
        else:
            firsts.append(first_mismatch(ref, got))
    return {
        "requests": len(outputs),
        "mismatched": sum(1 for f in firsts if f is not None),
        "first_mismatch": firsts,
        "failed": failed,
    }
