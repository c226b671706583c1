"""The exported pair loads into the installed SGLang's own model classes, every tensor landing
where it belongs (SGLang's load_weights skips unknown names silently, so a typo would otherwise
only show up as a useless draft on the GPU)."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.sglang

REPO = Path(__file__).resolve().parents[2]

# Runs in a fresh interpreter: it initialises SGLang's (gloo, 1-rank) process groups and global
# server args, which must not leak into other tests.
CHILD = r'''
import json, socket, sys, types
import torch
# The CPU constructor of SGLang's RotaryEmbedding imports a vllm kernel symbol it never calls here.
if "vllm" not in sys.modules:
    v, ops = types.ModuleType("vllm"), types.ModuleType("vllm._custom_ops")
    ops.rotary_embedding = None
    v._custom_ops = ops
    sys.modules["vllm"], sys.modules["vllm._custom_ops"] = v, ops
from safetensors.torch import load_file
from transformers import LlamaConfig
stage = "construct"
try:
    from sglang.srt.distributed import init_distributed_environment, initialize_model_parallel
    from sglang.srt.server_args import ServerArgs, set_global_server_args_for_scheduler
    s = socket.socket(); s.bind(("127.0.0.1", 0)); port = s.getsockname()[1]; s.close()
    init_distributed_environment(world_size=1, rank=0, local_rank=0,
                                 distributed_init_method=f"tcp://127.0.0.1:{port}", backend="gloo")
    initialize_model_parallel(1)
    set_global_server_args_for_scheduler(ServerArgs(model_path=sys.argv[1], device="cpu"))
    from sglang.srt.models.llama import LlamaForCausalLM
    from sglang.srt.models.llama_eagle3 import LlamaForCausalLMEagle3
    out = {}
    for kind, path, cls in (("target", sys.argv[1], LlamaForCausalLM), ("draft", sys.argv[2], LlamaForCausalLMEagle3)):
        stage = "construct"
        model = cls(LlamaConfig.from_pretrained(path))
        stage = "load"
        with torch.no_grad():
            for p in model.parameters():
                p.fill_(float("nan"))
        model.load_weights(list(load_file(path + "/model.safetensors").items()))
        out[kind] = {n: p.detach().float().tolist() for n, p in model.named_parameters()}
        out[kind + "_lm_head_from_target"] = getattr(model, "load_lm_head_from_target", None)
    print("RESULT" + json.dumps(out))
except Exception as exc:
    import traceback; traceback.print_exc()
    print("STAGE" + stage, flush=True)
    sys.exit(3)
'''


def test_exported_pair_fills_every_sglang_parameter(tmp_path, sglang_version):
    from packaging.version import Version

    if sglang_version < Version("0.5.12"):
        # The draft is exported in 0.5.12's LlamaForCausalLMEagle3 layout, the release the pair is
        # served with on the H200; 0.5.9's draft module names its MLP parameters differently.
        pytest.skip(f"pair layout targets SGLang >= 0.5.12, installed {sglang_version}")
    torch = pytest.importorskip("torch", reason="torch not installed")
    pytest.importorskip("safetensors", reason="safetensors not installed")
    from benchmarks.models.pair_export import save_draft, save_target
    from benchmarks.models.pair_model import Eagle3Draft, LlamaShape, TargetLM

    # vocab 320 = SGLang's padded vocab size for 300..320, so shapes compare directly.
    shape = LlamaShape(vocab=320, hidden=64, layers=3, heads=4, kv_heads=2, head_dim=16, intermediate=96)
    torch.manual_seed(0)
    target, draft = TargetLM(shape), Eagle3Draft(shape, n_aux=3)
    save_target(target, tmp_path / "target", torch.float32, eos_id=0)
    save_draft(draft, tmp_path / "draft", [0, 1, 2], torch.float32, eos_id=0)
    proc = subprocess.run([sys.executable, "-c", CHILD, str(tmp_path / "target"), str(tmp_path / "draft")],
                          capture_output=True, text=True, timeout=240)
    if proc.returncode != 0:
        msg = proc.stdout[-1500:] + proc.stderr[-3000:]
        if "STAGEconstruct" in proc.stdout and str(sglang_version) != "0.5.12":
            pytest.skip(f"SGLang {sglang_version}: its Llama classes do not build on CPU here:\n{msg}")
        pytest.fail(msg)
    got = json.loads(proc.stdout.split("RESULT", 1)[1])

    def want(state, pairs):
        return {sg: torch.cat([state[p] for p in parts]) for sg, parts in pairs.items()}

    ts, ds = target.state_dict(), draft.state_dict()
    expect_t = dict(ts)
    for i in range(shape.layers):
        p = f"model.layers.{i}."
        expect_t.update(want(ts, {
            p + "self_attn.qkv_proj.weight": [p + f"self_attn.{x}_proj.weight" for x in "qkv"],
            p + "mlp.gate_up_proj.weight": [p + "mlp.gate_proj.weight", p + "mlp.up_proj.weight"]}))
    m = "midlayer."
    expect_d = {"model.fc.weight": ds["fc.weight"], "model.norm.weight": ds["norm.weight"],
                "lm_head.weight": ds["lm_head.weight"]}
    expect_d.update({"model.layers.0." + k[len(m):]: v for k, v in ds.items() if k.startswith(m)})
    expect_d.update(want(ds, {
        "model.layers.0.self_attn.qkv_proj.weight": [m + f"self_attn.{x}_proj.weight" for x in "qkv"],
        "model.layers.0.mlp.gate_up_proj.weight": [m + "mlp.gate_proj.weight", m + "mlp.up_proj.weight"]}))
    draft_shared = {"model.embed_tokens.weight"}
    for kind, expect, shared in (("target", expect_t, set()), ("draft", expect_d, draft_shared)):
        params = got[kind]
        # Every SGLang parameter is filled from our file, except the draft's embeddings, which
        # SGLang replaces with the target's at load (set_embed).
        assert set(params) - shared == {k for k in expect if k in params}, (kind, sorted(set(params) ^ set(expect)))
        for name, val in params.items():
            if name in shared:
                continue
            assert torch.equal(torch.tensor(val), expect[name].float()), f"{kind}: {name} differs"
    assert got["draft_lm_head_from_target"] is False  # our trained lm_head is the one used
