"""manage.py calibrate_sim RUN: a completed run, written as a replay for the simulator.

The replay holds the run's pipeline, its input as its source cut it, and the runtime
fitted from its operator batches (orchestrator/ledger/calibration.py: a placed run's
per operator, on the worker it was placed on); then
``manage.py simulate --replay FILE`` runs every policy on it and gives its live fluid
bound (docs/simulation.md, "Replaying a live run").
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from orchestrator.ledger.calibration import CalibrationError, replay_of
from orchestrator.models import Run


class Command(BaseCommand):
    help = "Fit the simulator's runtime model to a completed run and write it as a replay."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("run", type=int, help="the run's number")
        parser.add_argument(
            "--workers", type=int, default=1, help="Spark workers the run had (default 1)"
        )
        parser.add_argument("--out", type=Path, help="write the replay here (default: stdout)")

    def handle(self, *args: Any, **options: Any) -> None:
        run = Run.objects.filter(pk=options["run"]).first()
        if run is None:
            raise CommandError(f"no run {options['run']}")
        if not 1 <= options["workers"] <= 64:
            raise CommandError("--workers must lie in 1..64")
        try:
            replay = replay_of(run, workers=options["workers"])
        except (CalibrationError, ValueError) as problem:
            raise CommandError(str(problem)) from problem
        text = json.dumps(replay.to_json())
        if options["out"] is None:
            self.stdout.write(text)
            return
        options["out"].write_text(text, encoding="utf-8")
        runtime = replay.runtime.to_json()
        self.stdout.write(
            f"wrote {options['out']}: {replay.workload.packets} chunks; batches cost "
            f"{runtime['batch_fixed_s']} s + their MB at {runtime['batch_mb_per_s']} MB/s; "
            f"reductions {runtime['reductions']}"
        )
        for node, cost in runtime["placed"].items():
            self.stdout.write(
                f"placed {node} on {cost['worker'] or 'a worker of its own'}: its batches "
                f"cost {cost['batch_fixed_s']} s + their MB at {cost['batch_mb_per_s']} MB/s"
            )
