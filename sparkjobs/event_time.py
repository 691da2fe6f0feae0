"""Event time, windows and lateness, as plain values: the one definition the source, the
operators' Spark jobs, the sink and the tests share.

Times are integer microseconds since the epoch (UTC), so window arithmetic is exact: a
float of seconds loses microseconds at today's epoch. An event time is a number of
seconds since the epoch (``1700000000.25``, also as a string) or an ISO-8601 text
(``2026-11-26T17:00:00Z``; without an offset it is UTC).

Windows are Spark's: a tumbling window of ``size`` holds ``[start, start + size)`` with
``start`` a multiple of ``size``; a hopping one slides by ``slide``, so each time falls
in ``size / slide`` of them (rounded up). A record's window is *late* when the
watermark its chunk was read under (the largest event time of every earlier chunk, minus
the allowed lateness) has passed the window's end: that window was closed before the
record arrived. Lateness is a property of the record and its chunk only, so it is the
same whatever branch, batch or retry processes it.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation
from typing import Any

US = 1_000_000
MAX_WINDOW_S = 86_400
MIN_WINDOW_S = 1
MAX_WINDOWS_PER_RECORD = 100  # size / slide: bounds the rows one record fans out to
MAX_LATENESS_S = 86_400
_EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)
# Spark's TIMESTAMP range, so both sides refuse the same out-of-range times.
MIN_US = -62_135_596_800 * US
MAX_US = 253_402_300_799 * US


@dataclass(frozen=True)
class WindowSpec:
    field: str
    size_us: int
    slide_us: int
    lateness_us: int

    @classmethod
    def from_params(cls, params: Mapping[str, Any]) -> WindowSpec | None:
        """The aggregate's windows, or None when it aggregates over all time."""
        size = params.get("window_s")
        if size is None:
            return None
        slide = params.get("slide_s") or size
        return cls(
            field=str(params.get("event_time", "event_time")),
            size_us=seconds_us(size),
            slide_us=seconds_us(slide),
            lateness_us=seconds_us(params.get("lateness_s", 0)),
        )

    @property
    def fan_out(self) -> int:
        """How many windows each event time falls in."""
        return -(-self.size_us // self.slide_us)

    def starts(self, t_us: int) -> list[int]:
        """The starts of the windows holding ``t_us``, oldest first."""
        last = t_us - (t_us % self.slide_us)
        starts = [last - k * self.slide_us for k in range(self.fan_out)]
        return sorted(s for s in starts if s + self.size_us > t_us)

    def late(self, start_us: int, high_before_us: int | None) -> bool:
        """Was the window starting at ``start_us`` closed for a chunk read when the
        largest earlier event time was ``high_before_us`` (None: no earlier event)?"""
        return closes(start_us + self.size_us, high_before_us, self.lateness_us)

    def describe(self) -> str:
        """The spec in the pipeline's own words (seconds), for messages."""
        return (
            f"window_s {self.size_us / US:g}, slide_s {self.slide_us / US:g}, "
            f"event_time {self.field}, lateness_s {self.lateness_us / US:g}"
        )

    def to_json(self) -> dict[str, int | str]:
        return {
            "event_time": self.field,
            "window_us": self.size_us,
            "slide_us": self.slide_us,
            "lateness_us": self.lateness_us,
        }


def closes(end_us: int, high_us: int | None, lateness_us: int) -> bool:
    """Has the watermark ``high_us - lateness_us`` reached a window ending at ``end_us``?"""
    return high_us is not None and end_us <= high_us - lateness_us


def seconds_us(value: Any) -> int:
    """Seconds (int, float or text) as whole microseconds, rounded to the nearest."""
    return int((Decimal(str(value)) * US).to_integral_value())


def parse_us(value: Any) -> int | None:
    """An event time as microseconds since the epoch, or None when it is missing or not
    a time: what a record's event-time field means (the Spark side is
    ``sparkjobs.windows.event_us``)."""
    if value is None or isinstance(value, bool):
        return None
    if isinstance(value, int | float | Decimal):
        return _in_range(_number_us(str(value)))
    if not isinstance(value, str):
        return None
    text = value.strip()
    number = _number_us(text)
    if number is not None:
        return _in_range(number)
    try:
        moment = dt.datetime.fromisoformat(text.replace("Z", "+00:00").replace("z", "+00:00"))
    except ValueError:
        return None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=dt.UTC)
    return _in_range((moment - _EPOCH) // dt.timedelta(microseconds=1))


def _number_us(text: str) -> int | None:
    if "_" in text:
        return None  # Python's Decimal reads "1_000"; Spark's cast does not
    try:
        number = Decimal(text)
    except InvalidOperation:
        return None
    if not number.is_finite():
        return None
    # Down to the microsecond, as floor() in the Spark job.
    return int((number * US).to_integral_value(rounding="ROUND_FLOOR"))


def _in_range(t_us: int | None) -> int | None:
    return t_us if t_us is not None and MIN_US <= t_us <= MAX_US else None


def iso(t_us: int) -> str:
    """A time in microseconds as ISO-8601 UTC text."""
    moment = _EPOCH + dt.timedelta(microseconds=t_us)
    return moment.isoformat().replace("+00:00", "Z")
