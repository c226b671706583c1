"""The warm-up's batch sizes (adapters/kernel_warmup.batch_sizes) reach every kernel variant that
the full range 1..max_running_requests would: the same Triton specialisation keys, with a tenth of
the launches at 4096."""

from __future__ import annotations

import pytest

from sglang_dynspec.adapters.kernel_warmup import WarmupShape, batch_sizes

KV_COPY_CHUNK = 256  # SGLang's tiled KV copy: at most this many rows per launch, the rest in a last chunk


def _pow2(n: int) -> int:
    return 1 << (n - 1).bit_length() if n > 0 else 0


def _int_class(n: int) -> tuple:
    """How Triton specialises an integer argument: == 1, divisible by 16, neither."""
    return n == 1, n % 16 == 0


def _variants(bs: int, shape: WarmupShape) -> set:
    """A model of the variant keys one batch size makes, per kernel width w (rows per request): the
    next_power_of_2 constant with the integer class of the row count, and each KV-copy chunk's.
    A kernel uses one width, so the keys of different widths never combine."""
    keys = set()
    for w in {1, shape.topk, shape.accept_width, shape.draft_tokens}:
        rows = bs * w
        keys.add((w, "rows", _pow2(rows), _int_class(rows)))
        for start in range(0, rows, KV_COPY_CHUNK):
            chunk = min(KV_COPY_CHUNK, rows - start)
            keys.add((w, "chunk", _pow2(chunk), _int_class(chunk)))
    return keys


def _all_variants(sizes, shape) -> set:
    return set().union(*(_variants(b, shape) for b in sizes))


@pytest.mark.parametrize("top", [1, 17, 256, 300, 1000, 4096])
@pytest.mark.parametrize("draft_tokens,topk,accept_width", [(3, 1, 3), (16, 4, 3), (8, 8, 4), (5, 1, 5)])
def test_the_sizes_reach_every_variant_of_the_full_range(top, draft_tokens, topk, accept_width):
    shape = WarmupShape(max_batch=top, draft_tokens=draft_tokens, topk=topk, accept_width=accept_width)
    sizes = batch_sizes(shape)
    assert sizes == sorted(set(sizes)) and sizes[0] == 1 and sizes[-1] == top
    assert _all_variants(sizes, shape) == _all_variants(range(1, top + 1), shape)


def test_every_size_up_to_256_and_a_fraction_beyond():
    small = WarmupShape(max_batch=256, draft_tokens=16, topk=4, accept_width=3)
    assert batch_sizes(small) == list(range(1, 257))
    large = WarmupShape(max_batch=4096, draft_tokens=16, topk=4, accept_width=3)
    assert len(batch_sizes(large)) < 4096 // 5
