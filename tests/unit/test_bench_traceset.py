"""The trace-set builder: logs tarball + result JSON -> per-level traces of the static modes."""

import io
import json
import tarfile

import pytest

from benchmarks.dynspec_bench import traceset
from sglang_dynspec.tracereplay import load_trace_set, replay_static


def _rows(t0, n, bs, on, dt=0.004, acc=2.0):
    return [{"step": i, "bs": bs, "running": bs, "waiting": 0, "on": on, "acc": acc, "t": t0 + i * dt}
            for i in range(n)]


def _tar(path, files):
    with tarfile.open(path, "w:xz") as tar:
        for name, text in files.items():
            data = text.encode()
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))


def test_build_matches_levels_after_their_warmups_and_flags_cut_traces(tmp_path):
    # never server: warm-up (32 steps) + level C=4 (4 requests x 128 tokens), then a warm-up of C=8 and
    # only 10 steps of its level: the trace was cut short there.
    off = _rows(0, 32, 4, False) + _rows(2, 127, 4, False) + _rows(5, 32, 8, False) + _rows(7, 10, 8, False)
    on = _rows(0, 14, 4, True) + _rows(2, 60, 4, True, dt=0.006, acc=127 / 60) + _rows(5, 14, 8, True)
    files = {
        "logs/trace/dyn.11.jsonl": "".join(json.dumps(r) + "\n" for r in off),
        "logs/trace/dyn.12.jsonl": "".join(json.dumps(r) + "\n" for r in on) + '{"step": 1, "bs"',  # torn line
        "logs/stats/dynspec_never/stats-11.json": "{}",
        "logs/stats/dynspec_always/stats-12.json": "{}",
    }
    _tar(tmp_path / "logs.tar.xz", files)
    level = {"requests": 4, "completion_tokens": 512, "output_tok_per_s": 1000.0, "ttft_p50_ms": 20.0}
    result = {"settings": {"output_len": 128}, "sglang_version": "0.5.12",
              "modes": {"dynspec:never": {"4": level, "8": dict(level, requests=8, completion_tokens=1024)},
                        "dynspec:always": {"4": level, "8": dict(level, requests=8, completion_tokens=1024)}}}
    (tmp_path / "r.json").write_text(json.dumps(result))
    out = tmp_path / "set.json.gz"
    assert traceset.main([str(tmp_path / "r.json"), str(tmp_path / "logs.tar.xz"), "-o", str(out)]) == 0
    ts = load_trace_set(str(out))
    assert sorted(ts.levels) == [4]
    assert len(ts.levels[4]["off"].steps) == 127 and len(ts.levels[4]["on"].steps) == 60
    assert sorted(ts.incomplete) == ["C=8 off", "C=8 on"]
    # 127 steps of 4 ms + a 20 ms first prefill for 512 tokens
    assert replay_static(ts.levels[4]["off"]) == pytest.approx(512 / (127 * 0.004 + 0.020), rel=1e-3)

