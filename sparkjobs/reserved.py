"""The names of the columns the Spark jobs add beside a record's fields: a field a
pipeline names may not be called so, or a job would read its own column for the
record's (or refuse an ambiguous name and fail every batch). Spark resolves names
without regard to case, so neither may a name that differs only in case.

Pure Python, for the console's checks; tests/sparkjobs/test_reserved.py holds it to the
constants of the jobs themselves.
"""

from __future__ import annotations

import re

RESERVED = frozenset(
    {
        # sparkjobs/records.py
        "_segment",
        "_raw",
        "_malformed",
        "_corrupt_record",
        "_r",
        # sparkjobs/grouped.py
        "_group",
        "_distinct",
        "_line",
        "_kept",
        "_dropped",
        "_unread",
        "_unlined",
        "_records",
        # sparkjobs/windows.py, sparkjobs/plain_job.py
        "_event_us",
        "_window",
        "_late",
        "_t",
        # sparkjobs/long_sums.py
        "_exact",
    }
)
# A group field's, a measure's (and its parts'), a measure's event time's and a number's
# unscaled value's columns while they are aggregated (sparkjobs/grouped.py,
# measure_parts.py, plain_job.py).
_MEASURE_COLUMN = re.compile(r"_[gmtu]\d+(_[a-z]+)?")


def reserved(name: str) -> str | None:
    """Why ``name`` may not be a field's, or None."""
    lowered = name.lower()
    if lowered in RESERVED or _MEASURE_COLUMN.fullmatch(lowered):
        return f"{name!r} is a name the console's Spark jobs use for a column of their own"
    return None
