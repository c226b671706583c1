"""Real SGLang `off` and `on` servers through the harness (needs an NVIDIA GPU and SGLang).

Writes e2e-gpu.json (+ .png) to DYNSPEC_GPU_OUT_DIR, else benchmarks/results. Model paths: DYNSPEC_MODEL / DYNSPEC_DRAFT, else the
dummy-weight Llama-8B configs under benchmarks/models.
"""

import importlib.util
import json
import os
import shutil
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.gpu


def _gpu_and_sglang() -> str | None:
    if shutil.which("nvidia-smi") is None:
        return "no nvidia-smi"
    if importlib.util.find_spec("sglang") is None:
        return "SGLang not installed"
    if importlib.util.find_spec("aiohttp") is None:
        return "aiohttp not installed"
    try:
        import torch
        if not torch.cuda.is_available():
            return "torch sees no CUDA device"
    except ImportError:
        return "torch not installed"
    return None


@pytest.mark.skipif(_gpu_and_sglang() is not None, reason=_gpu_and_sglang() or "")
def test_off_and_on_servers_end_to_end():
    from benchmarks.dynspec_bench.modes import ServerConfig
    from benchmarks.dynspec_bench.results import RESULT_SCHEMA
    from benchmarks.dynspec_bench.sweep import Sweep, SweepConfig

    cfg = SweepConfig(
        waves=[["off", "on"]],
        server=ServerConfig(model=os.environ.get("DYNSPEC_MODEL", str(REPO / "benchmarks/models/llama8b")),
                            draft=os.environ.get("DYNSPEC_DRAFT", str(REPO / "benchmarks/models/eagle3-llama8b")),
                            max_total_tokens=32768),
        concurrency=[1, 8], output_len=64, max_requests=64,
        out_dir=os.environ.get("DYNSPEC_GPU_OUT_DIR", str(REPO / "benchmarks/results")), name="e2e-gpu", base_port=31500,
    )
    rec = Sweep(cfg, argv=["tests/gpu/test_e2e_sweep.py"]).run()
    assert not rec["errors"], rec["errors"]
    for mode in ("off", "on"):
        for c in ("1", "8"):
            lv = rec["modes"][mode][c]
            assert lv["failed"] == 0 and lv["output_tok_per_s"] > 0
    assert rec["modes"]["off"]["1"]["accept_length"] is None
    assert rec["modes"]["on"]["1"]["accept_length"] >= 1.0
    assert rec["correctness"]["on"]["requests"] == cfg.correctness_prompts
    for mode in ("off", "on"):
        assert rec["server_stats"][mode]["leak_reports"] == 0
    jsonschema = pytest.importorskip("jsonschema")
    jsonschema.validate(json.loads((Path(cfg.out_dir) / "e2e-gpu.json").read_text()), RESULT_SCHEMA)
