"""System checks of the deployment that Django's own do not cover."""

from __future__ import annotations

import os
from typing import Any

from django.core.checks import CheckMessage, Tags, Warning, register

RUNNING_AS_ROOT = "bpconsole.W001"


def running_as_root() -> bool:
    geteuid = getattr(os, "geteuid", None)  # not on Windows
    return geteuid is not None and geteuid() == 0


@register(Tags.security, deploy=True)
def check_not_root(app_configs: Any = None, **kwargs: Any) -> list[CheckMessage]:
    """Warn (``manage.py check --deploy``) when the console runs as root: a worker runs
    Spark jobs over operators' inputs and the ASGI server faces the network, and any
    flaw in either would then hold every file and process of the machine."""
    if not running_as_root():
        return []
    return [
        Warning(
            "The console runs as root (effective uid 0): the ASGI server and the Celery "
            "workers started the same way would too.",
            hint="Run the ASGI server, the workers and beat as an unprivileged user "
            "(e.g. `User=bpconsole` in the systemd unit, `USER` in the container "
            "image). Where uid 0 is not the host's root (a user-namespaced container), "
            "set BPCONSOLE_SILENCED_CHECKS=bpconsole.W001.",
            id=RUNNING_AS_ROOT,
        )
    ]
