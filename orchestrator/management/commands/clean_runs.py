"""manage.py clean_runs: delete the segment files and rows of runs that ended a while ago
(see :func:`orchestrator.ledger.retention.clean_finished`), for an operator's cron.

Only runs that ended at least ``--older-than`` ago: a batch still running when its run
was stopped may write its output after the run ended, and it has given up once its
lease has run out.
"""

from __future__ import annotations

import datetime as dt
import re
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db.models import Q
from django.utils import timezone

from balancer.units import MB
from orchestrator.ledger.retention import clean_finished
from orchestrator.models import Run

_AGE = re.compile(r"(\d+(?:\.\d*)?)\s*([smhd]?)", re.IGNORECASE)
_UNITS = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400}


def parse_age(text: str) -> float:
    """``90s``, ``30m``, ``12h``, ``7d`` or plain seconds."""
    match = _AGE.fullmatch(text.strip())
    if not match:
        raise CommandError(f"--older-than {text[:40]!r}: use a number with s, m, h or d (1d)")
    return float(match[1]) * _UNITS[match[2].lower()]


class Command(BaseCommand):
    help = "Delete the segment files and rows of runs that ended; results and events stay."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--older-than",
            default="1d",
            help="only runs that ended at least this long ago: 90s, 30m, 12h, 7d (default 1d)",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        cutoff = timezone.now() - dt.timedelta(seconds=parse_age(options["older_than"]))
        # A run stopped before it ever started may have no end time: its creation counts.
        ended = (
            Run.objects.exclude(status__in=Run.ACTIVE)
            .filter(
                Q(finished_at__lte=cutoff) | Q(finished_at__isnull=True, created_at__lte=cutoff)
            )
            .order_by("pk")
            .values_list("pk", flat=True)
        )
        files = freed = rows = 0
        for run_id in ended:
            swept = clean_finished(run_id)
            if swept.files_deleted or swept.rows_deleted:
                self.stdout.write(
                    f"run {run_id}: {swept.files_deleted} file(s), "
                    f"{swept.bytes_freed / MB:.1f} MB, {swept.rows_deleted} row(s)"
                )
            files += swept.files_deleted
            freed += swept.bytes_freed
            rows += swept.rows_deleted
        self.stdout.write(f"deleted {files} file(s), {freed / MB:.1f} MB, {rows} segment row(s)")
