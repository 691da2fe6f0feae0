"""manage.py doctor and GET /healthz, with services up and with one down."""

from __future__ import annotations

import contextlib
import io
import re
import time
import uuid
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import psutil
import pytest
from django.conf import settings
from django.contrib.auth.models import Group, User
from django.core.management import call_command
from django.core.management.base import CommandError
from django.test import Client

from orchestrator.services import health, heartbeat
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


def test_healthz_reads_the_spark_workers_heartbeats_and_runs_no_spark_job(
    viewer_client: Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given no Spark worker beating (a prefix of this test's own in the shared Redis)
    monkeypatch.setattr(heartbeat, "KEY_PREFIX", f"bpconsole:test-{uuid.uuid4().hex[:8]}:")
    # Then /healthz is down, saying no batch can run
    response = viewer_client.get("/healthz")
    assert response.status_code == 503
    down = [c for c in response.json()["checks"] if not c["up"]]
    assert [c["service"] for c in down] == ["spark-workers"]
    assert "no Spark worker has reported" in down[0]["detail"]
    # And once a worker beats with a live JVM, it is up, from that beat alone
    heartbeat.beat("test-host:1")
    response = viewer_client.get("/healthz")
    assert response.status_code == 200, response.json()
    # (no "spark" check: that one runs a job, for manage.py doctor only)
    services = [c["service"] for c in response.json()["checks"]]
    assert services == ["postgresql", "redis", "zookeeper", "spark-workers"]


@pytest.mark.spark
def test_a_spark_worker_reports_in_before_its_first_batch(workers: Any) -> None:
    # Given a Spark worker just started (its pool's process has run no batch)
    process = workers.start("spark9")
    try:
        # Then its pool's process beats within a few seconds, and no control worker does
        deadline = time.monotonic() + 90
        while True:
            pool = {c.pid for c in psutil.Process(process.pid).children()}
            mine = [b for b in heartbeat.beats() if int(b["worker"].rsplit(":", 1)[1]) in pool]
            if mine:
                break
            assert time.monotonic() < deadline, "the new Spark worker never reported in"
            time.sleep(0.5)
        assert mine[0]["jvm"] in ("not started", "up")
        control = {workers.processes[name].pid for name in ("control1", "control2")}
        beating = {int(b["worker"].rsplit(":", 1)[1]) for b in heartbeat.beats()}
        assert not control & beating
    finally:
        process.terminate()
        process.wait(30)
        workers.processes.pop("spark9")


def test_healthz_names_no_url_host_or_secret(
    viewer_client: Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given the console's Redis named by a URL with a password in it
    real = urlsplit(settings.REDIS_URL)
    secret = "hunter2-" + uuid.uuid4().hex[:8]
    with_password = real._replace(netloc=f"bpconsole:{secret}@{real.hostname}:{real.port}")
    monkeypatch.setattr(settings, "REDIS_URL", urlunsplit(with_password))
    # When a viewer asks /healthz (whether this Redis takes the password or not)
    response = viewer_client.get("/healthz?spark=0")
    text = response.content.decode()
    # Then no check's text names the password, a URL, or any service's host or port
    assert {c["service"] for c in response.json()["checks"]} == {
        "postgresql",
        "redis",
        "zookeeper",
    }
    database = settings.DATABASES["default"]
    zookeeper = settings.ZK_HOSTS.replace(",", ":").split(":")
    for address in (secret, "redis://", real.port, database["PORT"], database["HOST"], *zookeeper):
        assert not re.search(rf"\b{re.escape(str(address))}\b", text), (address, text)
    # while the services say what they are
    checks = {c["service"]: c["detail"] for c in response.json()["checks"]}
    assert checks["postgresql"].startswith("PostgreSQL "), checks
    assert checks["zookeeper"].startswith("ZooKeeper answers"), checks


def test_healthz_says_the_redis_version_and_doctor_where_without_the_password(
    viewer_client: Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given the console's own Redis (whatever its URL holds)
    # When a viewer asks /healthz
    redis_check = next(
        c for c in viewer_client.get("/healthz?spark=0").json()["checks"] if c["service"] == "redis"
    )
    # Then it says the version that answers, and nothing of where
    assert redis_check["up"] is True, redis_check
    assert re.fullmatch(r"Redis \d+\.\d+\.\d+ answers", redis_check["detail"]), redis_check
    # And manage.py doctor, in the server's shell, says where, a password masked
    real = urlsplit(settings.REDIS_URL)
    masked = real._replace(netloc=f"bpconsole:the-password@{real.hostname}:{real.port}")
    monkeypatch.setattr(settings, "REDIS_URL", urlunsplit(masked))
    out = io.StringIO()
    with contextlib.suppress(CommandError):  # this Redis may not take that password
        call_command("doctor", "--no-spark", stdout=out)
    assert "the-password" not in out.getvalue()
    assert f"bpconsole:***@{real.hostname}:{real.port}" in out.getvalue()
