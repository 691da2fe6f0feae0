"""`make run`'s live demo: one continuous run of the landing-demo pipeline over its
landing folder, started once however often the console is started."""

from __future__ import annotations

import io

import pytest
from django.contrib.auth.models import Group
from django.core.management import call_command

from orchestrator.models import Run
from orchestrator.service import set_status
from webapp.console.models import Policy

pytestmark = [pytest.mark.django_db(transaction=True)]


def _migrated_rows() -> None:
    """What the roles migration writes, which a transactional test before may have
    flushed: the role groups and the default policy."""
    for role in ("viewer", "operator", "admin"):
        Group.objects.get_or_create(name=role)
    if not Policy.objects.filter(is_default=True).exists():
        Policy.objects.create(name="default", is_default=True, description="Shipped defaults.")


def test_the_demo_run_starts_once_over_its_landing_folder(services, tmp_path) -> None:
    _migrated_rows()
    call_command("bootstrap", stdout=io.StringIO())
    folder = tmp_path / "landing-demo"
    out = io.StringIO()
    call_command("start_demo", "--folder", str(folder), stdout=out)
    run = Run.objects.get(pipeline__name="landing-demo")
    try:
        assert folder.is_dir()
        assert run.input_spec["kind"] == "folder"
        assert run.input_spec["folder"] == str(folder.resolve())
        assert run.input_spec["clean"] == "delete", "the demo's folder does not grow"
        assert f"demo run {run.pk} started" in out.getvalue()
        again = io.StringIO()
        call_command("start_demo", "--folder", str(folder), stdout=again)
        assert Run.objects.filter(pipeline__name="landing-demo").count() == 1
        assert f"demo run {run.pk} is pending" in again.getvalue()
    finally:
        # Its start task waits in the broker: a later test's workers must find it ended.
        set_status(run.pk, "cancelled", reason="test over")
