from __future__ import annotations

from pathlib import Path
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from webapp.console.topology_io import max_document_bytes, parse_yaml, save_document
from webapp.console.validation import TopologyError


class Command(BaseCommand):
    help = "Create or update a pipeline from a topology file (YAML). Saves nothing if invalid."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("file", type=Path, help="topology file (docs/topology-format.md)")

    def handle(self, *args: Any, **options: Any) -> None:
        path: Path = options["file"]
        try:
            # One byte over the cap at most: parse_yaml refuses a larger file (and says
            # so) without this command reading all of it.
            with path.open("rb") as file:
                raw = file.read(max_document_bytes() + 1)
        except OSError as exc:
            raise CommandError(f"cannot read {path}: {exc.strerror}") from None
        oversized = len(raw) > max_document_bytes()  # parse_yaml says so, by its size
        try:
            text = raw.decode("utf-8", "replace" if oversized else "strict")
        except UnicodeDecodeError as exc:
            raise CommandError(f"{path} is not UTF-8 text: {exc}") from None
        try:
            # Bounded like an upload: size, depth, no anchors or aliases.
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
