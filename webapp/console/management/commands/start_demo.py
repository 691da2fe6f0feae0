"""The continuous demo `make run` starts: the landing-demo pipeline over a landing folder
that the demo producer writes into, unless a run of it is already going on."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError, CommandParser

from orchestrator.models import Run
from orchestrator.service import (
    InputError,
    RunError,
    check_landing,
    create_run,
    start_run,
)
from webapp.console.actions import effective_policy
from webapp.console.models import Pipeline
from webapp.console.topology_io import export_document

DEMO = "landing-demo"


def demo_folder() -> Path:
    """Inside the first input root, so the console may read it as any landing folder."""
    return Path(settings.INPUT_ROOTS[0]) / "landing-demo"


class Command(BaseCommand):
    help = (
        "Start the continuous demo (the landing-demo pipeline over a landing folder the "
        "demo producer writes into) unless a run of it is active; prints the folder."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--folder", help="the landing folder (default: an input root's)")

    def handle(self, *args: Any, **options: Any) -> None:
        folder = Path(options["folder"]) if options["folder"] else demo_folder()
        folder.mkdir(parents=True, exist_ok=True)
        pipeline = Pipeline.objects.filter(name=DEMO).first()
        if pipeline is None:
            raise CommandError(f"there is no {DEMO} pipeline; run manage.py bootstrap first")
        active = Run.objects.filter(pipeline=pipeline, status__in=Run.ACTIVE).first()
        if active is not None:
            self.stdout.write(f"demo run {active.pk} is {active.status}; reading {folder}")
            return
        try:
            spec = check_landing(
                {"folder": str(folder), "stable_s": 0.5, "clean": "delete"},
                fmt="jsonl",
                roots=None,
            )
            run = create_run(
                topology=export_document(pipeline),
                policy=effective_policy(pipeline, None),
                pipeline_id=pipeline.pk,
                source=spec,
            )
        except (InputError, RunError) as exc:
            raise CommandError(str(exc)) from None
        start_run(run)
        self.stdout.write(f"demo run {run.pk} started; reading {folder}")
