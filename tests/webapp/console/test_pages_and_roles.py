"""Every page needs a logged-in user with the right role."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import Group, User
from django.http import HttpRequest
from django.test import Client

from webapp.console.roles import has_role, role_of

pytestmark = [pytest.mark.integration, pytest.mark.django_db]


def make_user(name: str, role: str | None) -> User:
    user = User.objects.create_user(name, password=f"pw-{name}-123")
    if role:
        user.groups.add(Group.objects.get(name=role))
    return user


def test_login_page_is_served() -> None:
    response = Client().get("/login/")
    assert response.status_code == 200
    assert b"Log in" in response.content


def test_anonymous_is_sent_to_login() -> None:
    response = Client().get("/")
    assert response.status_code == 302
    assert response["Location"].startswith("/login/")


def test_a_user_without_a_role_is_refused() -> None:
    client = Client()
    client.force_login(make_user("nobody", None))
    assert client.get("/").status_code == 403


def test_a_viewer_sees_the_pipelines() -> None:
    client = Client()
    client.force_login(make_user("vera", "viewer"))
    response = client.get("/")
    assert response.status_code == 200
    assert b"Pipelines" in response.content


def test_roles_include_the_ones_below() -> None:
    viewer, operator, admin = (
        make_user("v", "viewer"),
        make_user("o", "operator"),
        make_user("a", "admin"),
    )
    assert [role_of(u) for u in (viewer, operator, admin)] == ["viewer", "operator", "admin"]
    assert has_role(admin, "operator") and has_role(operator, "viewer")
    assert not has_role(viewer, "operator")
    assert not has_role(operator, "admin")


def test_bootstrap_creates_admin_and_the_demo_pipelines_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import io

    from django.core.management import call_command

    monkeypatch.setenv("BPCONSOLE_ADMIN_PASSWORD", "s3cret-admin-pw")
    out = io.StringIO()
    call_command("bootstrap", stdout=out)
    assert "Created user 'admin'" in out.getvalue()
    assert "s3cret-admin-pw" not in out.getvalue()
    assert "Loaded the reference pipeline." in out.getvalue()
    assert "Loaded the running-totals pipeline." in out.getvalue()
    assert "Loaded the landing-demo pipeline." in out.getvalue()
    again = io.StringIO()
    call_command("bootstrap", stdout=again)
    assert again.getvalue() == ""
    client = Client()
    # django-axes throttles log-ins by address: authenticate() needs the request
    assert client.login(request=HttpRequest(), username="admin", password="s3cret-admin-pw")
    page = client.get("/admin/console/pipeline/")
    assert page.status_code == 200
    assert b"reference" in page.content


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("high_water", "0.95", "0.95 is outside [0.6, 0.9]"),
        ("scale_in_busy", "1", "1 is outside (0, 1)"),
        ("scale_in_after_s", "4", "4 is outside [5, 3600]"),
    ],
)
def test_admin_shows_policy_validation_errors_in_the_form(
    field: str, value: str, message: str
) -> None:
    admin = User.objects.create_superuser("root", "", "pw-root-123")
    client = Client()
    client.force_login(admin)
    from webapp.console.models import Policy

    policy = Policy.objects.get(is_default=True)
    before = policy.values()
    form = client.get(f"/admin/console/policy/{policy.pk}/change/")
    assert form.status_code == 200
    assert f'name="{field}"'.encode() in form.content
    data = {k: v for k, v in policy.values().items()}
    data.update({"name": policy.name, "description": "", "is_default": "on", field: value})
    response = client.post(f"/admin/console/policy/{policy.pk}/change/", data)
    assert response.status_code == 200  # the form comes back, not a redirect
    assert message.encode() in response.content
    policy.refresh_from_db()
    assert policy.values() == before
