"""Prompt token-id lists: seeded pseudo-random, or loaded from a JSON file."""

from __future__ import annotations

import json
import random
from pathlib import Path

# Ids valid for both a 128k-vocab (Llama-3) and a 32k-vocab model, clear of special tokens.
ID_LOW, ID_HIGH = 1000, 30000


def random_prompts(n: int, input_len: int = 256, seed: int = 0) -> list[list[int]]:
    if n < 0:
        raise ValueError(f"n (number of prompts) must be >= 0, got {n}")
    if input_len < 1:
        raise ValueError(f"input_len must be >= 1, got {input_len}")
    rng = random.Random(seed)
    return [[rng.randrange(ID_LOW, ID_HIGH) for _ in range(input_len)] for _ in range(n)]


def load_prompts(path: str | Path) -> list[list[int]]:
    """A JSON list of token-id lists (or {"prompts": [...]})."""
    data = json.loads(Path(path).read_text())
    if isinstance(data, dict):
        data = data.get("prompts")
    if not isinstance(data, list) or not data:
        raise ValueError(f"{path}: expected a non-empty JSON list of token-id lists under 'prompts' or at top level")
    for i, ids in enumerate(data):
        if not isinstance(ids, list) or not ids or not all(isinstance(t, int) and t >= 0 for t in ids):
            raise ValueError(f"{path}: prompts[{i}] must be a non-empty list of non-negative ints")
    return data


class PromptSource:
    """Hands out prompts: from a file (cycled) or generated from a seed per use-site."""

    def __init__(self, input_len: int = 256, seed: int = 0, path: str | None = None):
        self.input_len = input_len
        self.seed = seed
        self.fixed = load_prompts(path) if path else None

    def take(self, n: int, salt: int) -> list[list[int]]:
        # Distinct salts give distinct prompts, so a level never reuses an earlier
        # level's prompts (the radix cache would otherwise skip their prefill).
        if self.fixed is not None:
            start = (salt * 7919) % len(self.fixed)
            return [self.fixed[(start + i) % len(self.fixed)] for i in range(n)]
        return random_prompts(n, self.input_len, seed=self.seed * 1_000_003 + salt)
