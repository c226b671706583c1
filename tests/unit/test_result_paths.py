"""Result files name paths as any checkout can read them: relative to the repository, temp
paths as <tmp>/..., never the absolute paths of the machine that ran."""

import json
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

from benchmarks import portable_results  # noqa: E402
from benchmarks.dynspec_bench.results import write_json  # noqa: E402


def test_new_records_hold_repo_relative_and_tmp_paths(tmp_path):
    model = str(ROOT / "benchmarks" / "models" / "llama8b")
    record = {
        "model": model, "draft_model": "/tmp/pair/draft", "cwd": str(ROOT),
        "command": f"bash benchmarks/device/run_sweep.sh sweep --model {model} --prompts-file /tmp/pair/p.json",
        "flags": {"on": {"args": ["--model-path", model], "env": {"SGLANG_DYNSPEC_STATS_DIR": "/tmp/st/on"}}},
        "errors": {"on": 'File "/tmp/site/sglang/x.py", line 3'},
        "kept": ["/var/tmp/x", "/usr/lib/python3.12", 3.25, None],
    }
    written = json.loads(write_json(tmp_path / "r.json", record).read_text())
    assert written == {
        "model": "benchmarks/models/llama8b", "draft_model": "<tmp>/pair/draft", "cwd": ".",
        "command": "bash benchmarks/device/run_sweep.sh sweep --model benchmarks/models/llama8b "
                   "--prompts-file <tmp>/pair/p.json",
        "flags": {"on": {"args": ["--model-path", "benchmarks/models/llama8b"],
                         "env": {"SGLANG_DYNSPEC_STATS_DIR": "<tmp>/st/on"}}},
        "errors": {"on": 'File "<tmp>/site/sglang/x.py", line 3'},
        "kept": ["/var/tmp/x", "/usr/lib/python3.12", 3.25, None],
    }
    assert record["model"] == model  # the harness keeps its real paths; only the file is portable


def test_keys_holding_machine_paths_are_made_portable_too():
    # rank_traces keys its agreement by trace folder: the JSON text holds the path as a key.
    record = {"tp_rank_agreement": {"/tmp/dynspec-logs-x/trace/dyn [goodput]": {"agree": True}}}
    text = json.dumps(record, indent=1)
    assert json.loads(portable_results.rewrite(text)) == {
        "tp_rank_agreement": {"<tmp>/dynspec-logs-x/trace/dyn [goodput]": {"agree": True}}}


def test_committed_results_hold_no_machine_paths():
    assert portable_results.main(["--check"]) == 0


def test_rewrite_of_an_old_record_changes_strings_only():
    text = json.dumps({"model": "/work/elsewhere/benchmarks/models/llama8b", "x": 1.50,
                       "command": "run --model /work/elsewhere/benchmarks/models/llama8b --out /tmp/o"}, indent=1)
    new = portable_results.rewrite(text)
    assert json.loads(new) == {"model": "benchmarks/models/llama8b", "x": 1.5,
                               "command": "run --model benchmarks/models/llama8b --out <tmp>/o"}
