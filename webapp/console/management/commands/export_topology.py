from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from webapp.console.models import Pipeline
from webapp.console.topology_io import dump_yaml, export_document


class Command(BaseCommand):
    help = "Print a pipeline as a topology file (YAML) that load_topology reads back."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("name", help="pipeline name")

    def handle(self, *args: Any, **options: Any) -> None:
        pipeline = Pipeline.objects.filter(name=options["name"]).first()
        if pipeline is None:
            known = ", ".join(Pipeline.objects.values_list("name", flat=True)) or "none"
            raise CommandError(f"no pipeline named {options['name']!r} (known: {known})")
        self.stdout.write(dump_yaml(export_document(pipeline)), ending="")
