"""manage.py elastic_workers --base N --maximum M: ``make run``'s elastic Spark workers.

Started by ``make run`` when ``BPCONSOLE_SPARK_WORKERS_MAX`` is above
``BPCONSOLE_SPARK_WORKERS`` and supervised like its other processes. It reads the
runs' asks in ZooKeeper and starts or stops Spark workers beyond the base ones
(``orchestrator/services/spark_pool.py``), restarting any that exits with a supervisor
of its own; its workers end with it (each dies with its parent), and SIGTERM stops
them first.
"""

from __future__ import annotations

import logging
import os
import signal
import sys
import time
from pathlib import Path
from types import FrameType
from typing import Any, NoReturn

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError, CommandParser

from orchestrator.services.runconsole import MAX_SPARK_WORKERS, spark_worker
from orchestrator.services.spark_pool import SparkPool
from orchestrator.services.supervisor import Supervisor
from orchestrator.zk.control_plane import ControlPlane

INTERVAL_S = 0.5


class Command(BaseCommand):
    help = "Start and stop Spark workers beyond the base ones as the runs ask (make run)."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--base", type=int, required=True, help="Spark workers make run runs")
        parser.add_argument("--maximum", type=int, required=True, help="the most in all")

    def handle(self, *args: Any, **options: Any) -> None:
        base, maximum = options["base"], options["maximum"]
        if not 1 <= base <= maximum <= MAX_SPARK_WORKERS:
            raise CommandError(f"need 1 <= --base <= --maximum <= {MAX_SPARK_WORKERS}")
        # kazoo says so at each retry while ZooKeeper is down; the pool says it once.
        logging.getLogger("kazoo").setLevel(logging.ERROR)
        logs = Path(settings.VAR_DIR) / "log"
        env = dict(os.environ)
        control = ControlPlane.connect(settings.ZK_HOSTS)
        pool = SparkPool(
            base,
            maximum,
            lambda number: spark_worker(number, sys.executable, env, logs),
            control,
            Supervisor(say=self._say),
            self._say,
        )

        def stop(signum: int, frame: FrameType | None) -> NoReturn:
            for worker in pool.extras:
                if worker.process is not None and worker.poll() is None:
                    worker.process.terminate()
            raise SystemExit(0)

        signal.signal(signal.SIGTERM, stop)
        self._say(f"elastic Spark workers: {base} base, up to {maximum} in all")
        while True:
            pool.supervisor.tick()
            try:
                pool.tick()
            except Exception as exc:  # noqa: BLE001 - ZooKeeper away delays a pass, no more
                self._say(f"elastic Spark workers: {type(exc).__name__}: {exc}")
            time.sleep(INTERVAL_S)

    def _say(self, line: str) -> None:
        self.stdout.write(line)
        self.stdout.flush()
