from __future__ import annotations

import sys
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from balancer.sim.cli import main


class Command(BaseCommand):
    help = (
        "Replay the published experiment in virtual time with the real balancer decisions: "
        "--volume 5GB --policy NAME | --table | --sweep | --plot FILE.png (see --help of "
        "`python -m balancer.sim`)."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("args", nargs="*", help="arguments of the simulator")

    def run_from_argv(self, argv: list[str]) -> None:
        # The simulator parses its own flags (--volume, --table ...); pass them through.
        code = main(argv[2:])
        if code:
            sys.exit(code)

    def handle(self, *args: Any, **options: Any) -> None:
        code = main(list(args))
        if code:
            raise CommandError(f"simulate exited with {code}")
