"""The settings of an operator batch's task sizes: MB from 0 to 1024, anything else
refused with the setting's name."""

from __future__ import annotations

import pytest

from sparkjobs.task_settings import mb_setting

NAME = "BPCONSOLE_SPARK_ONE_TASK_MB"


def test_unset_is_the_default_and_a_number_of_mb_is_read_in_bytes(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv(NAME, raising=False)
    assert mb_setting(NAME, 4) == 4 * 2**20
    monkeypatch.setenv(NAME, "0.5")
    assert mb_setting(NAME, 4) == 2**19
    monkeypatch.setenv(NAME, "0")
    assert mb_setting(NAME, 4) == 0


@pytest.mark.parametrize(
    "raw", ["", "abc", "-1", "1025", "nan", "inf", "1e308", "4 MB", "9" * 5000]
)
def test_anything_else_is_refused_with_the_setting_s_name(
    monkeypatch: pytest.MonkeyPatch, raw: str
) -> None:
    monkeypatch.setenv(NAME, raw)
    with pytest.raises(ValueError, match=f"^{NAME}=.*: a number of MB from 0 to 1024$") as error:
        mb_setting(NAME, 4)
    assert len(str(error.value)) < 120, "a long value is shown cut"
