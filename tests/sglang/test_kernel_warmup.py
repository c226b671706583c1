"""The speculative kernels' warm-up (adapters/kernel_warmup.py) against the installed SGLang: the
release's batch-size-keyed helpers are found where its worker calls them from, and ``warm`` drives
SGLang's real wrappers at every batch size with empty work.  Only the Triton launches themselves
are recorded instead of run (they need a GPU; tests/gpu/test_kernel_warmup_gpu.py runs them)."""

from __future__ import annotations

import importlib
from types import SimpleNamespace

import pytest
from packaging.version import Version

from sglang_dynspec import compat
from sglang_dynspec.adapters import kernel_warmup

pytestmark = pytest.mark.sglang

torch = pytest.importorskip("torch")


def _expected_names(version: Version) -> set[str]:
    names = {"assign_req_to_token_pool"}
    if version < Version("0.5.16"):
        names.add("assign_extend_cache_locs")
    if version >= Version("0.5.13"):
        names.add("move_accept_tokens")
    return names


def test_the_release_helpers_are_found(sglang_version):
    found = compat.spec_step_kernels()
    assert set(found) == _expected_names(sglang_version)
    assert all(callable(fn) for fn in found.values())


def test_the_found_helpers_are_the_ones_the_worker_calls(sglang_version):
    found = compat.spec_step_kernels()
    if "move_accept_tokens" in found and sglang_version < Version("0.5.16"):
        worker_module = importlib.import_module("sglang.srt.speculative.eagle_worker_v2")
        assert found["move_accept_tokens"] is worker_module.move_accept_tokens_to_target_kvcache
    if sglang_version < Version("0.5.13"):
        info = importlib.import_module("sglang.srt.speculative.eagle_info_v2")
        assert found["assign_extend_cache_locs"] is info.assign_extend_cache_locs_func


class _RecordedKernel:
    """Stands in for one @triton.jit kernel: records each launch's grid and arguments."""

    def __init__(self, name):
        self.name = name
        self.launches = []

    def __getitem__(self, grid):
        def launch(*args, **kwargs):
            self.launches.append((grid, args, kwargs))

        return launch


class _RecordedPool:
    def __init__(self):
        self.moves = []

    def move_kv_cache(self, tgt_loc, src_loc):
        self.moves.append((tgt_loc.clone(), src_loc.clone()))


KERNEL_GLOBALS = ("assign_req_to_token_pool", "assign_extend_cache_locs", "fill_accept_out_cache_loc")


@pytest.fixture
def recorded(monkeypatch):
    """compat.spec_step_kernels() with their Triton kernels recorded, and a recorded KV pool."""
    found = compat.spec_step_kernels()
    kernels = {}
    for fn in found.values():
        for name in KERNEL_GLOBALS:
            if name in fn.__globals__:
                kernels.setdefault(name, _RecordedKernel(name))
                monkeypatch.setitem(fn.__globals__, name, kernels[name])
        # The wrappers launch only where CUDA is present; this test stands in for it.
        if "_is_cuda" in fn.__globals__:
            monkeypatch.setitem(fn.__globals__, "_is_cuda", True)
    pool = _RecordedPool()
    return found, kernels, pool, SimpleNamespace(get_kvcache=lambda: pool)


def _next_pow2(n):
    return 1 << (n - 1).bit_length()


@pytest.mark.parametrize("topk", [1, 4])
def test_warm_launches_every_batch_size_with_empty_work(recorded, topk):
    found, kernels, pool, allocator = recorded
    if topk > 1 and "move_accept_tokens" in found and "fill_accept_out_cache_loc" not in kernels:
        pytest.skip(f"sglang {compat.sglang_version()} launches the accepted-KV move's kernels through "
                    "wrappers in another package, not recorded here")
    req_to_token = torch.full((9, 300), 7, dtype=torch.int32)
    before = req_to_token.clone()
    shape = kernel_warmup.WarmupShape(max_batch=37, draft_tokens=16 if topk > 1 else 3, topk=topk,
                                      accept_width=4)
    report = kernel_warmup.warm(found, req_to_token, allocator, shape)

    assert report.failed == {}
    assert torch.equal(req_to_token, before)  # the request pool is never an argument
    sizes = list(range(1, 38))
    for name in ("assign_req_to_token_pool", "assign_extend_cache_locs"):
        if name not in kernels:
            continue
        launches = kernels[name].launches
        if name == "assign_extend_cache_locs" and "move_accept_tokens" in found and topk > 1:
            launches = launches[::2]  # the verify's launch, then the accepted-KV move's, per size
        assert [grid[0] for grid, _, _ in launches] == [bs for bs in sizes for _ in
                                                          range(2 if name == "assign_req_to_token_pool" else 1)]
        if name == "assign_req_to_token_pool":  # out_cache_loc aligned, then at an odd int64 offset
            aligned = [args[4].data_ptr() % 16 == 0 for _, args, _ in launches[:2]]
            assert aligned == [True, False]
            launches = launches[::2]
        for (grid, args, _), bs in zip(launches, sizes):
            pool_indices, row, start, end, _out, pool_len, bs_upper = args
            assert (pool_len, bs_upper) == (300, _next_pow2(bs))
            assert row.shape == (1, 300) and row.dtype == torch.int32 and row.data_ptr() != req_to_token.data_ptr()
            assert pool_indices.dtype == torch.int64 and len(pool_indices) == bs
            assert torch.equal(start, end)  # empty ranges: nothing is read from or written to a row
    if "move_accept_tokens" in found and topk > 1:
        fill = kernels["fill_accept_out_cache_loc"].launches
        assert [grid[0] for grid, _, _ in fill] == [bs * 4 for bs in sizes]
        assert all(bool((args[0] == -1).all()) for _, args, _ in fill)  # nothing accepted
        assert len(pool.moves) == len(sizes)
        assert all(not tgt.any() and not src.any() for tgt, src in pool.moves)  # slot 0 onto itself
    else:
        assert pool.moves == []
        assert not kernels.get("fill_accept_out_cache_loc") or not kernels["fill_accept_out_cache_loc"].launches


def test_a_failing_helper_is_reported_and_the_others_still_warm(recorded, monkeypatch):
    found, kernels, _pool, allocator = recorded

    def broken(*args, **kwargs):
        raise RuntimeError("no such kernel here")

    found = dict(found, assign_req_to_token_pool=broken)
    shape = kernel_warmup.WarmupShape(max_batch=5, draft_tokens=3, topk=1, accept_width=3)
    report = kernel_warmup.warm(found, torch.zeros((2, 64), dtype=torch.int32), allocator, shape)
    assert report.failed == {"assign_req_to_token_pool": "bs 1: RuntimeError: no such kernel here"}
    if "assign_extend_cache_locs" in kernels:
        assert [grid[0] for grid, _, _ in kernels["assign_extend_cache_locs"].launches] == [1, 2, 3, 4, 5]


def test_the_attention_backends_kv_splits_are_warmed_per_rows_per_request_and_lens_dtype():
    calls = []

    def get_num_kv_splits(num_kv_splits, seq_lens):  # the shape of TritonAttnBackend's method
        calls.append((len(num_kv_splits), len(seq_lens), seq_lens.dtype, num_kv_splits.dtype))

    shape = kernel_warmup.WarmupShape(max_batch=3, draft_tokens=16, topk=4, accept_width=3)
    report = kernel_warmup.warm({"attention_kv_splits": get_num_kv_splits}, torch.zeros((2, 64), dtype=torch.int32),
                                None, shape)
    assert report.failed == {}
    expected = [(bs * group, bs, dtype, torch.int32) for bs in (1, 2, 3) for group in (1, 4, 16)
                for dtype in (torch.int64, torch.int32)]
    assert calls == expected


def test_the_draft_kv_indices_are_warmed_on_int64_seq_lens_of_empty_requests():
    calls = []

    def common_template(forward_batch, kv_indices_buffer, call_fn):  # the multi-step backend's shape
        calls.append((forward_batch.batch_size, forward_batch.seq_lens.dtype, int(forward_batch.seq_lens.sum()),
                      len(forward_batch.positions), forward_batch.req_to_token_pool.req_to_token.shape,
                      kv_indices_buffer, call_fn))

    shape = kernel_warmup.WarmupShape(max_batch=3, draft_tokens=8, topk=2, accept_width=3)
    report = kernel_warmup.warm({"draft_kv_indices": common_template}, torch.zeros((2, 64), dtype=torch.int32),
                                None, shape)
    assert report.failed == {}
    assert calls == [(bs, torch.int64, 0, bs * 2, (1, 64), None, None) for bs in (1, 2, 3)]


def test_the_draft_backend_template_is_found_only_on_the_triton_multi_step_backend():
    from sglang.srt.layers.attention.triton_backend import TritonMultiStepDraftBackend

    def worker(backend):
        return SimpleNamespace(draft_worker=SimpleNamespace(draft_attn_backend=backend))

    backend = TritonMultiStepDraftBackend.__new__(TritonMultiStepDraftBackend)  # the method, not a GPU-built one
    assert compat.draft_kv_indices(worker(backend)).__func__ is TritonMultiStepDraftBackend.common_template
    # flashinfer's template asserts a real draft input after its launch: not called with empty work
    assert compat.draft_kv_indices(worker(SimpleNamespace(common_template=lambda *a: None))) is None
    assert compat.draft_kv_indices(worker(None)) is None


def test_the_triton_backend_method_is_found_only_on_a_triton_backend():
    from sglang.srt.layers.attention.triton_backend import TritonAttnBackend

    backend = TritonAttnBackend.__new__(TritonAttnBackend)  # the method, not a GPU-built instance
    assert compat.triton_kv_splits(SimpleNamespace(attn_backend=backend)).__func__ is TritonAttnBackend.get_num_kv_splits
    assert compat.triton_kv_splits(SimpleNamespace(attn_backend=object())) is None
    assert compat.triton_kv_splits(SimpleNamespace()) is None


# --------------------------------------------------------------------------------------------


@pytest.fixture
def knobs(monkeypatch):
    rt = kernel_warmup._runtime_knobs()
    if rt is None:
        pytest.skip("this Triton has no compile hooks (triton.knobs, Triton >= 3.4)")
    monkeypatch.setattr(rt, "jit_cache_hook", None)
    monkeypatch.setattr(rt, "jit_post_compile_hook", None)
    return rt


def _fake_fn(name, constexprs, runtime=("seq_lens", "num_seq")):
    params = [SimpleNamespace(num=i, name=n, is_constexpr=True) for i, n in enumerate(constexprs)]
    params += [SimpleNamespace(num=len(constexprs) + i, name=n, is_constexpr=False) for i, n in enumerate(runtime)]
    return SimpleNamespace(name=name, jit_function=SimpleNamespace(params=params))


def test_the_compile_watch_records_logs_and_chains(knobs, caplog):
    seen = []
    knobs.jit_post_compile_hook = lambda **kw: seen.append(kw["key"])
    watch = kernel_warmup.CompileWatch()
    assert watch.install()
    fn = _fake_fn("assign_extend_cache_locs", ["pool_len", "bs_upper"])
    # As Triton 3.6 passes them: constants and attributes keyed by argument path, signature by name.
    compile_info = {"constants": {(0,): 4096, (1,): 32},
                    "signature": {"pool_len": "constexpr", "bs_upper": "constexpr", "seq_lens": "*i64", "num_seq": "i32"},
                    "configs": [{(2,): [["tt.divisibility", 16]]}]}

    assert not knobs.jit_cache_hook(key="k1", repr="", fn=fn, compile=compile_info, is_manual_warmup=False,
                                    already_compiled=False)
    knobs.jit_post_compile_hook(key="k1", repr="", fn=fn, compile=compile_info, is_manual_warmup=False,
                                already_compiled=False)
    assert len(watch.compiled) == 1 and watch.compiled[0].startswith("assign_extend_cache_locs(pool_len=4096, bs_upper=32) ")
    assert seen == ["k1"]  # the hook set before still runs
    assert "while serving" not in caplog.text

    watch.serving = True
    with caplog.at_level("INFO", logger="sglang_dynspec.adapters.kernel_warmup"):
        knobs.jit_cache_hook(key="k2", repr="the repr", fn=fn, compile=compile_info, is_manual_warmup=False,
                             already_compiled=False)
        knobs.jit_post_compile_hook(key="k2", repr="the repr", fn=fn, compile=compile_info, is_manual_warmup=False,
                                    already_compiled=False)
    assert "Triton compiled assign_extend_cache_locs(pool_len=4096, bs_upper=32) while serving" in caplog.text
    # The argument types: dtype, and /16 where Triton specialised on 16-byte alignment / divisibility.
    assert "[seq_lens:*i64/16, num_seq:i32]" in caplog.text
    assert seen == ["k1", "k2"]


def _worker(max_running_requests, topk, kv_splits=None):
    """The attributes of an EAGLEWorkerV2 the warm-up reads (the real worker needs a GPU)."""
    model_runner = SimpleNamespace(max_running_requests=max_running_requests,
                                   req_to_token_pool=SimpleNamespace(req_to_token=torch.zeros((4, 96), dtype=torch.int32)),
                                   token_to_kv_pool_allocator=SimpleNamespace(get_kvcache=_RecordedPool),
                                   attn_backend=SimpleNamespace(get_num_kv_splits=kv_splits) if kv_splits else None)
    return SimpleNamespace(target_worker=SimpleNamespace(model_runner=model_runner), speculative_num_draft_tokens=8,
                           topk=topk, speculative_num_steps=3, draft_worker=SimpleNamespace(draft_attn_backend=None))


@pytest.fixture
def fresh_watch(monkeypatch):
    """A new CompileWatch, and Triton's compile hooks restored after the test."""
    rt = kernel_warmup._runtime_knobs()
    if rt is not None:
        monkeypatch.setattr(rt, "jit_cache_hook", rt.jit_cache_hook)
        monkeypatch.setattr(rt, "jit_post_compile_hook", rt.jit_post_compile_hook)
    monkeypatch.setattr(kernel_warmup, "WATCH", kernel_warmup.CompileWatch())


def test_prepare_warms_from_the_worker_and_then_watches(recorded, fresh_watch, caplog):
    from sglang_dynspec.adapters import spec_v2

    _found, kernels, _pool, _allocator = recorded
    splits = []
    with caplog.at_level("INFO", logger="sglang_dynspec.adapters.spec_v2"):
        spec_v2._warm_spec_kernels(_worker(300, 1, kv_splits=lambda n, lens: splits.append(len(lens))))
    sizes = kernel_warmup.batch_sizes(kernel_warmup.WarmupShape(300, 8, 1, 4))
    assert [grid[0] for grid, _, _ in kernels["assign_req_to_token_pool"].launches][::2] == sizes
    assert sorted(set(splits)) == sizes  # the Triton backend's kv-splits, from model_runner.attn_backend
    assert f"for batch sizes 1-300 ({len(sizes)} of them)" in caplog.text
    assert kernel_warmup.WATCH.serving == kernel_warmup.WATCH.installed


def test_a_worker_without_the_attributes_is_logged_and_serving_goes_on(fresh_watch, caplog):
    from sglang_dynspec.adapters import spec_v2

    with caplog.at_level("INFO", logger="sglang_dynspec.adapters.spec_v2"):
        spec_v2._warm_spec_kernels(SimpleNamespace())  # nothing raised
    assert "warm-up failed; they compile on first use" in caplog.text
    assert kernel_warmup.WATCH.serving == kernel_warmup.WATCH.installed
