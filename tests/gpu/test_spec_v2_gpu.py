"""End to end on a GPU: the spec_v2 off-step gives the same greedy outputs as static EAGLE-3.

Starts one server per mode through the benchmark harness (benchmarks/dynspec_bench), one after
the other within a draft shape (topk 1; from SGLang 0.5.13 also topk 4 / 16 draft tokens, a test
of its own so that ``pytest -n`` runs the shapes side by side), and compares greedy output ids
token by token with that shape's static-EAGLE (``on`` / ``on@topk4``) server:

* ``dynspec:never``  - every decode step is an off-step (plain target decode + draft KV sync);
* ``dynspec:random`` - on/off switches inside running batches, so resumed speculation reads
  draft KV written by off-steps.

Defaults use the config-only 8B pair in benchmarks/models with ``--load-format dummy``; set
DYNSPEC_GPU_MODEL / DYNSPEC_GPU_DRAFT for a trained pair.  Random weights sit on near-ties, so
the run uses --enable-deterministic-inference unless DYNSPEC_GPU_DETERMINISTIC=0.
Also fails on tracebacks or KV-leak reports in any server log.
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

import pytest

pytestmark = [pytest.mark.gpu, pytest.mark.sglang]

ROOT = Path(__file__).resolve().parents[2]
BENCH = ROOT / "benchmarks"


def _harness():
    if not (BENCH / "dynspec_bench" / "modes.py").exists():
        pytest.skip("benchmarks/dynspec_bench harness not present")
    from benchmarks.dynspec_bench import correctness, modes, server

    return correctness, modes, server


RANDOM_ARGS = {"seed": 7, "p_on": 0.5, "period": 1}


GROUPS = {"topk1": ["on", "dynspec:never", "dynspec:random"],
          "topk4": ["on@topk4", "dynspec:never@topk4", "dynspec:random@topk4"]}


# One test per draft shape (its own reference `on` server first): with pytest -n they run side by
# side, so a release with both shapes on spec_v2 takes three server starts, not six, in a row.
@pytest.mark.parametrize("group", sorted(GROUPS))
def test_offstep_outputs_match_static_eagle(tmp_path, sglang_version, serve_and_collect, group):
    from packaging.version import Version

    if group == "topk4" and sglang_version < Version("0.5.13"):
        pytest.skip(f"sglang {sglang_version} routes topk > 1 to the v1 worker (tests/gpu/test_v1_gpu.py)")
    correctness, modes, server = _harness()
    model = os.environ.get("DYNSPEC_GPU_MODEL", str(BENCH / "models" / "llama8b"))
    draft = os.environ.get("DYNSPEC_GPU_DRAFT", str(BENCH / "models" / "eagle3-llama8b"))
    cfg = modes.ServerConfig(
        model=model,
        draft=draft,
        deterministic=os.environ.get("DYNSPEC_GPU_DETERMINISTIC", "1") != "0",
        enable_metrics=False,
        # A bounded KV pool: the test needs little, and other servers may share the GPU.
        max_total_tokens=32768,
    )
    prompts = correctness.correctness_prompts(n=16, input_len=128)
    log_dir = Path(os.environ.get("DYNSPEC_GPU_LOG_DIR", tmp_path))

    outputs, problems, notes = {}, [], []
    for i, name in enumerate(GROUPS[group]):
        mode = modes.parse_mode(name)
        # Only `random` takes these; other policies refuse unknown arguments at start.
        mode_cfg = dataclasses.replace(cfg, policy_args=RANDOM_ARGS if mode.policy == "random" else None)
        spec = modes.build_server_spec(mode, mode_cfg, port=31000 + 10 * sorted(GROUPS).index(group) + i)
        outs, probs, nts, _ = serve_and_collect(correctness, server, mode, spec, log_dir, prompts,
                                                max_new_tokens=64, concurrency=8)
        outputs[name] = outs
        problems += probs
        notes += nts

    ref_name = GROUPS[group][0]
    for name, outs in outputs.items():
        if name == ref_name:
            continue
        cmp = correctness.compare(outputs[ref_name], outs)
        if cmp["failed"] or cmp["mismatched"]:
            problems.append(f"{name} vs {ref_name}: {cmp}")
    print("\n".join(notes))
    assert not problems, "\n".join(problems)
