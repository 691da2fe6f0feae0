from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError, CommandParser

from orchestrator.models import Run
from orchestrator.service import (
    BatchJobError,
    GeneratorError,
    InputError,
    PipelineDocument,
    PolicyError,
    ReplayError,
    RunError,
    UnboundedSpec,
    batch_summary,
    check_landing,
    check_stream,
    create_run,
    replay_inputs,
    run_summary,
    snapshot,
    start_run,
    wait_until_ended,
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
        parser.add_argument(
            "--folder", help="a landing folder: read its files as they arrive, until stopped"
        )
        parser.add_argument("--pattern", help="the landing folder's file pattern (*.jsonl)")
        parser.add_argument("--stable-s", type=float, default=1.0, help="seconds unchanged")
        parser.add_argument(
            "--clean",
            choices=["keep", "archive", "delete"],
            default="keep",
            help="what becomes of a file once merged",
        )
        parser.add_argument("--archive", help="the archive folder (--clean archive)")
        parser.add_argument(
            "--checkpoint", help="go on after the files completed runs with this name read"
        )
        parser.add_argument("--stream", help="a Redis stream: read it until stopped")
        parser.add_argument("--stream-url", help="its Redis (the console's own by default)")
        parser.add_argument("--group", help="the stream's consumer group (one per run)")
        parser.add_argument(
            "--start", choices=["earliest", "latest"], default="earliest", help="a new group's"
        )
        parser.add_argument(
            "--linger-s", type=float, default=0.5, help="seconds a partial chunk waits"
        )
        parser.add_argument(
            "--partitions",
            type=int,
            default=1,
            help="read the streams STREAM:0 .. STREAM:N-1 side by side (1: STREAM itself)",
        )
        parser.add_argument(
            "--idle-s",
            type=float,
            default=30.0,
            help="seconds a partition gives nothing before the watermark goes on without it",
        )
        parser.add_argument(
            "--follow", action="store_true", help="print the run's progress every second"
        )
        parser.add_argument(
            "--of-run",
            type=int,
            help="with --batch: the plain job over exactly what that (unbounded) run took in",
        )
        parser.add_argument("--policy", help="named policy instead of the pipeline's")
        parser.add_argument("--wait", action="store_true", help="wait until the run ends")
        parser.add_argument("--json", action="store_true", help="print one JSON object")
        parser.add_argument("--batch", action="store_true", help="run the plain batch job")
        parser.add_argument("--timeout", type=float, default=3600.0, help="seconds to wait")

    def handle(self, *args: Any, **options: Any) -> None:
        doc, pipeline = self._topology(options["pipeline"])
        policy = self._policy(options["policy"], pipeline, doc)
        try:
            if options["batch"] and options["of_run"] is not None:
                # The run's own graph: the copies of the tables its joins read.
                run = self._run(options["of_run"])
                replay = replay_inputs(
                    run, Path(settings.DATA_DIR) / "replays" / f"run-{run.pk}.jsonl"
                )
                result = batch_summary(
                    topology=run.topology,
                    input_path=replay.paths,
                    generator=None,
                    copies=replay.copies,
                )
                self._print(result, as_json=options["json"])
                return
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
                source=self._unbounded(doc, options),
            )
        except (
            InputError,
            GeneratorError,
            RunError,
            BatchJobError,
            PolicyError,
            ReplayError,
        ) as exc:
            raise CommandError(str(exc)) from None
        if not workers_alive():
            raise CommandError(
                f"run {run.pk} was created but no Celery worker answers; start the console "
                "(make run) or a worker (celery -A orchestrator.celery worker -Q control,spark)"
            )
        start_run(run)
        if options["follow"]:
            self._follow(run.pk, as_json=options["json"])
            return
        if not options["wait"]:
            self._print({"run": run.pk, "status": "started"}, as_json=options["json"])
            return
        try:
            wait_until_ended(run.pk, options["timeout"])
        except TimeoutError as exc:
            raise CommandError(str(exc)) from None
        run.refresh_from_db()
        result = run_summary(run)
        self._print(result, as_json=options["json"])
        if result["status"] != "completed":
            raise CommandError(f"run {run.pk} ended {result['status']}: {result['error']}")

    def _unbounded(self, doc: PipelineDocument, options: dict[str, Any]) -> UnboundedSpec | None:
        """A landing folder or stream from the command line (not limited to the input
        roots: whoever runs manage.py can read the server's files anyway)."""
        source = next(n for n in doc["nodes"] if n["kind"] == "source")
        fmt = (source.get("params") or {}).get("format", "jsonl")
        if options["folder"]:
            raw = {
                "folder": options["folder"],
                "pattern": options["pattern"],
                "stable_s": options["stable_s"],
                "clean": options["clean"],
                "archive": options["archive"],
                "checkpoint": options["checkpoint"],
            }
            return check_landing(raw, fmt=fmt, roots=None)
        if options["stream"]:
            raw = {
                "stream": options["stream"],
                "group": options["group"],
                "start": options["start"],
                "linger_s": options["linger_s"],
                "partitions": options["partitions"],
                "idle_s": options["idle_s"],
            }
            url = options["stream_url"] or ""
            return check_stream(
                {**raw, "url": url}, default_url=settings.REDIS_URL, allowed_urls=[url]
            )
        return None

    def _run(self, run_id: int) -> Run:
        run = Run.objects.filter(pk=run_id).first()
        if run is None:
            raise CommandError(f"there is no run {run_id}")
        return run

    def _follow(self, run_id: int, *, as_json: bool) -> None:
        """One line a second until the run ends (Ctrl-C leaves it running)."""
        while True:
            view = snapshot(run_id)
            shown = view["run"]
            source = view["source"]
            line = {
                "run": run_id,
                "status": shown["status"],
                "merged_chunks": shown["merged_chunks"],
                "input_bytes": shown["input_bytes"],
                "exact_up_to": source["exact_up_to"],
                "lag": source["lag"],
            }
            if as_json:
                self.stdout.write(json.dumps(line))
            else:
                lag = source["lag"]
                waiting = (
                    f", waiting {lag['entries']} ({lag['bytes'] / 1e6:.1f} MB, "
                    f"oldest {lag['age_s']:.1f} s)"
                    if lag
                    else ""
                )
                self.stdout.write(
                    f"run {run_id} {shown['status']}: {shown['merged_chunks']} chunks merged, "
                    f"exact up to {source['exact_up_to'] or 'the end'}{waiting}"
                )
            self.stdout.flush()
            if shown["status"] not in ("pending", "running", "paused", "stopping"):
                return
            time.sleep(1.0)

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
