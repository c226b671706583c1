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


def test_single_process_server_is_not_compared(tmp_path, capsys):
    """A TP=1 server writes one trace: nothing was compared, so there is no verdict (agree null),
    not a DIFFER, and it does not fail the run; a second, empty file does not make it a pair."""
    rows = [{"step": i, "bs": 4, "on": 10 <= i < 20} for i in range(50)]
    (tmp_path / "dyn.101.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (tmp_path / "dyn.102.jsonl").write_text("")  # a process that never decided
    (cmp,) = rank_traces.compare_dir(tmp_path).values()
    assert cmp["processes"] == 1 and cmp["empty_files"] == ["dyn.102.jsonl"]
    assert cmp["agree"] is None and cmp["compared"] is False and cmp["first_difference"] is None
    assert cmp["reason"] == "one process: nothing to compare"
    assert (cmp["steps_compared"], cmp["steps_on_compared"], cmp["switches_compared"]) == (50, 10, 2)
    result = tmp_path / "r.json"
    result.write_text(json.dumps({"kind": "fuzz"}))
    assert rank_traces.main([str(tmp_path), "--into", str(result)]) == 0
    line = capsys.readouterr().out
    assert "NOT COMPARED, one process: nothing to compare" in line and "DIFFER" not in line
    assert json.loads(result.read_text())["tp_rank_agreement"]["agree"] is None


def test_pairs_keep_their_verdict(tmp_path):
    """Two processes still get agree true/false; only a difference fails the exit status."""
    for pid, on in (("101", False), ("102", False), ("103", True)):
        (tmp_path / f"dyn.{pid}.jsonl").write_text(
            "".join(json.dumps({"step": i, "bs": 4, "on": on}) + "\n" for i in range(5)))
    (cmp,) = rank_traces.compare_dir(tmp_path).values()
    assert cmp["compared"] is True and cmp["reason"] is None
    assert cmp["agree"] is False and cmp["first_difference"]["index"] == 0
    assert rank_traces.main([str(tmp_path)]) == 1
    (tmp_path / "dyn.103.jsonl").unlink()
    (cmp,) = rank_traces.compare_dir(tmp_path).values()
    assert cmp["compared"] is True and cmp["agree"] is True
    assert rank_traces.main([str(tmp_path)]) == 0
