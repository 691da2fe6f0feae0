"""The Celery app: settings under the CELERY namespace, tasks from each app's tasks.py."""

from __future__ import annotations

import logging
import os

from celery import Celery
from celery.signals import beat_init, worker_ready

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "webapp.settings.local")

app = Celery("bpconsole")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()


@worker_ready.connect
@beat_init.connect
def _warn_when_root(**_: object) -> None:
    # A worker runs Spark jobs over operators' inputs: as root, a flaw would own the host
    # (`manage.py check --deploy` says the same, bpconsole.W001).
    if hasattr(os, "geteuid") and os.geteuid() == 0:
        logging.getLogger("orchestrator.celery").warning(
            "this Celery process runs as root (uid 0): run the workers and beat as an "
            "unprivileged user"
        )
