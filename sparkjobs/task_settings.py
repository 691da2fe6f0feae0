"""The sizes of an operator batch's Spark tasks, from the environment: MB from 0 to
1024, anything else refused with the setting's name.

No pyspark here: ``make run`` checks them before it starts anything
(``orchestrator/services/runconsole.py``), so a wrong value is refused at once instead
of failing the first batch that reads it.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping

# The most MB a setting of an operator batch's task sizes may give.
MAX_SETTING_MB = 1024
ONE_TASK = "BPCONSOLE_SPARK_ONE_TASK_MB"
TASK = "BPCONSOLE_SPARK_TASK_MB"


def one_task_bytes(environ: Mapping[str, str] = os.environ) -> int:
    """A batch of at most this many bytes runs as one task (session.py ``in_one_task``)."""
    return mb_setting(ONE_TASK, 2, environ)


def task_bytes(environ: Mapping[str, str] = os.environ) -> int:
    """The least a task of a larger batch reads (session.py ``operator_session``)."""
    return mb_setting(TASK, 8, environ)


def check(environ: Mapping[str, str]) -> None:
    """Every setting above read once: a ValueError naming the first that is wrong."""
    one_task_bytes(environ)
    task_bytes(environ)


def mb_setting(name: str, default: float, environ: Mapping[str, str] = os.environ) -> int:
    """The setting ``name``, a number of MB from 0 to 1024 (``default`` when unset), in
    bytes. Anything else is refused with the setting's name, not a float()'s message."""
    raw = environ.get(name)
    if raw is None:
        return int(default * 2**20)
    try:
        mb = float(raw) if len(raw) <= 20 else math.nan
    except ValueError:
        mb = math.nan
    if not 0 <= mb <= MAX_SETTING_MB:  # nan compares false
        shown = f"{raw[:20]!r}{'...' if len(raw) > 20 else ''}"
        raise ValueError(f"{name}={shown}: a number of MB from 0 to {MAX_SETTING_MB}")
    return int(mb * 2**20)
