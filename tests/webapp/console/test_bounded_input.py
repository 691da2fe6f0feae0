"""Bounded documents and bodies (docs/security.md, "Bounded documents"): every entry point
that takes a pipeline document refuses one that is too large, nested too deeply or (YAML)
uses anchors and aliases, with located problems and nothing saved; a body over the cap
or without a length is refused on its headers; an upload is read only for an operator."""

from __future__ import annotations

import asyncio
import base64
import json
import time
from pathlib import Path
from typing import Any

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile
from django.core.management import CommandError, call_command
from django.test import Client

from orchestrator.models import Event
from tests.webapp.console.factories import client_for, make_run, make_user, reference
from tests.webapp.console.test_json_depth import WORST_CASES
from webapp.console.middleware import ROLE_BEFORE_BODY
from webapp.console.models import Pipeline

pytestmark = [pytest.mark.integration, pytest.mark.django_db]

# Like the reported attack (525 bytes of YAML, a 72 MB answer after 11 s): a few hundred
# bytes whose aliases expand to 9^9 strings.
ALIAS_BOMB = (
    'a: &a ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]\n'
    "b: &b [*a,*a,*a,*a,*a,*a,*a,*a,*a]\n"
    "c: &c [*b,*b,*b,*b,*b,*b,*b,*b,*b]\n"
    "d: &d [*c,*c,*c,*c,*c,*c,*c,*c,*c]\n"
    "e: &e [*d,*d,*d,*d,*d,*d,*d,*d,*d]\n"
    "f: &f [*e,*e,*e,*e,*e,*e,*e,*e,*e]\n"
    "g: &g [*f,*f,*f,*f,*f,*f,*f,*f,*f]\n"
    "h: &h [*g,*g,*g,*g,*g,*g,*g,*g,*g]\n"
    "i: &i [*h,*h,*h,*h,*h,*h,*h,*h,*h]\n"
)
BRACKETS = "[" * 100_000  # Python's json module raises RecursionError on these
DEEP_YAML = "name: deep\nnodes: " + "[" * 40 + "]" * 40 + "\n"


def _post_json(client: Client, path: str, body: Any, method: str = "post") -> Any:
    data = body if isinstance(body, str) else json.dumps(body)
    return getattr(client, method)(path, data, content_type="application/json")


def _problems(response: Any) -> dict[str, str]:
    body = response.json()
    assert isinstance(body["detail"], str) and body["detail"]
    return {p["location"]: p["message"] for p in body["problems"]}


def test_a_yaml_alias_bomb_is_refused_at_once_with_where_the_alias_is() -> None:
    client, _ = client_for("otto", "operator")
    # Given an alias bomb like the reported one
    assert len(ALIAS_BOMB) < 600
    # When an operator imports it through the API
    started = time.monotonic()
    response = _post_json(client, "/api/pipelines/import/", {"yaml": ALIAS_BOMB})
    elapsed = time.monotonic() - started
    # Then it is a small 400 at once, naming the first anchor's line and column
    assert response.status_code == 400
    assert elapsed < 1.0
    assert len(response.content) < 1000
    assert _problems(response) == {"line 1, column 4": "anchors and aliases are not allowed"}
    assert not Pipeline.objects.exists()


def test_an_alias_bomb_on_the_import_page_opens_the_editor_with_the_problem() -> None:
    operator, _ = client_for("otto", "operator")
    # When the bomb is pasted into the import form
    started = time.monotonic()
    response = operator.post("/pipelines/import/", {"yaml": ALIAS_BOMB})
    # Then the editor comes back (400) with the located problem, and nothing is saved
    assert time.monotonic() - started < 1.0
    assert response.status_code == 400
    assert b"anchors and aliases are not allowed" in response.content
    assert not Pipeline.objects.exists()


def test_deep_nesting_is_a_located_400_on_every_document_entry_point_never_a_500() -> None:
    reference()
    operator, _ = client_for("otto", "operator")
    viewer, _ = client_for("vera", "viewer")
    # Given 100,000 nested brackets (JSON) and 40 nested flow lists (YAML)
    cases = [
        (operator, "/api/pipelines/", BRACKETS, "post"),
        (operator, "/api/pipelines/reference/", BRACKETS, "put"),
        (viewer, "/api/pipelines/validate/", BRACKETS, "post"),
        (operator, "/api/runs/", BRACKETS, "post"),
        (operator, "/api/pipelines/import/", {"yaml": DEEP_YAML}, "post"),
        (operator, "/api/pipelines/import/", {"yaml": "[" * 100_000}, "post"),
    ]
    for client, path, body, method in cases:
        # When each is sent where a document is taken
        response = _post_json(client, path, body, method)
        # Then the answer is 400 with the documented detail and located problems
        assert response.status_code == 400, (path, response.content[:200])
        problems = _problems(response)
        assert any("nested more than 32 levels deep" in m for m in problems.values()), problems
        assert all(
            loc.startswith("line 1, column") or loc.startswith("line 2, column") for loc in problems
        ), problems
    # and nothing was saved or changed
    assert list(Pipeline.objects.values_list("name", flat=True)) == ["reference"]


@pytest.mark.parametrize("body", WORST_CASES.values(), ids=WORST_CASES.keys())
def test_a_viewers_largest_hostile_document_is_answered_within_a_second(body: str) -> None:
    viewer, _ = client_for("vera", "viewer")
    # Given a body as large as a document may be, built to make a scan backtrack (20,000
    # backslash-quote pairs held the request 10 s; this is thirteen times as many)
    assert len(body.encode()) <= 512 * 1024
    # When a viewer sends it to be validated
    started = time.monotonic()
    response = _post_json(viewer, "/api/pipelines/validate/", body)
    elapsed = time.monotonic() - started
    # Then the answer (a located 400, or 200 saying what is wrong) comes within a second
    assert response.status_code in (200, 400), response.content[:200]
    assert elapsed < 1.0, elapsed


def test_a_user_without_a_role_is_refused_before_the_body_is_parsed() -> None:
    client, _ = client_for("nobody", None)
    # When a logged-in user without a role sends 100,000 brackets as a new pipeline
    response = _post_json(client, "/api/pipelines/", BRACKETS)
    # Then it is the role's 403, not a parse (and no RecursionError's 500)
    assert response.status_code == 403
    assert "operator role" in response.json()["detail"]


def test_a_document_over_the_size_cap_is_refused_with_its_size(settings: Any) -> None:
    # Given a cap of 4 KB
    settings.BPCONSOLE_MAX_DOCUMENT_KB = 4
    operator, _ = client_for("otto", "operator")
    doc = {"name": "big", "description": "x" * 5000, "nodes": [], "edges": []}
    # When a 5 KB document is sent as JSON, as YAML, and through the editor
    as_json = _post_json(operator, "/api/pipelines/", doc)
    as_yaml = _post_json(operator, "/api/pipelines/import/", {"yaml": json.dumps(doc)})
    editor = operator.post("/pipelines/new/", {"document": json.dumps(doc)})
    # Then each is a 400 saying how large it may be, and nothing is saved
    for response in (as_json, as_yaml):
        assert response.status_code == 400
        assert "at most 4096 bytes" in _problems(response)["(document)"]
    assert editor.status_code == 400
    assert b"at most 4096 bytes" in editor.content
    assert not Pipeline.objects.filter(name="big").exists()


def test_nul_characters_and_non_finite_numbers_are_located_problems_not_500s() -> None:
    operator, _ = client_for("otto", "operator")
    # When a document holds a NUL character or an out-of-range number (PostgreSQL
    # stores neither) or YAML's .nan
    nul = _post_json(operator, "/api/pipelines/", '{"name": "a\\u0000b", "nodes": [1e999]}')
    yaml_nan = "name: n\nnodes: [{name: a, kind: source, buffer_mb: .nan}]\n"
    nan = _post_json(operator, "/api/pipelines/import/", {"yaml": yaml_nan})
    # Then each is a 400 naming where it is
    assert nul.status_code == 400
    assert _problems(nul) == {
        "name": "contains a NUL character, which cannot be stored",
        "nodes[0]": "must be a finite number, got inf",
    }
    assert nan.status_code == 400
    assert "must be a finite number" in _problems(nan)["nodes[0].buffer_mb"]
    assert not Pipeline.objects.exists()


def test_the_editor_refuses_a_deep_document_with_the_problem_and_saves_nothing() -> None:
    operator, _ = client_for("otto", "operator")
    # When the editor's form carries 100,000 nested brackets
    response = operator.post("/pipelines/new/", {"document": BRACKETS})
    # Then the editor comes back (400) with the located problem
    assert response.status_code == 400
    assert b"nested more than 32 levels deep" in response.content
    assert not Pipeline.objects.exists()


def test_load_topology_refuses_an_alias_bomb_a_deep_file_and_an_oversized_file(
    tmp_path: Path, settings: Any
) -> None:
    bomb, deep, big = tmp_path / "bomb.yaml", tmp_path / "deep.yaml", tmp_path / "big.yaml"
    bomb.write_text(ALIAS_BOMB)
    deep.write_text(DEEP_YAML)
    settings.BPCONSOLE_MAX_DOCUMENT_KB = 1
    big.write_text("name: big\ndescription: " + "x" * 2000 + "\n")
    # When each file is loaded with the command
    for path, words in [
        (bomb, "line 1, column 4: anchors and aliases are not allowed"),
        (deep, "nested more than 32 levels deep"),
        (big, "at most 1024 bytes"),
    ]:
        # Then it fails with the located problem and saves nothing
        with pytest.raises(CommandError, match=words):
            call_command("load_topology", str(path))
    assert not Pipeline.objects.exists()


# -- bodies: refused on their headers --------------------------------------------------

FIVE_MB = 5 * 1024 * 1024


def test_a_viewers_5_mb_upload_is_refused_at_once_and_nothing_is_parsed() -> None:
    viewer, _ = client_for("vera", "viewer")
    upload = SimpleUploadedFile("big.yaml", b"name: big\n" + b"#" * FIVE_MB)
    # When a viewer uploads 5 MB to the import page (it took 32 s to refuse)
    started = time.monotonic()
    response = viewer.post("/pipelines/import/", {"file": upload})
    elapsed = time.monotonic() - started
    # Then the role's 403 comes in well under a second, and nothing is saved
    assert response.status_code == 403
    assert elapsed < 1.0
    assert b"operator role" in response.content
    assert not Pipeline.objects.exists()


def test_the_api_import_checks_the_role_before_the_body_for_session_and_basic_auth() -> None:
    viewer, _ = client_for("vera", "viewer")
    make_user("otto", "operator")
    big = json.dumps({"yaml": "#" * FIVE_MB})
    # When a viewer (session) and a user with wrong Basic credentials send 5 MB
    refused = _post_json(viewer, "/api/pipelines/import/", big)
    wrong = Client().post(
        "/api/pipelines/import/",
        big,
        content_type="application/json",
        HTTP_AUTHORIZATION=_basic("otto", "not-the-password"),
    )
    anonymous = _post_json(Client(), "/api/pipelines/import/", big)
    # Then each is a JSON 403 before anything reads the body
    for response in (refused, wrong, anonymous):
        assert response.status_code == 403
        assert response.json()["detail"]
    assert "operator role" in refused.json()["detail"]
    # while an operator's right Basic credentials reach the size check: 413
    right = Client().post(
        "/api/pipelines/import/",
        big,
        content_type="application/json",
        HTTP_AUTHORIZATION=_basic("otto", "pw-otto-123"),
    )
    assert right.status_code == 413


def _basic(user: str, password: str) -> str:
    return "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()


def test_an_operators_oversized_body_is_a_413_on_the_page_and_the_api() -> None:
    operator, _ = client_for("otto", "operator")
    upload = SimpleUploadedFile("big.yaml", b"#" * FIVE_MB)
    # When an operator sends 5 MB to the import page, the API and the editor
    page = operator.post("/pipelines/import/", {"file": upload})
    api = _post_json(operator, "/api/pipelines/", json.dumps({"name": "x" * FIVE_MB}))
    editor = operator.post("/pipelines/new/", {"document": "x" * FIVE_MB})
    # Then each is a 413 (a page for the pages, JSON under /api/) naming the cap
    assert page.status_code == 413
    assert b"BPCONSOLE_MAX_DOCUMENT_KB" in page.content
    assert editor.status_code == 413
    assert api.status_code == 413
    assert "BPCONSOLE_MAX_DOCUMENT_KB" in api.json()["detail"]
    assert not Pipeline.objects.exists()


def test_a_body_without_a_content_length_is_refused() -> None:
    operator, _ = client_for("otto", "operator")
    # When a chunked body comes without a Content-Length
    response = operator.generic("POST", "/api/pipelines/", HTTP_TRANSFER_ENCODING="chunked")
    # Then it is refused (411) on its headers
    assert response.status_code == 411
    assert "Content-Length" in response.json()["detail"]


# -- save_pipeline: policy_overrides of the wrong type --------------------------------


@pytest.mark.parametrize("overrides", [["high_water", 0.8], "high_water=0.8", 7])
def test_policy_overrides_that_are_not_a_mapping_are_a_located_400(overrides: Any) -> None:
    reference()
    operator, _ = client_for("otto", "operator")
    admin, _ = client_for("ada", "admin")
    doc = operator.get("/api/pipelines/reference/").json()["document"]
    doc["policy_overrides"] = overrides
    for client in (operator, admin):
        # When an operator or an admin saves a document whose overrides are not a mapping
        response = _post_json(client, "/api/pipelines/reference/", doc, "put")
        # Then it is a 400 pointing at policy_overrides (it was a 500), nothing saved
        assert response.status_code == 400, response.content
        assert _problems(response) == {"policy_overrides": "must be a mapping of parameter: value"}
    assert Pipeline.objects.get(name="reference").policy_overrides == {}


def test_values_of_the_wrong_type_anywhere_are_located_problems_not_500s() -> None:
    operator, _ = client_for("otto", "operator")
    doc = {
        "name": "typed",
        "description": ["not", "text"],
        "nodes": [
            {"name": "in", "kind": "source", "operator": ["read"]},
            {
                "name": "mid",
                "kind": "operator",
                "stage": {"x": 1},
                "operator": "filter",
                "params": {"condition": "value > 0"},
            },
            {"name": "out", "kind": "sink", "buffer_mb": "10"},
        ],
        "edges": [{"from": ["in"], "to": "mid"}, {"from": "mid", "to": "out"}],
    }
    # When a document has lists and mappings where names and text belong
    response = _post_json(operator, "/api/pipelines/", doc)
    # Then each is reported where it is
    assert response.status_code == 400, response.content
    problems = _problems(response)
    assert problems["description"].startswith("must be text")
    assert problems["nodes[0] (in).operator"].startswith("must be an operator's name")
    assert problems["nodes[1] (mid).stage"].startswith("must be a stage name")
    assert problems["nodes[2] (out).buffer_mb"] == "must be a number, got '10'"
    assert problems["edges[0].from"].startswith("unknown node")
    assert not Pipeline.objects.exists()


# -- under ASGI: the same bounds before Django's handler receives the body -------------


def _asgi(headers: list[tuple[bytes, bytes]], chunks: list[bytes], path: str) -> dict[str, Any]:
    """Run BoundedBodyASGI around an application that reads the whole body."""
    from webapp.console.middleware import BoundedBodyASGI

    seen: dict[str, Any] = {"called": False, "body": b"", "disconnected": False, "sent": []}
    incoming = [
        {"type": "http.request", "body": c, "more_body": i < len(chunks) - 1}
        for i, c in enumerate(chunks)
    ]

    async def receive() -> dict[str, Any]:
        return incoming.pop(0) if incoming else {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        seen["sent"].append(message)

    async def app(scope: Any, receive: Any, send: Any) -> None:
        seen["called"] = True
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                seen["disconnected"] = True
                return
            seen["body"] += message.get("body", b"")
            if not message.get("more_body"):
                return

    scope = {"type": "http", "method": "POST", "path": path, "headers": headers}
    asyncio.run(BoundedBodyASGI(app)(scope, receive, send))
    return seen


def test_under_asgi_an_oversized_or_chunked_body_is_refused_before_it_is_received(
    settings: Any,
) -> None:
    settings.BPCONSOLE_MAX_BODY_BYTES = 1000
    # When a request declares 5 MB, or comes chunked without a length
    big = _asgi([(b"content-length", str(FIVE_MB).encode())], [b"x" * 10], "/api/pipelines/")
    chunked = _asgi([(b"transfer-encoding", b"chunked")], [b"x" * 10], "/pipelines/import/")
    # Then the application never runs: 413 (JSON under /api/) and 411
    assert not big["called"] and not chunked["called"]
    assert big["sent"][0]["status"] == 413
    assert json.loads(big["sent"][1]["body"])["detail"].startswith("the request body has")
    assert chunked["sent"][0]["status"] == 411
    # When a body grows past the cap although its length said otherwise
    lying = _asgi([(b"content-length", b"10")], [b"x" * 600, b"x" * 600], "/api/runs/")
    # Then the application sees the client go away instead of the rest of the body
    assert lying["called"] and lying["disconnected"]
    assert len(lying["body"]) == 600
    # and a body within the cap passes untouched
    small = _asgi([(b"content-length", b"5")], [b"hello"], "/api/runs/")
    assert small["body"] == b"hello" and not small["sent"]


# -- the role before the body, on every address ---------------------------------------

# A body each parser refuses (400) if it reads it: JSON nested too deep for the API, a
# multipart form whose boundary never comes for the pages (Django's CSRF check reads
# request.POST before any view).
HOSTILE_JSON = ("application/json", BRACKETS)
HOSTILE_FORM = ("multipart/form-data; boundary=never", "--elsewhere\r\n" + "x" * 10_000)
TAKES_A_BODY_FROM_ANYONE = {"login", "logout"}


def _addresses(run_id: int) -> list[tuple[str, str]]:
    """Every URL the console and the API answer (not the admin), by name, with real
    arguments: the reference pipeline, a run of it, a lab that does not exist."""
    from django.urls import URLPattern, get_resolver, reverse

    samples = {"name": "reference", "run_id": run_id, "lab_id": 999_999}
    found = []
    for pattern in get_resolver().url_patterns:
        if not isinstance(pattern, URLPattern) or pattern.name is None:
            continue  # the admin's include
        if pattern.name in TAKES_A_BODY_FROM_ANYONE:
            continue
        wanted = {k: samples[k] for k in pattern.pattern.regex.groupindex}
        found.append((pattern.name, reverse(pattern.name, kwargs=wanted)))
    return found


@pytest.mark.parametrize("role", [None, "viewer"])
def test_every_address_checks_the_role_before_anything_reads_the_body(role: str | None) -> None:
    run = make_run()
    client, user = client_for("rhea", role)
    addresses = _addresses(run.pk)
    assert len(addresses) > 30, addresses  # every page and API operation is in the list
    for name, path in addresses:
        kind, body = HOSTILE_JSON if path.startswith("/api/") else HOSTILE_FORM
        for method in ("post", "put", "patch", "delete"):
            # When a user without the role the address needs sends a body that a parser
            # would refuse
            response = getattr(client, method)(path, body, content_type=kind)
            # Then the answer is the role's 403, or 405 where no body is taken, never the
            # parser's 400: nothing read the body
            allowed = {403, 405}
            if role == "viewer" and name == "api-validate" and method == "post":
                allowed = {400}  # a viewer may validate: the document is read, and refused
            assert response.status_code in allowed, (name, method, response.content[:300])
    # and each refusal was recorded, without a word of the body
    refusals = Event.objects.filter(kind="action_refused", user=user)
    assert refusals.exists()
    assert not any("[[[" in str(e.data) or "xxxx" in str(e.data) for e in refusals)


@pytest.mark.parametrize("role", [None, "viewer"])
def test_each_view_checks_the_role_before_it_reads_the_body_on_its_own(
    role: str | None, settings: Any
) -> None:
    # Given the console without BoundedRequestMiddleware (a view must not rely on it)
    settings.MIDDLEWARE = [
        m for m in settings.MIDDLEWARE if not m.endswith(".BoundedRequestMiddleware")
    ]
    run = make_run()
    client, _ = client_for("rhea", role)
    for name, path in _addresses(run.pk):
        if name not in ROLE_BEFORE_BODY or (role == "viewer" and name == "api-validate"):
            continue
        kind, body = HOSTILE_JSON if path.startswith("/api/") else HOSTILE_FORM
        method = "put" if name == "api-pipeline" else "post"
        # When a user without the role sends the view a body a parser would refuse
        response = getattr(client, method)(path, body, content_type=kind)
        # Then the view answers with the role's 403, not the parser's 400
        assert response.status_code == 403, (name, response.content[:300])
