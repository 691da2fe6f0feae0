"""manage.py doctor and GET /healthz, with services up and with one down."""

from __future__ import annotations

import io

import pytest
from django.conf import settings
from django.contrib.auth.models import Group, User
from django.core.management import call_command
from django.core.management.base import CommandError
from django.test import Client

from orchestrator.services import health
from orchestrator.services.embedded import free_port

pytestmark = [pytest.mark.integration, pytest.mark.django_db]


@pytest.fixture
def viewer_client() -> Client:
    user = User.objects.create_user("vera", password="pw-vera-123")
    user.groups.add(Group.objects.get(name="viewer"))
    client = Client()
    client.force_login(user)
    return client


@pytest.mark.spark
def test_doctor_reports_every_service_up_including_a_spark_job() -> None:
    out = io.StringIO()
    call_command("doctor", stdout=out)
    text = out.getvalue()
    for service in ("postgresql", "redis", "zookeeper", "spark"):
        assert f"up   {service}" in text
    assert "ran a job" in text


def test_doctor_names_a_down_service_and_fails(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(settings, "ZK_HOSTS", f"127.0.0.1:{free_port()}")
    out = io.StringIO()
    with pytest.raises(CommandError, match="down: zookeeper"):
        call_command("doctor", "--no-spark", stdout=out)
    assert "DOWN zookeeper" in out.getvalue()
    assert "up   postgresql" in out.getvalue()


def test_healthz_ok_for_a_viewer(viewer_client: Client) -> None:
    response = viewer_client.get("/healthz?spark=0")
    assert response.status_code == 200
    body = response.json()
    assert body["status"] == "ok"
    assert {c["service"] for c in body["checks"]} == {"postgresql", "redis", "zookeeper"}


def test_healthz_503_names_what_is_down(
    viewer_client: Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(settings, "REDIS_URL", f"redis://127.0.0.1:{free_port()}/0")
    response = viewer_client.get("/healthz?spark=0")
    assert response.status_code == 503
    down = [c for c in response.json()["checks"] if not c["up"]]
    assert [c["service"] for c in down] == ["redis"]
    assert "Connection" in down[0]["detail"]


def test_healthz_refuses_anonymous_but_accepts_the_probe_token(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    assert Client().get("/healthz?spark=0").status_code == 401
    monkeypatch.setattr(settings, "HEALTH_TOKEN", "probe-secret")
    assert Client().get("/healthz?spark=0", HTTP_AUTHORIZATION="Bearer wrong").status_code == 401
    ok = Client().get("/healthz?spark=0", HTTP_AUTHORIZATION="Bearer probe-secret")
    assert ok.status_code == 200


def test_spark_down_is_reported_with_the_reason(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(settings, "SPARK_MASTER", "nowhere://no-such-master")
    check = health.check_spark(max_age_s=0)
    assert check.up is False
    assert "Error" in check.detail  # the exception type and message, not a bare "down"
