"""The policy declaration: defaults from the specs, every range and ordering enforced."""

from __future__ import annotations

import dataclasses
import math

import pytest

from balancer.policy import KB, MB, PARAMETERS, PARAMETERS_BY_NAME, Policy, PolicyError, validate


def test_dataclass_fields_follow_the_declaration() -> None:
    fields = {f.name: f.default for f in dataclasses.fields(Policy)}
    assert fields == {p.name: p.default for p in PARAMETERS}


def test_spec_defaults() -> None:
    policy = Policy()
    assert (policy.high_water, policy.low_water, policy.duty_ratio) == (0.7, 0.2, 0.5)
    assert (policy.alpha, policy.beta, policy.bp_threshold) == (0.3, 0.5, 0.8)
    assert policy.overload_bytes == 50 * MB
    assert policy.underload_bytes == 500 * KB
    assert (policy.window_initial, policy.window_min, policy.window_max) == (4, 1, 64)


@pytest.mark.parametrize(
    ("values", "problem"),
    [
        ({"nonsense": 1}, "nonsense: unknown policy parameter"),
        ({"alpha": "high"}, "alpha: expected a number, got 'high'"),
        ({"alpha": True}, "alpha: expected a number, got True"),
        ({"tick_ms": 10.5}, "tick_ms: expected a whole number, got 10.5"),
        ({"beta": math.inf}, "beta: inf is not a finite number"),
        ({"alpha": 0.0}, "alpha: 0 is outside (0, 1)"),
        ({"high_water": 0.95}, "high_water: 0.95 is outside [0.6, 0.9]"),
        ({"min_share": 0.5}, "min_share: 0.5 is outside [0, 0.5)"),
        ({"routing": "random"}, "routing: 'random' is not one of static, water_level, measured"),
        ({"scale_out": "always"}, "scale_out: 'always' is not one of flags, measured, off"),
        ({"scale_out_horizon_s": 0.5}, "scale_out_horizon_s: 0.5 is outside [1, 3600]"),
        ({"scale_out_ticks": 0}, "scale_out_ticks: 0 is outside [1, 100]"),
        ({"scale_out_ticks": 2.5}, "scale_out_ticks: expected a whole number, got 2.5"),
        ({"scale_in_busy": 0.0}, "scale_in_busy: 0 is outside (0, 1)"),
        ({"scale_in_busy": 1.0}, "scale_in_busy: 1 is outside (0, 1)"),
        ({"scale_in_after_s": 4.9}, "scale_in_after_s: 4.9 is outside [5, 3600]"),
        ({"scale_in_after_s": 3601}, "scale_in_after_s: 3601 is outside [5, 3600]"),
    ],
)
def test_each_bad_value_is_named(values: dict[str, object], problem: str) -> None:
    assert problem in validate(values)


def test_orderings_between_parameters() -> None:
    base = Policy().to_dict()
    assert validate({**base, "high_water": 0.6, "low_water": 0.4}) == []
    assert any(
        "recovery threshold must be below" in p
        for p in validate({**base, "recovery_threshold": 0.8})
    )
    assert any(
        "underload must be below overload" in p
        for p in validate({**base, "overload_mb": 0.1, "underload_kb": 500})
    )
    assert any("rate floor" in p for p in validate({**base, "rate_floor": 0.3}))
    assert validate({**base, "rate_floor": 0.2}) == []  # equal is allowed
    assert any("window_initial" in p for p in validate({**base, "window_initial": 100}))


def test_from_mapping_raises_with_every_problem_and_replace_validates() -> None:
    with pytest.raises(PolicyError) as err:
        Policy.from_mapping({"alpha": 2, "beta": -1})
    assert len(err.value.errors) == 2
    policy = Policy.from_mapping({"tick_ms": 250.0})
    assert policy.tick_ms == 250
    assert isinstance(policy.tick_ms, int)
    assert policy.replace(alpha=0.5).alpha == 0.5
    with pytest.raises(PolicyError):
        policy.replace(alpha=5)


def test_the_scale_in_window_defaults_to_a_minute_under_a_quarter_busy() -> None:
    policy = Policy()
    assert (policy.scale_in_busy, policy.scale_in_after_s) == (0.25, 60.0)
    assert validate({"scale_in_busy": 0.99, "scale_in_after_s": 5}) == []
    assert validate({"scale_in_after_s": 3600}) == []


def test_range_text_reads_like_the_spec() -> None:
    assert PARAMETERS_BY_NAME["high_water"].range_text() == "[0.6, 0.9]"
    assert PARAMETERS_BY_NAME["bp_window_s"].range_text() == "(0, inf]"
    assert PARAMETERS_BY_NAME["throttling"].range_text().startswith("one of none")
