from __future__ import annotations

from pathlib import Path
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from webapp.console.topology import TopologyError
from webapp.console.topology_io import parse_yaml, save_document


class Command(BaseCommand):
    help = "Create or update a pipeline from a topology file (YAML). Saves nothing if invalid."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("file", type=Path, help="topology file (docs/topology-format.md)")

    def handle(self, *args: Any, **options: Any) -> None:
        path: Path = options["file"]
        try:
            text = path.read_text()
        except OSError as exc:
            raise CommandError(f"cannot read {path}: {exc.strerror}") from None
        try:
            pipeline, created = save_document(parse_yaml(text))
        except TopologyError as exc:
            lines = "\n".join(f"  {problem}" for problem in exc.problems)
            raise CommandError(
                f"{path}: {len(exc.problems)} problem(s), nothing saved:\n{lines}"
            ) from None
        verb = "Created" if created else "Updated"
        self.stdout.write(
            f"{verb} pipeline {pipeline.name!r}: {pipeline.nodes.count()} nodes, "
            f"{pipeline.edges.count()} edges"
        )
