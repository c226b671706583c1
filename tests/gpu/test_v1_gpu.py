"""End to end on a GPU: the v1 (EAGLEWorker) off-step keeps greedy outputs identical.

SGLang 0.5.9 - 0.5.12 only (the v1 worker is gone in 0.5.13); on 0.5.11/0.5.12 EAGLE-3 with
topk 4 / 16 draft tokens is routed to v1 (overlap scheduling off).  One server per mode, one
after the other, through the benchmark harness; greedy output ids are compared token by token
with static EAGLE-3 (``on@topk4``):

* ``dynspec:threshold@topk4`` n=5 at concurrency 10 - the seed deployment's crash scenario:
  batches above 5 run off-steps, the tail of the run speculates again, so off-steps, resumed
  speculation and requests finishing during off-steps all happen inside running batches;
* ``dynspec:never@topk4`` - every decode step is an off-step;
* ``dynspec:random@topk4`` - on/off flips every step.

Fails on a mismatch, a failed request, a traceback or a KV-leak report in any server log.
Defaults use the config-only 8B pair in benchmarks/models with ``--load-format dummy``
(DYNSPEC_GPU_MODEL / DYNSPEC_GPU_DRAFT for a trained pair) and deterministic inference, since
random weights sit on near-ties (DYNSPEC_GPU_DETERMINISTIC=0 to turn it off).
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

import pytest

pytestmark = [pytest.mark.gpu, pytest.mark.sglang]

ROOT = Path(__file__).resolve().parents[2]
BENCH = ROOT / "benchmarks"

MODES = {
    "on@topk4": None,
    "dynspec:threshold@topk4": {"n": 5},
    "dynspec:never@topk4": None,
    "dynspec:random@topk4": {"seed": 7, "p_on": 0.5, "period": 1},
}
REFERENCE = "on@topk4"


def _harness():
    if not (BENCH / "dynspec_bench" / "modes.py").exists():
        pytest.skip("benchmarks/dynspec_bench harness not present")
    from benchmarks.dynspec_bench import correctness, modes, server

    return correctness, modes, server


def test_v1_offstep_outputs_match_static_eagle(tmp_path, sglang_version, serve_and_collect):
    from packaging.version import Version

    if sglang_version >= Version("0.5.13"):
        pytest.skip(f"sglang {sglang_version} has no v1 EAGLEWorker")
    correctness, modes, server = _harness()
    base = modes.ServerConfig(
        model=os.environ.get("DYNSPEC_GPU_MODEL", str(BENCH / "models" / "llama8b")),
        draft=os.environ.get("DYNSPEC_GPU_DRAFT", str(BENCH / "models" / "eagle3-llama8b")),
        deterministic=os.environ.get("DYNSPEC_GPU_DETERMINISTIC", "1") != "0",
        enable_metrics=False,
        # A bounded KV pool: the test needs little, and other servers may share the GPU.
        max_total_tokens=32768,
    )
    # 40 requests at concurrency 10: staggered finishes, so batch sizes cross n=5 mid-run.
    prompts = correctness.correctness_prompts(n=40, input_len=128)
    log_dir = Path(os.environ.get("DYNSPEC_GPU_LOG_DIR", tmp_path))

    outputs, problems, notes = {}, [], []
    for i, (name, policy_args) in enumerate(MODES.items()):
        mode = modes.parse_mode(name)
        cfg = dataclasses.replace(base, policy_args=policy_args)
        spec = modes.build_server_spec(mode, cfg, port=31100 + i)
        outs, probs, nts, text = serve_and_collect(correctness, server, mode, spec, log_dir, prompts,
                                                   max_new_tokens=96, concurrency=10)
        outputs[name] = outs
        problems += probs
        notes += nts
        if mode.kind == "dynspec" and "EAGLEWorkerV2" in text and "EAGLEWorker " not in text:
            notes.append(f"{name}: log mentions only the v2 worker - check the path really was v1")

    for name, outs in outputs.items():
        if name == REFERENCE:
            continue
        cmp = correctness.compare(outputs[REFERENCE], outs)
        if cmp["failed"] or cmp["mismatched"]:
            problems.append(f"{name} vs {REFERENCE}: {cmp}")
    print("\n".join(notes))
    assert not problems, "\n".join(problems)
