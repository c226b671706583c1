"""Stand-in for ``python -m benchmarks.models.build_pair`` in CPU dry runs of the device drivers.

Writes what the harness waits for, in build_pair's order (prompts.json; target/ and, with
--pad-layers, target-padded/; then draft/; pair.json rewritten after each step) with a short
sleep per step, so servers really do wait for weights. Takes build_pair's arguments and ignores
the ones it does not need. Env: FAKE_BUILD_STEP_S (seconds per step, default 0.3),
FAKE_BUILD_FAIL_AFTER (exit 1 after this many steps: a builder that dies half-way).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

from ..prompts import random_prompts

STEPS = ("corpus", "train_target", "save_target", "save_padded", "train_draft", "save_draft", "measure")


def _write_model(folder: Path, arch: str) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps({"architectures": [arch], "fake": True}))
    tmp = folder / "model.safetensors.partial"
    tmp.write_bytes(b"fake weights")
    os.replace(tmp, folder / "model.safetensors")  # atomically, as build_pair does


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="fake_build")
    ap.add_argument("--out", required=True)
    ap.add_argument("--pad-layers", type=int, default=0)
    ap.add_argument("--pad-intermediate", type=int, default=0)
    ap.add_argument("--n-prompts", type=int, default=64)
    ap.add_argument("--prompt-len", type=int, default=32)
    args, _ignored = ap.parse_known_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    step_s = float(os.environ.get("FAKE_BUILD_STEP_S", "0.3"))
    fail_after = int(os.environ.get("FAKE_BUILD_FAIL_AFTER", "0") or 0)
    man = {"config": {"pad_layers": args.pad_layers, "pad_intermediate": args.pad_intermediate, "fake": True},
           "phase_seconds": {}, "done": False}
    for i, step in enumerate(STEPS):
        if fail_after and i >= fail_after:
            print(f"fake_build: failing on purpose before {step}", flush=True)
            return 1
        time.sleep(step_s)
        if step == "corpus":
            (out / "prompts.json").write_text(json.dumps(random_prompts(args.n_prompts, args.prompt_len, seed=1)))
        elif step == "save_target":
            _write_model(out / "target", "LlamaForCausalLM")
        elif step == "save_padded" and args.pad_layers:
            _write_model(out / "target-padded", "LlamaForCausalLM")
        elif step == "save_draft":
            _write_model(out / "draft", "LlamaForCausalLMEagle3")
        man["phase_seconds"][step] = step_s
        (out / "pair.json").write_text(json.dumps(man))
        print(f"fake_build: {step} done", flush=True)
    man["done"] = True
    man["phase_seconds"]["total"] = step_s * len(STEPS)
    (out / "pair.json").write_text(json.dumps(man))
    return 0


if __name__ == "__main__":
    sys.exit(main())
