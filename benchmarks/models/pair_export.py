"""Write the pair as checkpoints HF and SGLang load: config.json + model.safetensors per model.

Configs carry the RoPE base both as `rope_theta` (older readers, SGLang's Llama) and as
`rope_parameters` (transformers 5), and the dtype both as `torch_dtype` and `dtype`.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import torch

from benchmarks.models.pair_model import LlamaShape

DTYPE_NAMES = {torch.bfloat16: "bfloat16", torch.float16: "float16", torch.float32: "float32"}


def llama_config(s: LlamaShape, dtype: torch.dtype, eos_id: int) -> dict:
    name = DTYPE_NAMES[dtype]
    return {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama",
        "vocab_size": s.vocab, "hidden_size": s.hidden, "num_hidden_layers": s.layers,
        "num_attention_heads": s.heads, "num_key_value_heads": s.kv_heads, "head_dim": s.head_dim,
        "intermediate_size": s.intermediate, "hidden_act": "silu", "rms_norm_eps": s.eps,
        "rope_theta": s.rope_theta, "rope_parameters": {"rope_type": "default", "rope_theta": s.rope_theta},
        "max_position_embeddings": s.max_positions, "tie_word_embeddings": False,
        "attention_bias": False, "mlp_bias": False, "initializer_range": 0.02, "pretraining_tp": 1,
        # One id for begin and end: the harness sends ids and asks for ignore_eos.
        "bos_token_id": eos_id, "eos_token_id": eos_id, "use_cache": True,
        "torch_dtype": name, "dtype": name,
    }


def draft_config(s: LlamaShape, aux_layers: list[int], dtype: torch.dtype, eos_id: int) -> dict:
    cfg = llama_config(s, dtype, eos_id)
    cfg.update({
        "architectures": ["LlamaForCausalLMEagle3"], "num_hidden_layers": 1,
        # Explicit full draft vocab: SGLang then loads our trained lm_head (not the target's)
        # and needs no d2t/t2d maps.
        "draft_vocab_size": s.vocab,
        # SGLang reads the capture layers from here (it captures the inputs of layer id + 1).
        "eagle_config": {"eagle_aux_hidden_state_layer_ids": list(aux_layers), "use_aux_hidden_state": True},
    })
    return cfg


def _save(state: dict, cfg: dict, out_dir: Path, dtype: torch.dtype) -> Path:
    from safetensors.torch import save_file

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    tensors = {k: v.detach().to("cpu", dtype).contiguous() for k, v in state.items()}
    # config first, weights last and atomically: a server waiting for model.safetensors
    # (harness --wait-for-weights) never sees half a folder.
    (out_dir / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")
    tmp = out_dir / "model.safetensors.partial"
    save_file(tensors, str(tmp), metadata={"format": "pt"})
    os.replace(tmp, out_dir / "model.safetensors")
    return out_dir


def save_target(model, out_dir: Path, dtype: torch.dtype, eos_id: int, state: dict | None = None,
                shape: LlamaShape | None = None) -> Path:
    """The trained target (or a padded `state`/`shape` of it) under HF's LlamaForCausalLM names."""
    state = state if state is not None else model.state_dict()
    return _save(state, llama_config(shape or model.shape, dtype, eos_id), out_dir, dtype)


def save_draft(draft, out_dir: Path, aux_layers: list[int], dtype: torch.dtype, eos_id: int) -> Path:
    # Only the draft's own weights: embeddings come from the target when SGLang loads the pair.
    return _save(draft.state_dict(), draft_config(draft.shape, aux_layers, dtype, eos_id), out_dir, dtype)


def padded_state(model, layers: int, intermediate: int, seed: int = 0, std: float = 0.02,
                 dtype: torch.dtype | None = None, device=None) -> tuple[dict, LlamaShape]:
    """The same function at a larger step cost. Extra MLP neurons get random gate/up rows and
    all-zero down_proj columns; extra layers (appended after the trained ones, so the EAGLE-3
    capture layer ids stay valid) get zero o_proj and down_proj. Each adds exact zeros to the
    residual stream, so logits are unchanged while every matmul runs at the larger size.
    Built on `device` in `dtype` (default: the model's): on the GPU the 2.6B random values of the
    full-size padding take milliseconds instead of tens of seconds on the CPU."""
    s = model.shape
    if layers < s.layers or intermediate < s.intermediate:
        raise ValueError(f"padding must not shrink the model: {s.layers}x{s.intermediate} -> {layers}x{intermediate}")
    ref = next(model.parameters())
    dtype = dtype or ref.dtype
    device = torch.device(device) if device is not None else ref.device
    gen = torch.Generator(device=device).manual_seed(seed)
    new = LlamaShape(**{**s.as_dict(), "layers": layers, "intermediate": intermediate})
    extra = intermediate - s.intermediate

    def rnd(*shape):
        return (torch.randn(*shape, generator=gen, device=device) * std).to(dtype)

    def zeros(*shape):
        return torch.zeros(*shape, device=device, dtype=dtype)

    def ones(n):
        return torch.ones(n, device=device, dtype=dtype)

    out = {}
    for k, v in model.state_dict().items():
        v = v.detach().to(device, dtype)
        if extra and k.endswith(("mlp.gate_proj.weight", "mlp.up_proj.weight")):
            v = torch.cat([v, rnd(extra, s.hidden)], 0)
        elif extra and k.endswith("mlp.down_proj.weight"):
            v = torch.cat([v, zeros(s.hidden, extra)], 1)
        out[k] = v
    q_out, kv_out = s.heads * s.head_dim, s.kv_heads * s.head_dim
    for i in range(s.layers, layers):
        p = f"model.layers.{i}."
        out[p + "input_layernorm.weight"] = ones(s.hidden)
        out[p + "post_attention_layernorm.weight"] = ones(s.hidden)
        out[p + "self_attn.q_proj.weight"] = rnd(q_out, s.hidden)
        out[p + "self_attn.k_proj.weight"] = rnd(kv_out, s.hidden)
        out[p + "self_attn.v_proj.weight"] = rnd(kv_out, s.hidden)
        out[p + "self_attn.o_proj.weight"] = zeros(s.hidden, q_out)
        out[p + "mlp.gate_proj.weight"] = rnd(intermediate, s.hidden)
        out[p + "mlp.up_proj.weight"] = rnd(intermediate, s.hidden)
        out[p + "mlp.down_proj.weight"] = zeros(s.hidden, intermediate)
    return out, new


def param_count(state: dict) -> int:
    return sum(v.numel() for v in state.values())
