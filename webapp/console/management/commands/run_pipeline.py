from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from orchestrator.service import (
    BatchJobError,
    GeneratorError,
    InputError,
    PipelineDocument,
    PolicyError,
    RunError,
    batch_summary,
    create_run,
    run_summary,
    start_run,
    workers_alive,
)
from webapp.console.models import Pipeline, Policy
from webapp.console.topology_io import parse_yaml, validate_for_save
from webapp.console.validation import TopologyError


class Command(BaseCommand):
    help = (
        "Run a pipeline (a topology file or the name of a saved pipeline) over an input, "
        "or with --batch run the plain Spark batch job over the same input."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("pipeline", help="topology file, or the name of a saved pipeline")
        parser.add_argument("--input", help="input file or glob (JSON lines, CSV or Parquet)")
        parser.add_argument("--generator", help="built-in input, e.g. seed=7,volume_mb=64")
        parser.add_argument("--policy", help="named policy instead of the pipeline's")
        parser.add_argument("--wait", action="store_true", help="wait until the run ends")
        parser.add_argument("--json", action="store_true", help="print one JSON object")
        parser.add_argument("--batch", action="store_true", help="run the plain batch job")
        parser.add_argument("--timeout", type=float, default=3600.0, help="seconds to wait")

    def handle(self, *args: Any, **options: Any) -> None:
        doc, pipeline = self._topology(options["pipeline"])
        policy = self._policy(options["policy"], pipeline, doc)
        try:
            if options["batch"]:
                result = batch_summary(
                    topology=doc, input_path=options["input"], generator=options["generator"]
                )
                self._print(result, as_json=options["json"])
                return
            run = create_run(
                topology=doc,
                policy=policy,
                pipeline_id=pipeline.pk if pipeline else None,
                input_path=options["input"],
                generator=options["generator"],
            )
        except (InputError, GeneratorError, RunError, BatchJobError, PolicyError) as exc:
            raise CommandError(str(exc)) from None
        if not workers_alive():
            raise CommandError(
                f"run {run.pk} was created but no Celery worker answers; start the console "
                "(make run) or a worker (celery -A orchestrator.celery worker -Q control,spark)"
            )
        start_run(run)
        if not options["wait"]:
            self._print({"run": run.pk, "status": "started"}, as_json=options["json"])
            return
        deadline = time.monotonic() + options["timeout"]
        while True:
            run.refresh_from_db()
            if not run.is_active:
                break
            if time.monotonic() > deadline:
                raise CommandError(f"run {run.pk} still {run.status} after {options['timeout']} s")
            time.sleep(0.5)
        result = run_summary(run)
        self._print(result, as_json=options["json"])
        if result["status"] != "completed":
            raise CommandError(f"run {run.pk} ended {result['status']}: {result['error']}")

    def _topology(self, name_or_file: str) -> tuple[PipelineDocument, Pipeline | None]:
        path = Path(name_or_file)
        if path.is_file():
            try:
                doc = parse_yaml(path.read_text())
            except TopologyError as exc:
                raise CommandError(str(exc)) from None
            problems = validate_for_save(doc)
            if problems:
                lines = "\n".join(f"  {p}" for p in problems)
                raise CommandError(f"{path}: {len(problems)} problem(s):\n{lines}")
            return doc, Pipeline.objects.filter(name=doc["name"]).first()
        pipeline = Pipeline.objects.filter(name=name_or_file).first()
        if pipeline is None:
            known = ", ".join(Pipeline.objects.values_list("name", flat=True)) or "none"
            raise CommandError(
                f"{name_or_file!r} is neither a topology file nor a pipeline (known: {known})"
            )
        from webapp.console.topology_io import export_document

        return export_document(pipeline), pipeline

    def _policy(
        self, name: str | None, pipeline: Pipeline | None, doc: PipelineDocument
    ) -> dict[str, Any]:
        if name is not None:
            base = Policy.objects.filter(name=name).first()
            if base is None:
                known = ", ".join(Policy.objects.values_list("name", flat=True))
                raise CommandError(f"unknown policy {name!r} (known: {known})")
        elif doc.get("policy"):
            base = Policy.objects.get(name=doc["policy"])
        else:
            base = Policy.default()
        return {**base.values(), **(doc.get("policy_overrides") or {})}

    def _print(self, result: dict[str, Any], *, as_json: bool) -> None:
        if as_json:
            self.stdout.write(json.dumps(result, default=str))
            return
        for key, value in result.items():
            if key != "rows":
                self.stdout.write(f"{key}: {value}")
        rows = result.get("rows") or []
        self.stdout.write(f"rows: {len(rows)}")
        for row in rows[:20]:
            self.stdout.write("  " + json.dumps(row))
