"""The API keeps its documented shape (docs/api.md, "Errors"): every 4xx under /api/ is a
JSON object with ``detail``, a 400 about a document lists its ``problems``, unknown or
malformed ids are JSON 404s, and the schema is for users with a role."""

from __future__ import annotations

import pytest
from django.test import Client

from tests.webapp.console.factories import client_for, make_run, reference

pytestmark = [pytest.mark.integration, pytest.mark.django_db]


def test_the_schema_needs_the_viewer_role() -> None:
    nobody, _ = client_for("nobody", None)
    viewer, _ = client_for("vera", "viewer")
    # When a logged-in user without a role, and a viewer, ask for the schema
    refused = nobody.get("/api/schema/", HTTP_ACCEPT="application/json")
    served = viewer.get("/api/schema/", HTTP_ACCEPT="application/json")
    # Then the first is refused as everywhere under /api/, the second gets it
    assert refused.status_code == 403
    assert refused.json()["detail"]
    assert served.status_code == 200
    assert "/api/runs/{run_id}/" in served.json()["paths"]
    assert Client().get("/api/schema/").status_code == 403


@pytest.mark.parametrize(
    "path",
    [
        "/api/runs/abc/",
        "/api/runs/1.5/snapshot/",
        "/api/runs/-3/events/",
        "/api/runs/99999999999999999999999/",  # more digits than a run id has
        "/api/pipelines/a%00b/yaml/",  # a NUL in a name: was a database error
        "/api/no-such-endpoint/",
    ],
)
def test_an_address_that_matches_nothing_under_api_is_a_json_404(path: str) -> None:
    viewer, _ = client_for("vera", "viewer")
    # When a viewer asks for an id that is not a run id, or a name that is not a name
    response = viewer.get(path)
    # Then the answer is the API's JSON 404, not the HTML page
    assert response.status_code == 404
    assert response["Content-Type"] == "application/json"
    assert "not found" in response.json()["detail"]


def test_pages_keep_their_html_404_and_a_huge_run_id_is_one() -> None:
    # (a guard: the JSON 404s are for /api/ only)
    viewer, _ = client_for("vera", "viewer")
    response = viewer.get("/runs/99999999999999999999999/")
    assert response.status_code == 404
    assert b"<html" in response.content


def test_a_run_that_does_not_exist_is_a_json_404_on_every_run_endpoint() -> None:
    # (a guard: the largest id the URLs take still reaches the view, which says why)
    operator, _ = client_for("otto", "operator")
    for method, suffix in [
        ("get", ""),
        ("get", "snapshot/"),
        ("get", "completion/"),
        ("get", "events/"),
        ("post", "pause/"),
        ("post", "migrate/"),
        ("post", "adjust/"),
    ]:
        path = f"/api/runs/999999999999999999/{suffix}"
        if method == "post":
            response = operator.post(path, {"node": "task1"}, content_type="application/json")
        else:
            response = operator.get(path)
        assert response.status_code == 404, suffix
        assert "there is no run" in response.json()["detail"]


def test_a_bad_import_payload_is_a_400_with_problems() -> None:
    operator, _ = client_for("otto", "operator")
    # When the import gets no yaml field, or a body that is not a mapping
    for body in ({"yml": "name: x"}, ["name: x"]):
        response = operator.post("/api/pipelines/import/", body, content_type="application/json")
        # Then it is a 400 with detail and located problems (it had no problems)
        assert response.status_code == 400
        assert response.json()["detail"]
        assert response.json()["problems"], response.json()


def test_a_nul_in_a_query_filter_is_a_400_and_huge_ids_match_nothing() -> None:
    run = make_run(reference())
    viewer, _ = client_for("vera", "viewer")
    # When filters carry a NUL character (the database refuses to compare with one)
    for path in (
        "/api/runs/?status=run%00ning",
        "/api/runs/?pipeline=ref%00",
        "/api/events/?kind=x%00",
        f"/api/runs/{run.pk}/events/?node=task%001",
    ):
        response = viewer.get(path)
        # Then the answer is a 400 naming the parameter (it was a 500)
        assert response.status_code == 400, path
        assert "NUL" in response.json()["detail"]
    # and ids beyond a bigint simply match nothing (a guard)
    for path in ("/api/events/?since=" + "9" * 30, "/api/events/?run=" + "9" * 30):
        response = viewer.get(path)
        assert response.status_code == 200, path
        assert response.json() == []
