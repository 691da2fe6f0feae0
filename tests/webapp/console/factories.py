"""Users with roles, the reference pipeline and runs for the console's tests."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from django.contrib.auth.models import Group, User
from django.test import Client

from orchestrator import service
from webapp.console.models import Pipeline
from webapp.console.topology_io import export_document, parse_yaml, save_document

REFERENCE = Path(__file__).resolve().parents[3] / "webapp/console/topologies/reference.yaml"
SMALL_INPUT = "seed=3,volume_mb=0.2,dominance=0.8"


def make_user(name: str, role: str | None) -> User:
    user = User.objects.create_user(name, password=f"pw-{name}-123")
    if role:
        # get_or_create: transactional tests flush the groups the migration made.
        user.groups.add(Group.objects.get_or_create(name=role)[0])
    return user


def client_for(name: str, role: str | None) -> tuple[Client, User]:
    user = make_user(name, role)
    client = Client()
    client.force_login(user)
    return client, user


def reference() -> Pipeline:
    existing = Pipeline.objects.filter(name="reference").first()
    return existing or save_document(parse_yaml(REFERENCE.read_text()))[0]


def make_run(pipeline: Pipeline | None = None, user: Any = None) -> Any:
    """A pending run of the reference pipeline over a tiny generated input (not started)."""
    pipeline = pipeline or reference()
    return service.create_run(
        topology=export_document(pipeline),
        policy=pipeline.effective_policy_values(),
        pipeline_id=pipeline.pk,
        generator=SMALL_INPUT,
        user=user,
    )
