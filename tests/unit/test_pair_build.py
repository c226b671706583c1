"""build_pair end to end at toy size on CPU: every output the GPU run relies on is there."""

import json
import sysconfig
from pathlib import Path

import pytest

pytest.importorskip("torch", reason="torch not installed (build_pair trains with it)")
pytest.importorskip("tokenizers", reason="tokenizers not installed (build_pair's tokenizer)")
pytest.importorskip("safetensors", reason="safetensors not installed (build_pair's export)")


from benchmarks.dynspec_bench.prompts import load_prompts  # noqa: E402
from benchmarks.models.build_pair import main, parse_args  # noqa: E402

STDLIB = Path(sysconfig.get_paths()["stdlib"])
TOY = ["--roots", str(STDLIB / "json"), str(STDLIB / "email"), "--corpus-mb", "0.4", "--heldout-frac", "0.1",
       "--heldout-mb", "0.2", "--tokenizer-sample-mb", "0.2", "--vocab", "300", "--hidden", "64", "--layers", "3",
       "--heads", "2", "--kv-heads", "1", "--head-dim", "32", "--intermediate", "128", "--seq", "64", "--batch", "8",
       "--target-seconds", "0", "--target-steps", "40", "--draft-seconds", "0", "--draft-steps", "20",
       "--draft-batch", "8", "--aux-layers", "0,1,2", "--pad-layers", "5", "--pad-intermediate", "192",
       "--prompt-len", "32", "--cont-len", "16", "--n-prompts", "12", "--eval-windows", "4",
       "--greedy-prompts", "6", "--export-dtype", "float32"]


def test_toy_build_writes_a_complete_pair(tmp_path):
    out = tmp_path / "pair"
    assert main(TOY + ["--out", str(out)]) == 0
    man = json.loads((out / "pair.json").read_text())
    assert man["done"] is True
    assert set(man["phase_seconds"]) == {"corpus", "tokenizer", "encode", "train_target", "save_target",
                                         "train_draft", "save_draft", "save_padded", "measure", "total"}
    assert man["corpus"]["heldout_files"] >= 1 and man["tokens"]["train"] > 10_000
    assert man["target_training"]["steps"] == 40 and man["draft_training"]["steps"] == 20
    assert man["target_training"]["heldout_loss"] < 5.7  # ln(300) = 5.70: it learnt something
    assert man["target"]["padded"] is False and man["target_padded"]["padded"] is True
    assert man["target_padded"]["shape"]["layers"] == 5 and man["target_padded"]["params"] > man["target"]["params"]
    rep = man["repeated_4gram_share"]
    assert 0.0 <= rep["greedy_target"] <= 1.0 and 0.0 <= rep["heldout_text"] <= 1.0
    assert 1.0 <= man["offline_greedy_accept_topk1_2steps"]["accept_length"] <= 3.0
    prompts = load_prompts(out / "prompts.json")  # the harness's own reader
    assert len(prompts) == 12 and all(len(p) == 32 and max(p) < 300 for p in prompts)
    for d in ("target", "target-padded", "draft"):
        assert (out / d / "config.json").exists() and (out / d / "model.safetensors").exists()
    assert not list(out.rglob("*.partial"))  # weights land atomically (servers wait for them)
    # The padded target is out before the draft trains, so its server can start meanwhile.
    order = list(man["phase_seconds"])
    assert order.index("save_padded") < order.index("train_draft")
    assert (out / "tokenizer.json").exists()

    # Same seed, same everything that does not depend on the clock.
    out2 = tmp_path / "again"
    main(TOY + ["--out", str(out2)])
    assert (out2 / "prompts.json").read_text() == (out / "prompts.json").read_text()
    assert (out2 / "target" / "model.safetensors").read_bytes() == (out / "target" / "model.safetensors").read_bytes()
    assert (out2 / "draft" / "model.safetensors").read_bytes() == (out / "draft" / "model.safetensors").read_bytes()


def test_cli_rejects_aux_layers_outside_the_target():
    with pytest.raises(SystemExit):
        parse_args(["--layers", "4", "--aux-layers", "1,5"])
    assert parse_args(["--target-seconds", "0", "--target-steps", "3"]).target_seconds is None
