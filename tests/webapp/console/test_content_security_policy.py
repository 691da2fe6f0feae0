"""Every answer carries a Content-Security-Policy that lets no inline script or style
run and no other site frame a page; the console's own pages need nothing inline."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from django.contrib.auth.models import User
from django.test import Client

from orchestrator.models import Run
from tests.webapp.console.factories import client_for, make_run, reference

pytestmark = [pytest.mark.integration, pytest.mark.django_db]

ROOT = Path(__file__).resolve().parents[3]
REQUIRED = {
    "default-src": "'self'",
    "script-src": "'self'",
    "style-src": "'self'",
    "img-src": "'self' data:",
    "frame-ancestors": "'none'",
    "base-uri": "'self'",
    "form-action": "'self'",
    "object-src": "'none'",
}


def policy_of(response: object) -> dict[str, str]:
    header = response["Content-Security-Policy"]  # type: ignore[index]
    directives = (part.strip().split(" ", 1) for part in header.split(";") if part.strip())
    return {name: value for name, value in directives}


def assert_strict(response: object) -> None:
    policy = policy_of(response)
    for name, value in REQUIRED.items():
        assert policy.get(name) == value, (name, policy)
    # connect-src: the page's own origin and its websocket, nothing else
    assert policy["connect-src"].split() == ["'self'", "ws://testserver"]


def test_every_kind_of_answer_carries_the_policy() -> None:
    # Given a run, a viewer and an admin
    run = make_run(reference())
    Run.objects.filter(pk=run.pk).update(status="running")
    viewer, _ = client_for("vera", "viewer")
    admin = Client()
    admin.force_login(User.objects.create_superuser("root", "", "pw-root-123"))
    anonymous = Client()
    answers = {
        "login page": anonymous.get("/login/"),
        "redirect to log in": anonymous.get("/"),
        "pipelines": viewer.get("/"),
        "pipeline": viewer.get("/pipelines/reference/"),
        "run view": viewer.get(f"/runs/{run.pk}/"),
        "activity": viewer.get("/activity/"),
        "editor (403 for a viewer)": viewer.get("/pipelines/new/"),
        "not found": viewer.get("/pipelines/ghost/"),
        "API JSON": viewer.get("/api/pipelines/"),
        "API refusal": viewer.post(f"/api/runs/{run.pk}/pause/"),
        "API browsable HTML": viewer.get("/api/pipelines/", HTTP_ACCEPT="text/html"),
        "API schema": viewer.get("/api/schema/"),
        "admin": admin.get("/admin/"),
        "admin change list": admin.get("/admin/console/pipeline/"),
        "editor": admin.get("/pipelines/new/"),
        "static file": anonymous.get("/static/console/console.css"),
        "health": anonymous.get("/healthz"),
        "CSRF failure": Client(enforce_csrf_checks=True).post("/login/", {"username": "x"}),
    }
    expected = {
        "redirect to log in": 302,
        "editor (403 for a viewer)": 403,
        "not found": 404,
        "API refusal": 403,
        "CSRF failure": 403,
    }
    for kind, response in answers.items():
        assert response.status_code == expected.get(kind, response.status_code), kind
        assert response.status_code != 500, kind
        assert_strict(response)
    # the admin still renders under the policy (its scripts and styles are static files)
    assert b"Site administration" in answers["admin"].content
    assert answers["static file"].status_code == 200


def test_the_console_pages_need_nothing_the_policy_forbids() -> None:
    # Given every page of the console, rendered
    run = make_run(reference())
    operator, _ = client_for("otto", "operator")
    pages = {
        path: operator.get(path).content.decode()
        for path in (
            "/",
            "/pipelines/reference/",
            f"/runs/{run.pk}/",
            "/activity/",
            "/pipelines/new/",
            "/pipelines/reference/edit/",
        )
    }
    pages["/login/"] = Client().get("/login/").content.decode()
    for path, html in pages.items():
        # no inline style attribute, <style> block, inline handler or inline script
        assert not re.search(r"\sstyle\s*=", html, re.IGNORECASE), path
        assert "<style" not in html.lower(), path
        assert not re.search(r"\son[a-z]+\s*=", html, re.IGNORECASE), path
        for script in re.findall(r"<script\b[^>]*>", html, re.IGNORECASE):
            assert "src=" in script or 'type="application/json"' in script, (path, script)
        assert "javascript:" not in html.lower(), path
    # and the scripts never set a style attribute or write HTML with one
    for script in (ROOT / "webapp/static/console").glob("*.js"):
        code = script.read_text()
        assert not re.search(r"setAttribute\(\s*['\"]style", code), script.name
        assert "cssText" not in code and "innerHTML" not in code, script.name
        assert "eval(" not in code and "new Function" not in code, script.name
