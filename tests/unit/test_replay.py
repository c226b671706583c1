"""Replay: profiles, the closed-loop projection, and its check against a measured run."""

import json
from pathlib import Path

import pytest

from sglang_dynspec.cli import main
from sglang_dynspec.errors import ConfigError
from sglang_dynspec.replay import (Phase, check_against, load_profile, parse_profile, profile_from_sweep,
                                   simulate)

RESULTS = Path(__file__).resolve().parents[2] / "benchmarks" / "results"


def toy(acc=2.5):
    # spec pays at bs 1 (2.5 tokens in 8 ms vs 1 in 5 ms), loses at bs 64
    return parse_profile({"accept_length": acc, "step_seconds": {
        "plain": {"1": 0.005, "64": 0.010},
        "spec": {"1": 0.008, "64": 0.040},
        "offstep": {"1": 0.005, "64": 0.010}}})


def test_interpolation():
    p = toy()
    assert p.time("plain", 1) == pytest.approx(0.005)
    assert p.time("plain", 32) == pytest.approx(0.005 + 0.005 * 31 / 63)
    assert p.time("spec", 128) > p.time("spec", 64)  # extrapolates


def test_static_modes_match_hand_arithmetic():
    p = toy()
    off = simulate(p, "", [Phase(1, 10.0)], static="plain")
    on = simulate(p, "", [Phase(1, 10.0)], static="spec", output_len=125)  # 50 full steps of 2.5
    assert off.tok_per_s == pytest.approx(200, rel=0.01)
    assert on.tok_per_s == pytest.approx(2.5 / 0.008, rel=0.01)


def test_goodput_learns_the_better_mode_per_load():
    p = toy()
    low = simulate(p, "goodput", [Phase(1, 20.0)])
    high = simulate(p, "goodput", [Phase(64, 20.0)])
    assert low.steps_on > 0.9 * (low.steps_on + low.steps_off)
    assert high.steps_off > 0.9 * (high.steps_on + high.steps_off)
    best_high = max(simulate(p, "", [Phase(64, 20.0)], static=s).tok_per_s for s in ("plain", "spec"))
    assert high.tok_per_s >= 0.95 * best_high


def test_builtin_profiles_load():
    for name in ("h200-trained-pair", "h200-dummy-0512", "h200-pair-0512"):
        prof = load_profile(name)
        assert prof.accept_length >= 1.0 and set(prof.points) == {"plain", "spec", "offstep"}


@pytest.mark.parametrize("raw, needle", [
    ({"accept_length": 0.5, "step_seconds": {}}, "profile.accept_length"),
    ({"accept_length": 2, "step_seconds": {"plain": {"1": 1}}}, "profile.step_seconds.spec"),
    ({"accept_length": 2, "step_seconds": {"plain": {"x": 1}, "spec": {"1": 1}, "offstep": {"1": 1}}}, "is not an integer"),
    ({"accept_length": 2, "step_seconds": {"plain": {"1": -1}, "spec": {"1": 1}, "offstep": {"1": 1}}}, "profile.step_seconds.plain.1"),
])
def test_bad_profiles(raw, needle):
    with pytest.raises(ConfigError) as e:
        parse_profile(raw)
    assert needle in str(e.value)


def test_projection_of_measured_sweep_is_close():
    result = json.loads((RESULTS / "sweep-0512-policies.json").read_text())
    prof = profile_from_sweep(result)
    rows = check_against(result, prof, {"off": "plain", "on": "spec", "dynspec:never": "never",
                                        "dynspec:goodput": "goodput"})
    errs = [abs(r["error"]) for r in rows]
    assert len(rows) == 16
    assert sum(errs) / len(errs) < 0.08  # measured 3.0 % when written


def test_cli_replay_profile(capsys):
    assert main(["replay", "--profile", "h200-trained-pair", "-C", "1,64", "--seconds", "3", "--cycles", "1", "--phase-seconds", "2"]) == 0
    out = capsys.readouterr().out
    assert "dynspec:goodput" in out and "phase trace" in out


def test_cli_replay_bad_args(capsys):
    assert main(["replay", "--policy", "threshold", "--policy-args", "{bad"]) == 2
    assert main(["replay", "--profile", "/nonexistent.json"]) == 2
    assert "not a built-in" in capsys.readouterr().err


def test_cli_replay_refuses_concurrency_below_one(capsys):
    # was a ZeroDivisionError traceback
    with pytest.raises(SystemExit) as e:
        main(["replay", "--profile", "h200-trained-pair", "-C", "1,0"])
    assert e.value.code == 2 and "concurrency levels must be >= 1" in capsys.readouterr().err
