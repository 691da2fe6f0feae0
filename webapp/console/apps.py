from django.apps import AppConfig


class ConsoleConfig(AppConfig):
    name = "webapp.console"
    label = "console"
    verbose_name = "Pipelines and policies"

    def ready(self) -> None:
        from webapp.console import (
            checks,  # noqa: F401 - registers the system checks
            consumers,  # noqa: F401 - closes sockets of ended access
        )
