"""manage.py produce: generated records at a paced rate into a folder or a Redis stream
(see :mod:`orchestrator.pipeline.producer`)."""

from __future__ import annotations

import dataclasses
import json
import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError, CommandParser

from balancer.units import MB
from orchestrator.pipeline.producer import (
    DEFAULT_BRANCHES,
    PATTERNS,
    ProducerError,
    StreamTarget,
    parse_duration,
    parse_rate,
    parse_target,
    produce,
)


@contextmanager
def stop_on_signals() -> Iterator[threading.Event]:
    """An event set by SIGTERM or SIGINT, so the producer finishes its last file and
    returns instead of dying half-way; the previous handlers come back afterwards."""
    stop = threading.Event()
    # Handlers can only be installed from the main thread (call_command may run elsewhere).
    if threading.current_thread() is not threading.main_thread():
        yield stop
        return
    previous = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT)}
    for sig in previous:
        signal.signal(sig, lambda _signum, _frame: stop.set())
    try:
        yield stop
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


class Command(BaseCommand):
    help = (
        "Produce generated JSON-line records at a controlled rate: --to folder:PATH "
        "(part files published whole) or redis:STREAM (one XADD per record)."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--to",
            required=True,
            help="folder:PATH or redis:STREAM (on the console's Redis: bpconsole:stream:STREAM)",
        )
        parser.add_argument("--redis-url", default=None, help="default: settings.REDIS_URL")
        parser.add_argument(
            "--partitions",
            type=int,
            default=1,
            help="redis: records in turn to STREAM:0 .. STREAM:N-1 (1: STREAM itself)",
        )
        parser.add_argument("--rate", default="4MB/s", help="4MB/s, 500KB/s ... up to 1GB/s")
        parser.add_argument("--pattern", default="steady", choices=PATTERNS)
        parser.add_argument(
            "--duration", default="60s", help="60s, 5m, 1h ... up to 7d; 0/forever: until stopped"
        )
        parser.add_argument("--seed", type=int, default=1)
        parser.add_argument("--file-mb", type=float, default=1.0, help="part file size, (0, 256]")
        parser.add_argument("--keys", type=int, default=81, help="keys in all, split over branches")
        parser.add_argument("--users", type=int, default=1000)
        parser.add_argument(
            "--branches", default=",".join(DEFAULT_BRANCHES), help="branch names, comma-separated"
        )
        parser.add_argument("--max-mb", type=float, default=None, help="stop after this volume")
        parser.add_argument("--json", action="store_true", help="the report as one JSON object")

    def handle(self, *args: Any, **options: Any) -> None:
        try:
            url = options["redis_url"] or settings.REDIS_URL
            # On the console's Redis a stream lives under the streams' prefix, as the
            # source reads it; on a server of its own, under its name.
            target = parse_target(options["to"], redis_url=url, own=url == settings.REDIS_URL)
            if options["partitions"] != 1:
                if not isinstance(target, StreamTarget):
                    raise ProducerError("--partitions is for a redis:STREAM target")
                target = dataclasses.replace(target, partitions=options["partitions"])
            rate = parse_rate(options["rate"])
            duration = parse_duration(options["duration"])
            max_mb = options["max_mb"]
            if max_mb is not None and not max_mb > 0:
                raise ProducerError(f"--max-mb {max_mb:g} is not positive")
            with stop_on_signals() as stop:
                report = produce(
                    target,
                    rate_bps=rate,
                    pattern=options["pattern"],
                    duration_s=duration,
                    seed=options["seed"],
                    file_bytes=int(options["file_mb"] * MB),
                    max_bytes=None if max_mb is None else int(max_mb * MB),
                    stop=stop,
                    keys=options["keys"],
                    users=options["users"],
                    branches=[b.strip() for b in options["branches"].split(",")],
                )
        except (ProducerError, OSError) as error:
            raise CommandError(str(error)) from error
        if options["json"]:
            self.stdout.write(json.dumps(report.to_json()))
            return
        self.stdout.write(
            f"{report.target}: {report.records} records, {report.bytes} bytes in "
            f"{report.seconds:.2f} s = {report.rate_bps / MB:.3f} MB/s "
            f"(target {report.target_rate_bps / MB:.3f} MB/s, {report.pattern}); "
            f"{report.files} files, {report.entries} stream entries; "
            f"stopped by {report.stopped_by}"
        )
