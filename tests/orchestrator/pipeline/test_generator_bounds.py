"""Bounded generation: a generator spec is checked field by field, against bounds and the
volume limit BPCONSOLE_GENERATOR_MAX_MB, before anything is written (no service needed)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from orchestrator.pipeline.generator import GeneratorError, GeneratorSpec
from orchestrator.services.launcher import PROJECT_ROOT


def test_the_volume_limit_is_4096_mb_by_default() -> None:
    # Given the settings as shipped (no BPCONSOLE_GENERATOR_MAX_MB in the environment)
    from django.conf import settings

    assert settings.BPCONSOLE_GENERATOR_MAX_MB == 4096
    # When a spec asks for exactly the limit, then for more
    at_limit = GeneratorSpec.parse("seed=7,volume_mb=4096")
    with pytest.raises(GeneratorError) as refused:
        GeneratorSpec.parse("seed=7,volume_mb=100000")
    # Then the first is admitted and the second refused naming field, value and limit
    assert at_limit.volume_mb == 4096
    message = str(refused.value)
    assert "volume_mb" in message and "100000" in message and "4096" in message
    assert "BPCONSOLE_GENERATOR_MAX_MB" in message


def test_the_volume_limit_follows_the_setting(settings) -> None:
    # Given an operator-lowered limit of 10 MB
    settings.BPCONSOLE_GENERATOR_MAX_MB = 10
    # When specs ask for 10 MB, 10.5 MB and, as a mapping, 11 MB
    assert GeneratorSpec.parse("volume_mb=10").volume_mb == 10
    # Then everything above the setting is refused, whatever form the spec takes
    with pytest.raises(GeneratorError, match=r"volume_mb: 10\.5 MB is over the limit of 10 MB"):
        GeneratorSpec.parse("volume_mb=10.5")
    with pytest.raises(GeneratorError, match="over the limit of 10 MB"):
        GeneratorSpec.parse({"volume_mb": 11})


@pytest.mark.parametrize(
    ("spec", "words"),
    [
        ("volume_mb=0", ["volume_mb", "not positive"]),
        ("volume_mb=-5", ["volume_mb", "not positive"]),
        ("volume_mb=nan", ["volume_mb", "not a finite number"]),
        ("volume_mb=inf", ["volume_mb", "not a finite number"]),
        ("volume_mb=1e400", ["volume_mb", "not a finite number"]),
        ("seed=-1", ["seed", "-1", "[0, 4294967295]"]),
        ("seed=4294967296", ["seed", "out of range"]),
        ("seed=7.5", ["seed", "not a whole number"]),
        ("seed=x", ["seed", "not a number"]),
        ("keys_per_branch=0", ["keys_per_branch", "[1, 10000]"]),
        ("keys_per_branch=10001", ["keys_per_branch", "[1, 10000]"]),
        ("users=0", ["users", "[1, 1000000]"]),
        ("users=1000001", ["users", "[1, 1000000]"]),
        ("malformed_every=-1", ["malformed_every", "out of range"]),
        ("skew_mean_s=0", ["skew_mean_s", "[0.1, 86400] s"]),
        ("skew_mean_s=0.001", ["skew_mean_s", "[0.1, 86400] s"]),
        ("skew_mean_s=1e9", ["skew_mean_s", "[0.1, 86400] s"]),
        ("skew_mean_s=inf", ["skew_mean_s", "not a finite number"]),
        ("dominance=1", ["dominance", "[0, 1)"]),
        ("dominance=-0.1", ["dominance", "[0, 1)"]),
        ("dominance=nan", ["dominance", "not a finite number"]),
        ("colour=blue", ["unknown generator field", "colour"]),
        ("seed=1,seed=2", ["seed", "given twice"]),
        ("seed", ["use name=value"]),
        ("seed=" + "1" * 100, ["seed", "the limit is 64"]),
        ("seed=1," + "x" * 600, ["characters long", "the limit is 512"]),
        ({"seed": True}, ["seed", "not a number"]),
        ({"seed": [1]}, ["seed", "not a number"]),
        ({"users": 2.5}, ["users", "not a whole number"]),
    ],
)
def test_a_field_out_of_its_bounds_is_refused_naming_it(
    spec: str | dict[str, object], words: list[str]
) -> None:
    # Given a spec with one bad field; when it is parsed; then the message names it
    with pytest.raises(GeneratorError) as refused:
        GeneratorSpec.parse(spec)
    for word in words:
        assert word in str(refused.value), (spec, str(refused.value))


def test_values_at_their_bounds_are_admitted() -> None:
    # Given every field at an end of its range
    low = GeneratorSpec.parse(
        "seed=0,volume_mb=0.001,dominance=0,skew_mean_s=0.1,keys_per_branch=1,users=1,"
        "malformed_every=0"
    )
    high = GeneratorSpec.parse(
        {
            "seed": 4294967295,
            "volume_mb": 4096,
            "dominance": 0.999,
            "skew_mean_s": 86400,
            "keys_per_branch": 10000,
            "users": 1000000,
            "malformed_every": 1000000000,
        }
    )
    # Then both parse, to the types of the fields (an int written as 1e3 is an int)
    assert low.seed == 0 and low.skew_mean_s == 0.1
    assert high.users == 1_000_000 and isinstance(high.seed, int)
    assert GeneratorSpec.parse("seed=1e3").seed == 1000
    assert GeneratorSpec.parse(GeneratorSpec(seed=9).to_json()) == GeneratorSpec(seed=9)


@pytest.mark.parametrize(("raw", "ok"), [("12", True), ("0", False), ("lots", False)])
def test_the_setting_is_read_from_the_environment(raw: str, ok: bool) -> None:
    # Given BPCONSOLE_GENERATOR_MAX_MB in the environment of a fresh process
    env = {
        **os.environ,
        "BPCONSOLE_GENERATOR_MAX_MB": raw,
        "DJANGO_SETTINGS_MODULE": "webapp.settings.test",
    }
    code = "from django.conf import settings; print(settings.BPCONSOLE_GENERATOR_MAX_MB)"
    # When the settings load
    done = subprocess.run(
        [sys.executable, "-c", code],
        cwd=PROJECT_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    # Then a whole number of at least 1 is the limit; anything else stops the start-up
    if ok:
        assert done.returncode == 0, done.stderr
        assert done.stdout.strip() == raw
    else:
        assert done.returncode != 0
        assert "BPCONSOLE_GENERATOR_MAX_MB" in done.stderr
