"""rank_traces (the harness's TP-agreement check) groups per-process decision traces by server."""

import json

from benchmarks.dynspec_bench import rank_traces


def test_servers_of_one_run_are_compared_apart(tmp_path):
    """One harness run traces every server under the same stem: with its stats root, rank_traces
    compares each server's ranks with each other only, not a `never` server with an `always` one."""
    trace, stats = tmp_path / "trace", tmp_path / "stats"
    trace.mkdir()
    servers = {"dynspec_never": ("101", "102", False), "dynspec_always": ("201", "202", True)}
    for server, (*pids, on) in servers.items():
        (stats / server).mkdir(parents=True)
        for pid in pids:
            (stats / server / f"stats-{pid}.json").write_text(json.dumps({"pid": int(pid)}))
            (trace / f"dyn.{pid}.jsonl").write_text(
                "".join(json.dumps({"step": i, "bs": 4, "on": on}) + "\n" for i in range(50)))
    (lone,) = rank_traces.compare_dir(trace).values()  # no stats: four "ranks" of one server
    assert lone["processes"] == 4 and not lone["agree"]
    apart = rank_traces.compare_dir(trace, stats)
    assert sorted(apart) == [f"{trace / 'dyn'} [dynspec_always]", f"{trace / 'dyn'} [dynspec_never]"]
    assert all(c["agree"] and c["processes"] == 2 and c["steps_compared"] == 50 for c in apart.values())
    assert rank_traces.main([str(trace), "--stats", str(stats)]) == 0
    (stats / "dynspec_never" / "stats-102.json").unlink()  # a process without stats stands alone
    alone = rank_traces.compare_dir(trace, stats)
    assert sorted(c["processes"] for c in alone.values()) == [1, 1, 2]
    assert alone[f"{trace / 'dyn'} [pid 102]"]["processes"] == 1
