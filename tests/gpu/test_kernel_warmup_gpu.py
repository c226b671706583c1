"""On a GPU: after the speculative kernels' warm-up (adapters/kernel_warmup.py), a speculative step's
batch-size-keyed Triton launches at sizes the warm-up never named compile nothing.

The launches are made the way SGLang's spec_v2 call sites make them (argument dtypes as in its
prepare-for-decode, verify and accepted-KV move), through the same wrappers, with real data; the
Triton compile hooks count what compiles.  No server: a few seconds.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from sglang_dynspec import compat
from sglang_dynspec.adapters import kernel_warmup

pytestmark = [pytest.mark.gpu, pytest.mark.sglang]

ROW_WIDTH = 2048
DRAFT_TOKENS = 16
ACCEPT_WIDTH = 4  # speculative_num_steps 3 + 1


def _kv_pool(torch):
    from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool

    # Llama-8B's KV row (8 heads x 128, bf16), so the copy kernel's tile constants match a server's.
    return MHATokenToKVPool(size=4096, page_size=1, dtype=torch.bfloat16, head_num=8, head_dim=128, layer_num=2,
                            device="cuda", enable_memory_saver=False, enable_kv_cache_copy=True)


def _speculative_step_launches(torch, found, req_to_token, allocator, bs: int) -> None:
    dev = "cuda"
    pool_indices = torch.arange(bs, dtype=torch.int64, device=dev)
    # prepare-for-decode: KV lengths go from the CPU as int32; out_cache_loc from the allocator, int64
    cur = torch.full((bs,), 10, dtype=torch.int32, device=dev)
    out = torch.arange(1, 1 + bs * 6, dtype=torch.int64, device=dev)
    found["assign_req_to_token_pool"](pool_indices, req_to_token, cur, cur + 6, out, bs)
    seq_lens = torch.full((bs,), 16, dtype=torch.int64, device=dev)
    if "assign_extend_cache_locs" in found:  # verify: the window after seq_lens (int64)
        found["assign_extend_cache_locs"](req_pool_indices=pool_indices, req_to_token=req_to_token,
                                          start_offset=seq_lens, end_offset=seq_lens + DRAFT_TOKENS,
                                          batch_size=bs, draft_token_num=DRAFT_TOKENS, device=dev)
    if "move_accept_tokens" in found:  # topk > 1: two accepted tokens per request, -1 padded
        rows = torch.arange(bs, dtype=torch.int32, device=dev).unsqueeze(1) * DRAFT_TOKENS
        accept_index = torch.cat([rows, rows + 3, torch.full((bs, 2), -1, dtype=torch.int32, device=dev)], 1)
        batch = SimpleNamespace(seq_lens=seq_lens, req_pool_indices=pool_indices,
                                req_to_token_pool=SimpleNamespace(req_to_token=req_to_token),
                                out_cache_loc=torch.arange(1, 1 + bs * DRAFT_TOKENS, dtype=torch.int64, device=dev))
        accept_lens = torch.full((bs,), 2, dtype=torch.int32, device=dev)
        found["move_accept_tokens"](batch, accept_index, accept_lens - 1, allocator)
    torch.cuda.synchronize()


def test_a_speculative_step_after_the_warm_up_compiles_nothing():
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    if not kernel_warmup.WATCH.install():
        pytest.skip("this Triton has no compile hooks (triton.knobs, Triton >= 3.4)")
    found = compat.spec_step_kernels()
    req_to_token = torch.zeros((65, ROW_WIDTH), dtype=torch.int32, device="cuda")
    allocator = SimpleNamespace(get_kvcache=lambda pool=_kv_pool(torch): pool)
    shape = kernel_warmup.WarmupShape(max_batch=64, draft_tokens=DRAFT_TOKENS,
                                      topk=4 if "move_accept_tokens" in found else 1, accept_width=ACCEPT_WIDTH)

    report = kernel_warmup.warm(found, req_to_token, allocator, shape)
    assert report.failed == {}
    assert not req_to_token.any(), "the warm-up wrote to the request pool"
    print(f"warm-up: {report.seconds:.1f} s, {len(report.compiled)} variants: {report.compiled}")

    before = len(kernel_warmup.WATCH.compiled)
    for bs in (30, 47, 3):
        _speculative_step_launches(torch, found, req_to_token, allocator, bs)
    assert kernel_warmup.WATCH.compiled[before:] == []
    # The launches ran for real: request 0's KV slots 10..15 hold out_cache_loc 1..6.
    assert req_to_token[0, 10:16].tolist() == [1, 2, 3, 4, 5, 6]
