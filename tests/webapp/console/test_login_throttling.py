"""Login throttling (django-axes): too many failed log-ins of one user name from one
address lock that pair out for the cool-off, even with the right password; the login
page says so; other users and other addresses are not locked."""

from __future__ import annotations

from typing import Any

import pytest
from django.conf import settings
from django.test import Client

from tests.webapp.console.factories import make_user

pytestmark = [pytest.mark.integration, pytest.mark.django_db]

ATTACKER = "203.0.113.9"


def log_in(client: Client, name: str, password: str) -> int:
    return client.post("/login/", {"username": name, "password": password}).status_code


def test_the_limit_is_five_failures_and_a_fifteen_minute_cool_off_by_default() -> None:
    # The defaults of BPCONSOLE_LOGIN_FAILURE_LIMIT and BPCONSOLE_LOGIN_COOLOFF_MIN
    assert settings.AXES_FAILURE_LIMIT == settings.BPCONSOLE_LOGIN_FAILURE_LIMIT == 5
    assert settings.AXES_COOLOFF_TIME.total_seconds() == 15 * 60
    # keyed on user name and address together
    assert settings.AXES_LOCKOUT_PARAMETERS == [["username", "ip_address"]]


def test_thirty_wrong_passwords_lock_the_user_out_from_that_address_even_with_the_right_one() -> (
    None
):
    # Given a user, and someone guessing their password from one address
    make_user("vera", "viewer")
    attacker = Client(REMOTE_ADDR=ATTACKER)
    limit = settings.BPCONSOLE_LOGIN_FAILURE_LIMIT
    # When thirty wrong passwords are tried
    answers = [log_in(attacker, "vera", f"guess-{i}") for i in range(30)]
    # Then the first failures are the ordinary "did not match" page, every later one 429
    assert answers[: limit - 1] == [200] * (limit - 1)
    assert answers[limit - 1 :] == [429] * (31 - limit)
    # and now even the right password is refused, with a page saying why and how long
    locked = attacker.post("/login/", {"username": "vera", "password": "pw-vera-123"})
    assert locked.status_code == 429
    assert locked["Retry-After"] == str(settings.BPCONSOLE_LOGIN_COOLOFF_MIN * 60)
    page = locked.content.decode()
    assert 'id="lockout"' in page
    assert "Too many failed log-ins as <strong>vera</strong> from your address" in page
    assert f"locked until {settings.BPCONSOLE_LOGIN_COOLOFF_MIN} minutes after" in page
    assert "even with the right password" in page
    assert "Content-Security-Policy" in locked  # an answer like every other
    assert '<form method="post" action="/login/">' in page  # the login page, not a bare text
    assert attacker.get("/").status_code == 302  # not logged in
    # The same user from another address, and another user from this one, log in
    assert log_in(Client(REMOTE_ADDR="198.51.100.4"), "vera", "pw-vera-123") == 302
    make_user("otto", "operator")
    assert log_in(attacker, "otto", "pw-otto-123") == 302


def test_a_successful_log_in_clears_the_count_of_earlier_failures() -> None:
    make_user("vera", "viewer")
    client = Client()
    limit = settings.BPCONSOLE_LOGIN_FAILURE_LIMIT
    for _ in range(limit - 1):
        assert log_in(client, "vera", "typo") == 200
    assert log_in(client, "vera", "pw-vera-123") == 302
    client.post("/logout/")
    for _ in range(limit - 1):
        assert log_in(client, "vera", "typo") == 200
    assert log_in(client, "vera", "pw-vera-123") == 302


def test_basic_authentication_on_the_api_is_throttled_the_same_way() -> None:
    import base64

    make_user("vera", "viewer")

    def api_as(password: str) -> Any:
        token = base64.b64encode(f"vera:{password}".encode()).decode()
        client = Client(REMOTE_ADDR=ATTACKER, HTTP_AUTHORIZATION=f"Basic {token}")
        return client.get("/api/pipelines/")

    assert api_as("pw-vera-123").status_code == 200
    # When passwords are guessed through the API's HTTP Basic authentication
    answers = [api_as(f"guess-{i}").status_code for i in range(10)]
    # Then the first failures are refusals, and past the limit the pair is locked out
    assert set(answers[: settings.BPCONSOLE_LOGIN_FAILURE_LIMIT - 1]) <= {401, 403}
    assert answers[-1] == 429
    locked = api_as("pw-vera-123")
    assert locked.status_code == 429
    assert "too many failed log-ins as this user" in locked.json()["detail"]
    assert int(locked["Retry-After"]) == settings.BPCONSOLE_LOGIN_COOLOFF_MIN * 60


def test_the_asgi_server_answers_a_lockout_with_the_same_page() -> None:
    from asgiref.sync import async_to_sync
    from django.test import AsyncClient

    # Given a user locked out from one address (through the ASGI handler, as daphne runs it)
    make_user("vera", "viewer")
    client = AsyncClient(REMOTE_ADDR=ATTACKER)

    async def attempt(password: str) -> Any:
        return await client.post("/login/", {"username": "vera", "password": password})

    for i in range(settings.BPCONSOLE_LOGIN_FAILURE_LIMIT):
        async_to_sync(attempt)(f"guess-{i}")
    # When the right password is tried
    locked = async_to_sync(attempt)("pw-vera-123")
    # Then the answer is the lockout page, as through the test client
    assert locked.status_code == 429
    assert 'id="lockout"' in locked.content.decode()
    assert "Content-Security-Policy" in locked
