from __future__ import annotations

import os
import secrets
from pathlib import Path
from typing import Any

from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group
from django.core.management.base import BaseCommand

from webapp.console.models import Pipeline
from webapp.console.topology_io import parse_yaml, save_document

TOPOLOGIES = Path(__file__).resolve().parents[2] / "topologies"
# The published experiment, and a keyed stateful pipeline to try hot rescale on.
DEMOS = ("reference", "running-totals", "landing-demo")


class Command(BaseCommand):
    help = (
        "First-run set-up: an admin account when none exists (password from "
        "BPCONSOLE_ADMIN_PASSWORD or generated and printed once) and the demo pipelines."
    )

    def handle(self, *args: Any, **options: Any) -> None:
        user_model = get_user_model()
        if not user_model.objects.filter(is_superuser=True).exists():
            password = os.environ.get("BPCONSOLE_ADMIN_PASSWORD") or secrets.token_urlsafe(12)
            admin = user_model.objects.create_superuser("admin", "", password)
            admin.groups.add(Group.objects.get(name="admin"))
            shown = (
                "from BPCONSOLE_ADMIN_PASSWORD"
                if os.environ.get("BPCONSOLE_ADMIN_PASSWORD")
                else password
            )
            self.stdout.write(
                self.style.WARNING(f"Created user 'admin' with password: {shown} (shown once)")
            )
        for name in DEMOS:
            if not Pipeline.objects.filter(name=name).exists():
                save_document(parse_yaml((TOPOLOGIES / f"{name}.yaml").read_text()))
                self.stdout.write(f"Loaded the {name} pipeline.")
