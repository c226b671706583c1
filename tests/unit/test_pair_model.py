"""Realistic pair, toy sizes on CPU: HF reproduces the trainer's logits, padding changes nothing,
the draft's unrolled training matches step-by-step decoding, training learns and is repeatable."""

import json

import pytest

torch = pytest.importorskip("torch", reason="torch not installed (realistic-pair model tests need it)")
transformers = pytest.importorskip("transformers", reason="transformers not installed (HF loader check)")
pytest.importorskip("safetensors", reason="safetensors not installed (pair export writes safetensors)")


from benchmarks.models.pair_export import draft_config, padded_state, save_draft, save_target  # noqa: E402
from benchmarks.models.pair_model import Eagle3Draft, LlamaShape, TargetLM  # noqa: E402
from benchmarks.models.pair_train import (  # noqa: E402
    TrainBudget, draft_losses, offline_accept_length, sample_batch, train_draft, train_target,
)

CPU = torch.device("cpu")
# GQA (4 heads over 2 KV heads) so the head repetition is exercised too.
SHAPE = LlamaShape(vocab=300, hidden=64, layers=3, heads=4, kv_heads=2, head_dim=16, intermediate=96)


def _stream(n=4000, seed=0):
    # A learnable stream: a repeating pattern with noise, so a few steps visibly lower the loss.
    g = torch.Generator().manual_seed(seed)
    base = torch.arange(n) % 37 + 5
    noise = torch.randint(0, 300, (n,), generator=g)
    return torch.where(torch.rand(n, generator=g) < 0.1, noise, base).to(torch.int32)


@pytest.fixture(scope="module")
def trained():
    torch.manual_seed(0)
    m = TargetLM(SHAPE)
    stats = train_target(m, _stream(), TrainBudget(max_steps=30, lr=3e-3, batch=8, seq=32), CPU, log=lambda *_: None)
    return m.eval(), stats


def _hf(path):
    return transformers.LlamaForCausalLM.from_pretrained(str(path), dtype=torch.float32).eval()


def test_hf_loader_reproduces_trainer_logits(trained, tmp_path):
    m, stats = trained
    assert stats["steps"] == 30
    save_target(m, tmp_path / "t", torch.float32, eos_id=0)
    hf = _hf(tmp_path / "t")
    ids = torch.randint(0, 300, (2, 40), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        ours, aux = m(ids, capture=(0, 1))
        theirs = hf(ids, output_hidden_states=True)
    assert (ours - theirs.logits).abs().max().item() < 1e-4
    # capture=(i,) is HF's hidden_states[i + 1]: what SGLang hands the draft for aux layer id i.
    for a, i in zip(aux, (0, 1)):
        assert (a - theirs.hidden_states[i + 1]).abs().max().item() < 1e-4


def test_padded_export_gives_the_same_logits(trained, tmp_path):
    m, _ = trained
    state, shape = padded_state(m, layers=6, intermediate=160, seed=5, dtype=torch.float32)
    assert (shape.layers, shape.intermediate) == (6, 160)
    assert torch.count_nonzero(state["model.layers.4.self_attn.o_proj.weight"]) == 0
    assert torch.count_nonzero(state["model.layers.4.mlp.down_proj.weight"]) == 0
    assert torch.count_nonzero(state["model.layers.0.mlp.down_proj.weight"][:, 96:]) == 0
    assert torch.count_nonzero(state["model.layers.0.mlp.up_proj.weight"][96:]) > 0  # real work, zero effect
    save_target(m, tmp_path / "plain", torch.float32, 0)
    save_target(m, tmp_path / "padded", torch.float32, 0, state=state, shape=shape)
    cfg = json.loads((tmp_path / "padded" / "config.json").read_text())
    assert (cfg["num_hidden_layers"], cfg["intermediate_size"]) == (6, 160)
    ids = torch.randint(0, 300, (2, 33), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        a, b = _hf(tmp_path / "plain")(ids).logits, _hf(tmp_path / "padded")(ids).logits
    assert torch.allclose(a, b, atol=1e-5, rtol=0)
    with pytest.raises(ValueError, match="shrink"):
        padded_state(m, layers=2, intermediate=160)


def test_draft_unrolled_step2_matches_incremental_decoding():
    """Row i of unrolled step 2 must equal one decode step that sees step 1's keys for rows
    <= i plus its own key: what the draft sees in SGLang's KV cache after a draft extend."""
    torch.manual_seed(3)
    target, draft = TargetLM(SHAPE).eval(), Eagle3Draft(SHAPE, n_aux=2).eval()
    ids = torch.randint(0, 300, (1, 12))
    with torch.no_grad():
        _, aux = target(ids, capture=(0, 2))
        s1, s2 = draft.unrolled(aux, target.model.embed_tokens, ids, steps=2)
        layer = draft.midlayer
        from benchmarks.models.pair_model import rope_tables
        pos = torch.arange(12)
        cos, sin = rope_tables(pos, SHAPE.head_dim, SHAPE.rope_theta, torch.float32)
        g = draft.fc(torch.cat(aux, -1))
        # Step 1: row i gets token i+1 (the last row a pad id 0, as unrolled does).
        nxt = torch.cat([ids[:, 1:], torch.zeros(1, 1, dtype=ids.dtype)], 1)
        h1, k1, v1 = layer(g, target.model.embed_tokens(nxt), cos, sin)
        assert torch.allclose(draft.lm_head(draft.norm(h1)), s1, atol=1e-5)
        for i in (0, 4, 9):
            c, s = rope_tables(torch.tensor([i + 1]), SHAPE.head_dim, SHAPE.rope_theta, torch.float32)
            x = torch.cat([layer.input_layernorm(target.model.embed_tokens(ids[:, i + 2:i + 3])),
                           layer.hidden_norm(h1[:, i:i + 1])], -1)
            q, k, v = layer.self_attn.qkv(x, c, s)
            a = torch.nn.functional.scaled_dot_product_attention(
                q, torch.cat([k1[:, :, :i + 1], k], 2), torch.cat([v1[:, :, :i + 1], v], 2))
            h = h1[:, i:i + 1] + layer.self_attn.out(a)
            h = h + layer.mlp(layer.post_attention_layernorm(h))
            assert torch.allclose(draft.lm_head(draft.norm(h))[0, 0], s2[0, i], atol=1e-5)


def test_draft_training_beats_untrained_and_is_repeatable(trained):
    target, _ = trained
    stream = _stream(seed=1)

    def run():
        torch.manual_seed(7)
        d = Eagle3Draft(SHAPE, n_aux=3)
        with torch.no_grad():
            d.lm_head.weight.copy_(target.lm_head.weight)
        ids = sample_batch(stream, 4, 32, torch.Generator().manual_seed(9))
        before, _ = draft_losses(d, target, ids, (0, 1, 2), CPU)
        stats = train_draft(d, target, stream, (0, 1, 2), TrainBudget(max_steps=25, lr=3e-3, batch=8, seq=32),
                            CPU, log=lambda *_: None)
        after, agree = draft_losses(d, target, ids, (0, 1, 2), CPU)
        return d, before.item(), after.item(), agree, stats

    d1, before, after, agree, stats = run()
    assert stats["steps"] == 25 and after < before
    assert len(agree) == 2 and agree[0] > 0.3  # step-1 top-1 agreement with the target
    d2 = run()[0]
    assert all(torch.equal(a, b) for a, b in zip(d1.state_dict().values(), d2.state_dict().values()))
    prompts = [stream[i * 50:i * 50 + 20].tolist() for i in range(4)]
    conts = [stream[i * 50 + 20:i * 50 + 36].tolist() for i in range(4)]
    acc = offline_accept_length(d1, target, prompts, conts, (0, 1, 2), CPU)
    assert 1.0 <= acc["accept_length"] <= 3.0 and acc["rows"] == 4 * (36 - 3 - 18)


def test_draft_export_layout(tmp_path):
    d = Eagle3Draft(SHAPE, n_aux=3)
    save_draft(d, tmp_path / "d", [1, 5, 8], torch.bfloat16, eos_id=0)
    cfg = json.loads((tmp_path / "d" / "config.json").read_text())
    assert cfg["architectures"] == ["LlamaForCausalLMEagle3"] and cfg["num_hidden_layers"] == 1
    assert cfg["draft_vocab_size"] == cfg["vocab_size"] == 300 and cfg["tie_word_embeddings"] is False
    assert cfg["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == [1, 5, 8]
    from safetensors.torch import load_file
    w = load_file(str(tmp_path / "d" / "model.safetensors"))
    assert w["fc.weight"].shape == (64, 3 * 64) and w["fc.weight"].dtype == torch.bfloat16
    assert w["midlayer.self_attn.q_proj.weight"].shape == (64, 2 * 64)
    assert not any("embed" in k for k in w)  # shared from the target at load
    assert draft_config(SHAPE, [0], torch.float32, 0)["dtype"] == "float32"


def test_dummy_pair_configs_are_what_the_build_exports():
    """benchmarks/models/pair-padded and eagle3-pair give the trained pair's shapes to
    ``--load-format dummy`` runs (no build in the device call): they must stay the configs
    build_pair writes for run_pair.sh's padded target and for its draft."""
    import re
    from pathlib import Path

    from benchmarks.models.build_pair import PairConfig
    from benchmarks.models.pair_export import llama_config

    root = Path(__file__).resolve().parents[2]
    pad = re.search(r"--pad-layers (\d+) --pad-intermediate (\d+)", (root / "benchmarks/device/run_pair.sh").read_text())
    cfg = PairConfig()
    padded = LlamaShape(**{**cfg.target_shape().as_dict(), "layers": int(pad[1]), "intermediate": int(pad[2])})
    eos = 0  # the pair tokenizer's first special token (pair.json "eos_id")
    models = root / "benchmarks/models"
    assert json.loads((models / "pair-padded/config.json").read_text()) == llama_config(padded, torch.bfloat16, eos)
    assert json.loads((models / "eagle3-pair/config.json").read_text()) == draft_config(
        cfg.draft_shape(), cfg.aux_layers, torch.bfloat16, eos)
