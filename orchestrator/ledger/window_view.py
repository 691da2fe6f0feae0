"""A windowed run's progress in event time, as the console shows it: where the source
and the sink's watermark stand, how far behind each node is, which windows are open
and how far, and the records that came too late."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, TypedDict

from django.db.models import Count, Min, Sum

from orchestrator.ledger.segments import late_records
from orchestrator.ledger.windows import SinkWatermark
from orchestrator.models import ResultGroup, Run, Segment
from orchestrator.pipeline.layout import run_dir
from sparkjobs.event_time import US, WindowSpec, iso

OPEN_SHOWN = 12  # open windows listed, oldest first
LATE_SHOWN = 10  # late records listed, from the first quarantine files
LATE_LINE_CHARS = 500  # each shown cut to this


class OpenWindow(TypedDict):
    start: str
    end: str
    keys: int
    records: int
    progress: float  # how far the watermark is through it, 0 to 1


class NodeTime(TypedDict):
    oldest_waiting: str | None  # the event time its oldest waiting data reaches
    lag_s: float  # the source's largest event time minus that; 0 when nothing waits


class WindowsView(TypedDict):
    event_time: str
    window_s: float
    slide_s: float
    lateness_s: float
    # The source's watermark: the smallest of its partitions' largest event times (with
    # one partition, the largest it has read); and each partition's, when it has several.
    source_high: str | None
    partitions: list[str | None]
    watermark: str | None  # windows ending by this are closed and final
    event_lag_s: float | None  # the source's largest event time minus the sink's
    late_records: int
    late_sample: list[str]  # some of the late records, as quarantined
    closed: int
    open: list[OpenWindow]
    nodes: dict[str, NodeTime]


def windows_view(run: Run, spec: WindowSpec, *, sample: bool = True) -> WindowsView:
    """The run's windows now (with ``sample``, the first of its late records)."""
    mark = SinkWatermark.of(run)
    raw_high = (run.source_position or {}).get("high_us")
    source_high = None if raw_high is None else int(raw_high)
    # The rows are (window, group) rows; the closed ones are the run's result table
    # (orchestrator/ledger/results.py).
    open_windows: list[Mapping[str, Any]] = list(
        ResultGroup.objects.filter(run=run, start_us__isnull=False, closed_at__isnull=True)
        .values("start_us", "end_us")
        .annotate(keys=Count("id"), records=Sum("records"))
        .order_by("start_us")[:OPEN_SHOWN]
    )
    watermark = None if mark.high_us is None else mark.high_us - spec.lateness_us
    return WindowsView(
        event_time=spec.field,
        window_s=spec.size_us / US,
        slide_s=spec.slide_us / US,
        lateness_s=spec.lateness_us / US,
        source_high=None if source_high is None else iso(source_high),
        partitions=[
            None if h is None else iso(int(h))
            for h in (run.source_position or {}).get("highs") or []
        ],
        watermark=None if mark.closed_us is None else iso(mark.closed_us),
        event_lag_s=_lag(source_high, mark.high_us),
        late_records=late_records(run.pk),
        late_sample=late_sample(run.pk) if sample else [],
        closed=mark.windows,
        open=[
            OpenWindow(
                start=iso(w["start_us"]),
                end=iso(w["end_us"]),
                keys=int(w["keys"]),
                records=int(w["records"] or 0),
                progress=_progress(watermark, w["start_us"], w["end_us"]),
            )
            for w in open_windows
        ],
        nodes=_node_times(run, source_high),
    )


def late_sample(run_id: int) -> list[str]:
    """The first late records of the quarantine (``quarantine/late/``), each cut to
    ``LATE_LINE_CHARS``: what the run page lists. Reads a few lines, never whole files."""
    folder = run_dir(run_id) / "quarantine" / "late"
    shown: list[str] = []
    for part in sorted(folder.glob("*.jsonl"))[:LATE_SHOWN] if folder.is_dir() else []:
        with part.open(encoding="utf-8", errors="replace") as handle:
            for line in handle:
                shown.append(line.rstrip("\n")[:LATE_LINE_CHARS])
                if len(shown) >= LATE_SHOWN:
                    return shown
    return shown


def _lag(ahead: int | None, behind: int | None) -> float | None:
    if ahead is None or behind is None:
        return None
    return round(max(0, ahead - behind) / US, 3)


def _progress(watermark: int | None, start: int, end: int) -> float:
    if watermark is None:
        return 0.0
    return round(min(1.0, max(0.0, (watermark - start) / (end - start))), 3)


def _node_times(run: Run, source_high: int | None) -> dict[str, NodeTime]:
    """How far behind the source each node is in event time: by the oldest data still
    waiting in its pool (its largest event time), nothing when its pool is empty. A node
    that is idle is caught up, however old the last data it saw."""
    waiting = dict(
        Segment.objects.filter(
            run=run,
            state__in=(Segment.State.QUEUED, Segment.State.CLAIMED),
            high_us__isnull=False,
            marker=False,
        )
        .values("node")
        .annotate(oldest=Min("high_us"))
        .values_list("node", "oldest")
    )
    nodes = {n["name"] for n in run.topology["nodes"]} | set(waiting)
    return {
        node: NodeTime(
            oldest_waiting=None if node not in waiting else iso(int(waiting[node])),
            lag_s=0.0 if node not in waiting else _lag(source_high, int(waiting[node])) or 0.0,
        )
        for node in sorted(nodes)
    }
