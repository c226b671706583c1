"""Tensor parallelism on the CPU: two gloo ranks with different local timings decide alike.

Each rank is its own process with its own clock; only the cost agreement (runtime's real
all-reduce over the scheduler's CPU group) makes the goodput decisions rank-identical.
The control run without agreement shows the test can fail.  Each rank also writes the plugin's
decision trace, which the harness's rank_traces tool (used on the GPU's TP=2 runs) must judge the
same way.
"""

import json
import multiprocessing as mp
import random
import socket
import types

import pytest

from benchmarks.dynspec_bench import rank_traces

torch = pytest.importorskip("torch", reason="needs torch (torch.distributed gloo)")

STEPS = 3000


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _rank_main(rank, port, policy, args, agree_on, q, trace):
    import torch.distributed as dist

    from sglang_dynspec import runtime
    from sglang_dynspec.controller import Controller
    from sglang_dynspec.metrics import TraceObserver
    from sglang_dynspec.plugins import pm
    from sglang_dynspec.policies import build_policy

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    clock = types.SimpleNamespace(t=0.0)
    agree = runtime._agree_fn(types.SimpleNamespace(tp_cpu_group=dist.group.WORLD)) if agree_on else None
    observer = TraceObserver(trace, 10**7)  # one file per process, as in a TP server
    pm.register(observer, name="trace")
    ctl = Controller(build_policy(policy, args), tp_rank=rank, tp_size=2, agree=agree, sync_interval=50,
                     clock=lambda: clock.t, hook=pm.hook)
    jitter = random.Random(1000 + rank)  # rank-local noise
    # Rank 1 measures its speculative steps 30 % slower: the ranks' own figures rank the modes
    # differently near the crossover (a uniform factor would not: the ranking is scale-free).
    skew = 1.0 if rank == 0 else 1.3
    load = random.Random(7)  # the batch sizes: identical on both ranks, as in SGLang
    out = []
    bs = 8
    for step in range(STEPS):
        if step % 100 == 0:
            bs = load.choice([1, 2, 4, 8, 32, 64, 128])
        on = ctl.on_decode(bs, bs, 0)
        out.append(on)
        base = (0.006 + 0.00025 * bs) if on else (0.004 + 0.00004 * bs)
        clock.t += base * (skew if on else 1.0) * (1 + 0.2 * jitter.random())
        if on:
            ctl.on_result(bs, int(1.6 * bs))  # rank-identical acceptance (scheduler counts)
    observer.close()
    q.put((rank, out, ctl.snapshot()))
    dist.destroy_process_group()


def _run(policy, args, agree_on, trace):
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    port = _free_port()
    procs = [ctx.Process(target=_rank_main, args=(r, port, policy, args, agree_on, q, str(trace)))
             for r in (0, 1)]
    for p in procs:
        p.start()
    results = dict((r, (o, s)) for r, o, s in (q.get(timeout=120) for _ in procs))
    for p in procs:
        p.join(timeout=60)
        assert p.exitcode == 0
    return results


@pytest.mark.parametrize("policy, args", [("goodput", {}), ("random", {"seed": 11})])
def test_ranks_decide_identically(policy, args, tmp_path):
    res = _run(policy, args, agree_on=True, trace=tmp_path / "dec.jsonl")
    d0, s0 = res[0]
    d1, s1 = res[1]
    assert d0 == d1
    assert s0["switches"] == s1["switches"]
    if policy == "goodput":
        assert 0 < s0["steps_off"] < STEPS and s0["agreements"] >= STEPS // 50 - 1
    (cmp,) = rank_traces.compare_dir(tmp_path).values()
    assert cmp["agree"] and cmp["processes"] == 2 and cmp["steps_compared"] == STEPS
    assert cmp["switches_compared"] == s0["switches"]
    # As run_sweep.sh uses it: the comparison joins the harness result.
    result = tmp_path / "r.json"
    result.write_text(json.dumps({"kind": "fuzz"}))
    assert rank_traces.main([str(tmp_path), "--into", str(result)]) == 0
    assert json.loads(result.read_text())["tp_rank_agreement"] == cmp


def test_without_agreement_goodput_ranks_diverge(tmp_path):
    res = _run("goodput", {}, agree_on=False, trace=tmp_path / "dec.jsonl")
    assert res[0][0] != res[1][0]
    (cmp,) = rank_traces.compare_dir(tmp_path).values()
    first = next(i for i, (a, b) in enumerate(zip(res[0][0], res[1][0])) if a != b)
    assert not cmp["agree"] and cmp["first_difference"]["index"] == first
    assert rank_traces.main([str(tmp_path)]) == 1

