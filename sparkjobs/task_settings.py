"""The sizes of an operator batch's Spark tasks, from the environment: MB from 0 to
1024, anything else refused with the setting's name.

No pyspark here: ``make run`` checks them before it starts anything
(``orchestrator/services/runconsole.py``), so a wrong value is refused at once instead
of failing the first batch that reads it.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping, Sequence

# The most MB a setting of an operator batch's task sizes may give.
MAX_SETTING_MB = 1024
ONE_TASK = "BPCONSOLE_SPARK_ONE_TASK_MB"
TASK = "BPCONSOLE_SPARK_TASK_MB"


def one_task_bytes(environ: Mapping[str, str] = os.environ) -> int:
    """A batch of at most this many bytes runs as one task (session.py ``in_one_task``)."""
    return mb_setting(ONE_TASK, 2, environ)


def task_bytes(environ: Mapping[str, str] = os.environ) -> int:
    """The most a task of a larger batch reads, 0 for no bound (session.py
    ``operator_session``): Spark's own default bound."""
    return mb_setting(TASK, 128, environ)


def even_split_bytes(sizes: Sequence[int], cores: int, most: int, open_cost: int) -> int:
    """``spark.sql.files.maxPartitionBytes`` that cuts a batch of files of ``sizes``
    into at most ``cores`` tasks, or a multiple of the cores so that a task reads at
    most about ``most`` bytes (0: no bound), each closed past an equal share.

    Spark (with ``spark.sql.files.minPartitionNum`` 1) splits a file larger than the
    bound into pieces of the bound, then packs files and pieces, largest first, into
    tasks, counting ``open_cost`` (``spark.sql.files.openCostInBytes``) for each, and
    closes a task when the next would take it past the bound. A bound of the share plus
    the largest file closes each task past the share, so there are at most as many
    tasks as shares; a file larger than the share is cut at the share instead."""
    total = sum(sizes)
    tasks = cores * (max(1, math.ceil(total / (cores * most))) if most else 1)
    share = max(1, math.ceil((total + open_cost * len(sizes)) / tasks))
    largest = max(sizes, default=0) + open_cost
    return share + largest if largest <= share else share


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
