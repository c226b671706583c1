"""Pure parts of the phase-trace evidence: output-length draws, trace plans, the per-phase maths."""

import math

import pytest


from benchmarks.dynspec_bench.phase_summary import (  # noqa: E402
    best_single_static, geomean, phase_kind, summarize_phases,
)

DYN = "dynspec:goodput"


def _modes(table: dict[str, dict[str, float | None]], field: str = "tpot_p50_ms") -> dict:
    """{mode: {phase: value}} -> a result's `modes` with only trace phases."""
    return {m: {"trace": {"phases": {p: {field: v, "ttft_p50_ms": 10.0} for p, v in row.items()}}}
            for m, row in table.items()}


def test_geomean_and_phase_kind():
    assert geomean([1.0, 4.0]) == pytest.approx(2.0)
    assert geomean([2.0, 8.0, 4.0]) == pytest.approx(4.0)
    assert geomean([]) is None
    assert geomean([1.0, 0.0]) is None and geomean([1.0, None]) is None
    assert phase_kind("low0") == "low" and phase_kind("high12") == "high" and phase_kind("warm") == "warm"


def test_per_phase_ratio_uses_the_better_static_mode_of_that_phase():
    s = summarize_phases(_modes({
        "off": {"low0": 4.0, "high0": 5.0, "low1": 4.0, "high1": 5.0},
        "on": {"low0": 2.0, "high0": 12.0, "low1": 2.0, "high1": 12.0},
        DYN: {"low0": 2.2, "high0": 5.5, "low1": 2.0, "high1": 4.0},
    }))
    assert s["phases"] == ["low0", "high0", "low1", "high1"]
    assert s["static_modes"] == ["off", "on"] and s["dynspec_modes"] == [DYN]
    pp = s["per_phase"]
    assert pp["low0"]["tpot_p50_better_static"] == "on" and pp["high0"]["tpot_p50_better_static"] == "off"
    key = "tpot_p50_dynspec_over_better_static_lower_is_better"
    assert pp["low0"][DYN][key] == pytest.approx(1.1)
    assert pp["high0"][DYN][key] == pytest.approx(1.1)
    assert pp["low1"][DYN][key] == pytest.approx(1.0) and pp["high1"][DYN][key] == pytest.approx(0.8)
    d = s[DYN]
    # off: geomean sqrt(20) = 4.47 < on: sqrt(24) = 4.90 -> off is the best single static mode.
    assert d["tpot_p50_best_single_static"] == "off"
    assert d["tpot_p50_geomean_ms"]["off"] == pytest.approx(math.sqrt(20), abs=1e-4)
    assert d["tpot_p50_geomean_ms"]["on"] == pytest.approx(math.sqrt(24), abs=1e-4)
    ratios = [4 / 2.2, 5 / 5.5, 4 / 2.0, 5 / 4.0]
    assert d["tpot_p50_best_single_static_over_dynspec_geomean_higher_is_better"] == pytest.approx(
        math.prod(ratios) ** 0.25, abs=1e-4)
    by_kind = d["tpot_p50_best_single_static_over_dynspec_geomean_by_phase_kind_higher_is_better"]
    assert by_kind["low"] == pytest.approx(math.sqrt(4 / 2.2 * 4 / 2.0), abs=1e-4)
    assert by_kind["high"] == pytest.approx(math.sqrt(5 / 5.5 * 5 / 4.0), abs=1e-4)
    assert d["tpot_p50_dynspec_over_better_static_geomean_lower_is_better"] == pytest.approx(
        (1.1 * 1.1 * 1.0 * 0.8) ** 0.25, abs=1e-4)
    # TTFT is summarised the same way (all 10 ms here: every ratio 1).
    assert d["ttft_p50_best_single_static_over_dynspec_geomean_higher_is_better"] == pytest.approx(1.0)


def test_best_single_static_is_by_geomean_not_by_phases_won():
    # off wins 3 of 4 phases but loses one by 10x: on has the lower geomean over the trace.
    vals = {"off": {"a": 4.0, "b": 4.0, "c": 4.0, "d": 40.0}, "on": {"a": 5.0, "b": 5.0, "c": 5.0, "d": 6.0}}
    mode, gms = best_single_static(vals, ["off", "on"], ["a", "b", "c", "d"])
    assert mode == "on" and gms["off"] > gms["on"]
    s = summarize_phases(_modes({**vals, DYN: {"a": 4.0, "b": 4.0, "c": 4.0, "d": 6.0}}))
    assert s[DYN]["tpot_p50_best_single_static"] == "on"
    assert s[DYN]["tpot_p50_best_single_static_over_dynspec_geomean_higher_is_better"] == pytest.approx(
        (5 / 4) ** 0.75, abs=1e-4)


def test_phase_without_a_value_is_left_out_of_the_geomeans():
    s = summarize_phases(_modes({
        "off": {"low0": 4.0, "high0": 5.0}, "on": {"low0": 2.0, "high0": 12.0}, DYN: {"low0": 2.0, "high0": None},
    }))
    assert s["per_phase"]["high0"][DYN]["tpot_p50_dynspec_over_better_static_lower_is_better"] is None
    d = s[DYN]
    assert d["tpot_p50_phases_used"] == ["low0"]
    assert d["tpot_p50_best_single_static"] == "on"  # chosen over the phases used only
    assert d["tpot_p50_best_single_static_over_dynspec_geomean_higher_is_better"] == pytest.approx(1.0)


def test_row4_phase_validity_from_the_static_modes_lead():
    # low: a speculating static mode ahead by >= 1.2x; high: `off` ahead by >= 1.3x (TPOT p50)
    s = summarize_phases(_modes({
        "off": {"low0": 3.6, "high0": 11.6, "low1": 4.0, "high1": 10.0, "low2": 3.0},
        "on": {"low0": 2.7, "high0": 23.4, "low1": 4.8, "high1": 12.0, "low2": 2.6},
        DYN: {"low0": 3.7, "high0": 8.2, "low1": 3.3, "high1": 9.0, "low2": 2.6},
    }))
    pp = s["per_phase"]
    assert pp["low0"]["tpot_p50_static_lead"] == pytest.approx(3.6 / 2.7, abs=1e-4)
    assert [pp[p]["row4_valid"] for p in s["phases"]] == [True, True, False, False, False]
    # low1: `off` is the better one; high1: `off` ahead by 1.2x only; low2: `on` ahead by 1.15x only
    d = s[DYN]
    assert d["row4_valid_phases"] == ["low0", "high0"]
    assert d["tpot_p50_dynspec_over_better_static_max_in_valid_phases"] == pytest.approx(3.7 / 2.7, abs=1e-4)
    # any variant of `off` is plain decode
    s3 = summarize_phases(_modes({"off@nooverlap": {"high0": 13.0}, "on": {"high0": 26.0}, DYN: {"high0": 13.0}}))
    assert s3["per_phase"]["high0"]["row4_valid"] is True and s3[DYN]["row4_valid_phases"] == ["high0"]
    # no `off` among the static modes: no row-4 judgement at all
    s2 = summarize_phases(_modes({"on": {"low0": 2.0}, "on@topk4": {"low0": 3.0}, DYN: {"low0": 2.0}}))
    assert "row4_valid" not in s2["per_phase"]["low0"] and "row4_valid_phases" not in s2[DYN]


def test_no_summary_without_static_and_dynspec_traces():
    assert summarize_phases(_modes({"off": {"low0": 1.0}, "on": {"low0": 2.0}})) is None
    assert summarize_phases({"off": {"1": {"tpot_p50_ms": 1.0}}, DYN: {"1": {"tpot_p50_ms": 1.0}}}) is None


def test_output_lengths_seeded_inclusive_and_validated():
    pytest.importorskip("aiohttp")  # loadgen imports it
    from benchmarks.dynspec_bench.loadgen import output_lengths

    a = output_lengths(400, 32, 512, seed=7)
    assert a == output_lengths(400, 32, 512, seed=7) and a != output_lengths(400, 32, 512, seed=8)
    assert min(a) >= 32 and max(a) <= 512 and len(set(a)) > 100
    assert set(output_lengths(200, 1, 3, seed=0)) == {1, 2, 3}  # both ends included
    assert output_lengths(5, 9, 9, seed=1) == [9] * 5
    with pytest.raises(ValueError, match="lo <= hi"):
        output_lengths(3, 10, 5, seed=0)
    with pytest.raises(ValueError, match="lo <= hi"):
        output_lengths(3, 0, 5, seed=0)


def test_trace_plan_shrinks_phases_to_fit_or_gives_up():
    pytest.importorskip("aiohttp")
    from benchmarks.dynspec_bench.sweep import TracePlan

    plan = TracePlan.parse("2,25,8,3", overhead_s=10.0)
    assert plan.min_phase_s == 5.0 and plan.seconds_per_mode(8.0) == 58.0
    assert plan.fit_phase_s(3 * 58.0 + 1, 3) == 8.0  # enough time: the requested phases
    assert plan.fit_phase_s(150.0, 3) == pytest.approx((50 - 10) / 6, abs=1e-3)  # shortened
    assert plan.fit_phase_s(100.0, 3) is None  # (33 - 10) / 6 < 5 s: skip rather than a useless trace
    arrivals, labels = plan.build(6.0, seed=0)
    assert list(dict.fromkeys(labels)) == ["low0", "high0", "low1", "high1", "low2", "high2"]
    assert max(arrivals) < 36.0
    assert TracePlan.parse("2,25,1,3").min_phase_s == 1.0  # short test traces need no --min
    with pytest.raises(ValueError, match="low_rate,high_rate"):
        TracePlan.parse("2,25,8")
    with pytest.raises(ValueError, match="min_phase_s"):
        TracePlan.parse("2,25,4,3", min_phase_s=6.0)


def test_trace_plan_own_temperature_and_lengths_are_checked():
    pytest.importorskip("aiohttp")
    from benchmarks.dynspec_bench.sweep import TracePlan

    plan = TracePlan.parse("2,50,10,3", temperature=0, output_len_range=("32", "256"))
    assert plan.temperature == 0 and plan.output_len_range == (32, 256) and plan.phase_s == 10.0
    assert TracePlan.parse("2,50,10,3").temperature is None  # default: the run's own
    with pytest.raises(ValueError, match="temperature must be a number >= 0"):
        TracePlan.parse("2,50,10,3", temperature=-0.5)
    with pytest.raises(ValueError, match="temperature"):
        TracePlan(1, 2, 1, 1, min_phase_s=1, temperature=float("nan"))
    for bad in ((256, 32), (0, 5)):
        with pytest.raises(ValueError, match="output_len_range: need 1 <= lo <= hi"):
            TracePlan.parse("2,50,10,3", output_len_range=bad)
