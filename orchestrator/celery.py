"""The Celery app: settings under the CELERY namespace, tasks from each app's tasks.py."""

from __future__ import annotations

import os

from celery import Celery

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "webapp.settings.local")

app = Celery("bpconsole")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()
