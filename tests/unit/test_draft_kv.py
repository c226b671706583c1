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


# --- the recorded write (WriteGraphs): what an off-step hands a replay ---------------------------

class _Recorded:
    """Stands in for one CUDA graph of ``size`` rows: its replay reads the static inputs as the
    recorded write does (the first ``size`` rows) and keeps what it read."""

    def __init__(self, g, size, seen):
        self.g, self.size, self.seen = g, size, seen

    def replay(self):
        g, b = self.g, self.size
        self.seen.append((b, g.tokens[:b].clone(), g.hidden[:b].clone(), g.positions[:b].clone(), g.locs[:b].clone()))


def _graphs(sizes=(1, 2, 4, 8), width=3):
    torch = pytest.importorskip("torch")
    top = max(sizes)
    g = draft_kv.WriteGraphs(tuple(sizes), {}, torch.zeros(top, dtype=torch.int64), torch.zeros(top, width),
                             torch.zeros(top, dtype=torch.int64), torch.zeros(top, dtype=torch.int64))
    seen = []
    g.graphs = {b: _Recorded(g, b, seen) for b in sizes}
    return torch, g, seen


def test_a_batch_replays_the_smallest_graph_that_holds_it_and_pads_with_slot_zero():
    torch, g, seen = _graphs()
    assert [g.size_for(n) for n in (1, 2, 3, 5, 8, 9)] == [1, 2, 4, 8, 8, None]
    # A full batch of 8 leaves its slots in the static input ...
    assert g.run(torch.arange(8), torch.ones(8, 3), torch.arange(8) + 100, torch.arange(8) + 50)
    # ... then 3 rows run the 4-row graph: row 3 must write the padding slot, not a slot of the old batch.
    tokens, hidden = torch.tensor([5, 6, 7], dtype=torch.int32), torch.full((3, 3), 2.0)
    assert g.run(tokens, hidden, torch.tensor([10, 11, 12], dtype=torch.int32), torch.tensor([20, 21, 22]))
    size, t, h, p, loc = seen[-1]
    assert size == 4
    assert t[:3].tolist() == [5, 6, 7] and p[:3].tolist() == [10, 11, 12] and bool((h[:3] == 2.0).all())
    assert loc.tolist() == [20, 21, 22, 0]
    assert t.dtype == torch.int64 and p.dtype == torch.int64  # the recorded dtypes, whatever came in


def test_rows_no_graph_holds_run_eager():
    torch, g, seen = _graphs()
    assert not g.run(torch.arange(9), torch.ones(9, 3), torch.arange(9), torch.arange(9))  # above the largest
    assert not g.run(torch.arange(2), torch.ones(2, 4), torch.arange(2), torch.arange(2))  # other hidden width
    assert not g.run(torch.arange(0), torch.ones(0, 3), torch.arange(0), torch.arange(0))
    assert seen == []


def test_light_sync_writes_by_replay_else_eagerly_inside_the_draft_contexts(monkeypatch):
    torch, g, seen = _graphs()
    eager, entered = [], []
    monkeypatch.setattr(draft_kv, "write", lambda runner, tok, hid, pos, loc: eager.append(int(tok.shape[0])))

    class Ctx:
        def __enter__(self):
            entered.append(True)

        def __exit__(self, *exc):
            return False

    light = draft_kv.LightSync(topk=1, draft_hidden=3, draft_dtype=torch.float32, graphs=g, contexts=Ctx)
    light.write(None, torch.arange(3), torch.ones(3, 3), torch.arange(3), torch.arange(3))
    assert [s[0] for s in seen] == [4] and eager == [] and entered == []
    light.write(None, torch.arange(12), torch.ones(12, 3), torch.arange(12), torch.arange(12))
    assert eager == [12] and entered == [True]
    light.graphs = None
    light.write(None, torch.arange(2), torch.ones(2, 3), torch.arange(2), torch.arange(2))
    assert eager == [12, 2] and len(seen) == 1


def test_a_position_offset_shifts_the_positions_written_by_replay_and_eagerly(monkeypatch):
    # Off-steps pass the batch's lengths and -1 (the token's position) instead of a subtraction of their own.
    torch, g, seen = _graphs()
    eager = []
    monkeypatch.setattr(draft_kv, "write", lambda runner, tok, hid, pos, loc: eager.append(pos.tolist()))
    light = draft_kv.LightSync(topk=1, draft_hidden=3, draft_dtype=torch.float32, graphs=g)
    lens = torch.tensor([11, 21, 31])
    light.write(None, torch.arange(3), torch.ones(3, 3), lens, torch.arange(3), position_offset=-1)
    assert seen[-1][3][:3].tolist() == [10, 20, 30]
    light.graphs = None
    light.write(None, torch.arange(3), torch.ones(3, 3), lens, torch.arange(3), position_offset=-1)
    assert eager == [[10, 20, 30]] and lens.tolist() == [11, 21, 31]


def test_the_write_is_recorded_at_the_off_step_graphs_sizes_only_with_them():
    from sglang_dynspec.adapters import offstep_graphs

    assert offstep_graphs.capture_sizes(None) is None
    assert offstep_graphs.capture_sizes({"runner": NS(capture_bs=[8, 1, 4, 2])}) == [1, 2, 4, 8]
    assert offstep_graphs.capture_sizes({"runner": NS()}) is None


def test_a_tensor_parallel_draft_is_not_recorded():
    torch = pytest.importorskip("torch")
    fc = NS(weight=torch.zeros(4, 12))
    model = NS(model=NS(fc=fc))
    assert "tensor-parallel" in draft_kv._graph_problem(NS(tp_size=2, model=model))
    assert draft_kv._graph_problem(NS(tp_size=1, model=model)) is None
    assert "fc" in draft_kv._graph_problem(NS(tp_size=1, model=NS(model=NS(fc=NS()))))
    # capture_write says why and returns None before touching CUDA
    assert draft_kv.capture_write(NS(tp_size=2, model=model), [1, 2], lambda: None, "test") is None
