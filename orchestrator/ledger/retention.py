"""Retention: what a run no longer needs is deleted, so a run that goes on for days fills
neither the disk (segment files) nor the ledger (segment rows).

A segment file goes once every row naming it is done. Copies of a chunk split by key
groups share one file, so it waits for the last copy. Done is final, and every row that
names a file is written in the transaction that makes the file reachable at all (a
chunk's copies with the source's new position, a batch's outputs with its completion,
the copies of a rerouted *queued* segment with its removal), so no reader comes for a
file whose rows are all done. Its rows then say "no file", an empty path as a marker
has, and the next sweep passes them over.

A done row goes once its file is gone and it is older than ``keep_rows_s``, unless a
reader of done rows still needs it:

- the driver's flows count the bytes done in its last window (``segments.node_flows``):
  ``keep_rows_s`` must be longer than that window;
- an adjustment's outcome measures the pauses of the nodes outside it from what they
  finished since it began (``rescale.completion.measure``): nothing done since the
  start of a running adjustment goes;
- the run's numbers of migrated segments, malformed records and late records are
  counts over rows (``segments.migrated_segments``, ``malformed_records``,
  ``late_records``; the run page, the API and the result summary show them): those
  rows stay, only their files go;
- adjustment markers stay: few, fileless, and recreated by ``alignment.send_marker``
  (``get_or_create``) if they were missing.

A late worker whose input rows are gone is refused as one whose lease was lost: its
completion finds fewer of its segments claimed by it than it holds (``LeaseLostError``),
and its lease keeper has none left to renew.

A run that has ended keeps its results, merged chunks (coverage and the completion
curve), events, and the rows counted above; its segment folder and other segment rows
go (:func:`clean_finished`). The folder goes first, a minute after the run ended
(:func:`drop_ended_folders`, from the watchdog): a cancelled or failed run never
finishes its queued segments, so nothing else would delete their files. A completed
run's partial states go then too, its measures' values kept (:func:`freeze_results`): nothing
merges into a run once it has ended (``segments.complete_sink_batch`` refuses it).
"""

from __future__ import annotations

import datetime as dt
import json
import shutil
from dataclasses import dataclass
from pathlib import Path

from django.db import connection, transaction
from django.db.models import Exists, Min, OuterRef, Q
from django.utils import timezone

from orchestrator.ledger.groups import stored
from orchestrator.models import Adjustment, ResultGroup, Run, Segment
from orchestrator.pipeline.graph import pipeline_grouping
from orchestrator.pipeline.layout import segments_dir

# Work of one sweep, so a driver tick never waits long: a backlog goes over several.
MAX_PATHS = 5000
MAX_ROWS = 20000

# An ended run's folder waits this long: a batch still running when the run ended (its
# Spark job is being cancelled) may write its outputs meanwhile, refused afterwards.
ENDED_GRACE_S = 60.0
# ... and runs that ended longer ago than this are left to ``manage.py clean_runs``, so
# the watchdog looks at a bounded number of folders.
ENDED_WITHIN_S = 86_400.0

# Rows the run's counts are made of (see the module docstring): never deleted.
_COUNTED = ~Q(migrated_from="") | Q(malformed__gt=0) | Q(late__gt=0)


@dataclass(frozen=True)
class Swept:
    files_deleted: int = 0
    bytes_freed: int = 0
    rows_deleted: int = 0


def sweep(
    run_id: int,
    *,
    keep_rows_s: float | None,
    max_paths: int = MAX_PATHS,
    max_rows: int = MAX_ROWS,
) -> Swept:
    """Delete the files of ``run_id`` that only done segments name, then done rows older
    than ``keep_rows_s`` whose file is gone (None: keep every row, as a bounded run
    does until ``clean_finished``); at most ``max_paths`` files and ``max_rows`` rows
    per call."""
    if keep_rows_s is not None and keep_rows_s < 0:
        raise ValueError(f"keep_rows_s must not be negative, not {keep_rows_s}")
    files, freed = _delete_files(run_id, max_paths)
    rows = _delete_rows(run_id, keep_rows_s, max_rows) if keep_rows_s is not None else 0
    return Swept(files, freed, rows)


def _finished_paths(run_id: int, limit: int) -> list[str]:
    """Paths that only done segments name (markers have none)."""
    with connection.cursor() as cursor:
        cursor.execute(
            """
            SELECT path FROM orchestrator_segment
            WHERE run_id = %s AND path <> ''
            GROUP BY path
            HAVING bool_and(state = %s)
            LIMIT %s
            """,
            [run_id, Segment.State.DONE, limit],
        )
        return [row[0] for row in cursor.fetchall()]


def _delete_files(run_id: int, limit: int) -> tuple[int, int]:
    paths = _finished_paths(run_id, limit)
    if not paths:
        return 0, 0
    folder = segments_dir(run_id)
    deleted = freed = 0
    for path in paths:
        size = _unlink(Path(path), folder)
        if size is not None:
            deleted += 1
            freed += size
    # Marked only once the files are gone: a sweep that dies between the two finds
    # them again next time, and a missing file costs nothing.
    Segment.objects.filter(run_id=run_id, path__in=paths, state=Segment.State.DONE).update(path="")
    return deleted, freed


def _unlink(path: Path, folder: Path) -> int | None:
    """The bytes the deletion freed; None if the file was missing or not in the run's
    folder (a row naming anything else never makes the sweep delete it). A segment
    read in place is a link to an input file, which stays: it frees nothing."""
    if path.parent != folder:
        return None
    try:
        stat = path.stat()
        path.unlink()
    except FileNotFoundError:
        return None
    return stat.st_size if stat.st_nlink == 1 else 0


def _delete_rows(run_id: int, keep_rows_s: float, limit: int) -> int:
    cutoff = timezone.now() - dt.timedelta(seconds=keep_rows_s)
    adjusting = Adjustment.objects.filter(
        run_id=run_id, status=Adjustment.Status.RUNNING
    ).aggregate(first=Min("started_at"))["first"]
    if adjusting is not None:
        cutoff = min(cutoff, adjusting)
    doomed = (
        Segment.objects.filter(
            run_id=run_id, state=Segment.State.DONE, marker=False, path="", done_at__lt=cutoff
        )
        .exclude(_COUNTED)
        .values("pk")[:limit]
    )
    deleted, _ = Segment.objects.filter(pk__in=doomed).delete()
    return deleted


def clean_finished(run_id: int) -> Swept:
    """Delete the segment folder and the segment rows of a run that has ended, but the
    rows its counts are made of; an active (or unknown) run is left alone."""
    if not Run.objects.filter(pk=run_id).exclude(status__in=Run.ACTIVE).exists():
        return Swept()
    files, freed = _remove_folder(segments_dir(run_id))
    with transaction.atomic():
        rows, _ = Segment.objects.filter(run_id=run_id).exclude(_COUNTED).delete()
        Segment.objects.filter(run_id=run_id).exclude(path="").update(path="")
    return Swept(files, freed, rows)


def drop_ended_folders(
    *, grace_s: float = ENDED_GRACE_S, within_s: float = ENDED_WITHIN_S
) -> Swept:
    """Delete the segment folders of the runs that ended between ``within_s`` and
    ``grace_s`` ago; their rows stay (the run's record, until ``clean_finished``), saying
    "no file"."""
    now = timezone.now()
    ended = Run.objects.exclude(status__in=Run.ACTIVE).filter(
        finished_at__gte=now - dt.timedelta(seconds=within_s),
        finished_at__lte=now - dt.timedelta(seconds=grace_s),
    )
    files = freed = 0
    for run_id in ended.values_list("pk", flat=True):
        folder = segments_dir(run_id)
        if not folder.exists():
            continue
        removed, size = _remove_folder(folder)
        files, freed = files + removed, freed + size
        Segment.objects.filter(run_id=run_id).exclude(path="").update(path="")
    return Swept(files, freed)


def freeze_results(*, grace_s: float = ENDED_GRACE_S, max_runs: int = 1) -> list[int]:
    """Keep each group's finished measures on its result row and drop the partial
    states behind them (a distinct count's exact set among them), for up to
    ``max_runs`` runs that ended (completed, cancelled or failed) more than ``grace_s``
    ago; which runs. Nothing merges into a run that has ended: a late batch is refused
    before it touches the result (``segments.complete_sink_batch``). The sets were most
    of the database (1.6 million values after 51 short runs under chaos), and a
    cancelled or failed run's partial result keeps them no longer than a completed
    one's."""
    now = timezone.now()
    unfrozen = ResultGroup.objects.filter(run_id=OuterRef("pk"), finished__isnull=True)
    runs = list(
        Run.objects.exclude(status__in=Run.ACTIVE)
        .filter(finished_at__lte=now - dt.timedelta(seconds=grace_s))
        .filter(Exists(unfrozen))
        .order_by("finished_at")
        .values_list("pk", "topology")[:max_runs]
    )
    for run_id, topology in runs:
        grouping = pipeline_grouping(topology)
        with transaction.atomic():
            rows = ResultGroup.objects.select_for_update().filter(
                run_id=run_id, finished__isnull=True
            )
            found = list(rows.values_list("pk", "states"))
            finished = [
                json.dumps(stored(grouping.finish(states)) if grouping is not None else {})
                for _, states in found
            ]
            with connection.cursor() as cursor:
                cursor.execute(
                    """
                    UPDATE orchestrator_resultgroup g
                    SET finished = d.f::jsonb, states = '{}'::jsonb
                    FROM unnest(%s::bigint[], %s::text[]) AS d(id, f)
                    WHERE g.id = d.id AND g.run_id = %s
                    """,
                    [[pk for pk, _ in found], finished, run_id],
                )
    return [run_id for run_id, _ in runs]


def _remove_folder(folder: Path) -> tuple[int, int]:
    """How many files the folder held and their bytes, once it is deleted."""
    files = freed = 0
    for path in folder.rglob("*"):
        try:
            if path.is_file():
                freed += path.stat().st_size
                files += 1
        except FileNotFoundError:
            continue
    try:
        shutil.rmtree(folder)
    except FileNotFoundError:
        return 0, 0
    return files, freed
