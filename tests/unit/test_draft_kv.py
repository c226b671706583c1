"""Which drafts the light draft sync accepts (pure attribute checks; the GPU fuzz runs it)."""

from types import SimpleNamespace as NS

import pytest

from sglang_dynspec import compat
from sglang_dynspec.adapters import draft_kv


class LlamaForCausalLMEagle3:
    def __init__(self, layers=1, mrope=False, input_layer=True):
        layer = NS(hidden_norm=object(), input_layernorm=object(), is_input_layer=input_layer,
                   self_attn=NS(qkv_proj=object()))
        self.model = NS(layers=[layer] * layers, is_mrope_enabled=mrope, embed_tokens=object(), fc=object())


class MHATokenToKVPool:
    pass


class SWAKVPool:
    pass


def runner(model=None, pool=None):
    return NS(model=model if model is not None else LlamaForCausalLMEagle3(),
              token_to_kv_pool=pool if pool is not None else MHATokenToKVPool())


def test_single_layer_eagle3_with_mha_pool_is_supported():
    assert compat.light_sync_draft_problem(runner()) is None


def test_other_drafts_keep_the_full_sync():
    class LlamaForCausalLMEagle(LlamaForCausalLMEagle3):
        pass

    assert "not an EAGLE-3" in compat.light_sync_draft_problem(runner(LlamaForCausalLMEagle()))
    assert "2 layers" in compat.light_sync_draft_problem(runner(LlamaForCausalLMEagle3(layers=2)))
    assert "mrope" in compat.light_sync_draft_problem(runner(LlamaForCausalLMEagle3(mrope=True)))
    assert "input layer" in compat.light_sync_draft_problem(runner(LlamaForCausalLMEagle3(input_layer=False)))
    assert "SWAKVPool" in compat.light_sync_draft_problem(runner(pool=SWAKVPool()))
    assert compat.light_sync_draft_problem(None) == "no draft model"


def test_placeholders_are_shared_zero_rows():
    torch = __import__("pytest").importorskip("torch")
    ph = draft_kv.Placeholders()
    a = ph.get(3, 4, 8, torch.bfloat16, "cpu")
    b = ph.get(5, 4, 8, torch.bfloat16, "cpu")
    assert a["topk_p"].shape == (3, 4) and b["hidden_states"].shape == (5, 8)
    assert a["topk_p"].data_ptr() == b["topk_p"].data_ptr()  # no allocation per step
    assert not a["topk_p"].any() and a["topk_index"].dtype == torch.int64 and a["hidden_states"].dtype == torch.bfloat16


def test_setting_selects_the_sync(monkeypatch):
    from sglang_dynspec.config import ConfigError, load_settings

    assert load_settings({}).settings.offstep_draft_sync == "light"
    env = {"SGLANG_DYNSPEC_OFFSTEP_DRAFT_SYNC": "full"}
    assert load_settings(env).settings.offstep_draft_sync == "full"
    with pytest.raises(ConfigError, match="offstep_draft_sync"):
        load_settings({"SGLANG_DYNSPEC_OFFSTEP_DRAFT_SYNC": "fast"})


def test_prepare_turns_the_light_sync_on_only_where_allowed():
    r = runner()
    r.model_config = NS(hidden_size=8, dtype="bf16")
    light = draft_kv.prepare(r, 4, "test", "light")
    assert (light.topk, light.draft_hidden, light.draft_dtype) == (4, 8, "bf16")
    assert draft_kv.prepare(runner(LlamaForCausalLMEagle3(layers=2)), 4, "test", "light") is None
    assert draft_kv.prepare(r, 4, "test", "full") is None
