from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from orchestrator.services.health import run_checks


class Command(BaseCommand):
    help = "Check PostgreSQL, Redis, ZooKeeper and Spark; exit non-zero if any is down."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--no-spark", action="store_true", help="skip the Spark job")

    def handle(self, *args: Any, **options: Any) -> None:
        # Not the workers' heartbeats: the doctor is run to check a machine before any
        # worker is started; its Spark job says whether Spark works here at all.
        checks = run_checks(spark=False, spark_job=not options["no_spark"])
        for check in checks:
            mark = self.style.SUCCESS("up  ") if check.up else self.style.ERROR("DOWN")
            where = f" ({check.local})" if check.local else ""
            self.stdout.write(f"{mark} {check.service:<11} {check.detail}{where}")
        down = [c.service for c in checks if not c.up]
        if down:
            raise CommandError(f"down: {', '.join(down)}")
