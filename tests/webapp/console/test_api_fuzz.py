"""Schemathesis against the JSON API, in-process (docs/api.md is the contract).

Every operation of the API's OpenAPI schema (generated in-process by drf-spectacular,
the same generator /api/schema/ serves) is called with cases Schemathesis derives from
the schema (its examples, coverage and fuzzing phases: valid and invalid bodies,
parameters and ids), as an operator and as a viewer, through the WSGI application
(webapp.wsgi.application) with HTTP Basic credentials. Each answer must

- never be a server error (``not_a_server_error``);
- have a status code the schema lists for the operation (``status_code_conformance``),
  the content type it gives (``content_type_conformance``) and its shape
  (``response_schema_conformance``): every 4xx a JSON object with ``detail``, 400s of
  document endpoints with ``problems``.

Then the same checks for bodies no schema derives, built to make the request's checks
slow (backslash-quote pairs, strings that never close, deep brackets), on every
operation that takes a body, each answered within a second of CPU.

No check is relaxed. The examples are bounded (``MAX_EXAMPLES`` per operation and
phase) and derandomized, so a run is repeatable and takes about a minute.

The world the calls meet: the reference pipeline and one pending run of it. Half of the
generated run ids and pipeline names are pointed at these (the other half stay as
generated, mostly unknown ids: 404s), so that the operations reach the code behind the
lookups, not only the 404. Runs the fuzzer starts are created but never handed to a
worker (``no_start``): the session's real workers may be up for other tests, and they
could not see the fuzzed run's rows, which are never committed.
"""

from __future__ import annotations

import base64
import json
import re
import time
from collections.abc import Iterator
from typing import Any

import pytest
import schemathesis
from drf_spectacular.generators import SchemaGenerator
from drf_spectacular.renderers import OpenApiJsonRenderer
from hypothesis import HealthCheck, settings
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from tests.webapp.console.factories import make_run, make_user, reference
from tests.webapp.console.test_json_depth import WORST_CASES

pytestmark = [pytest.mark.integration]

MAX_EXAMPLES = 10
CHECKS = [
    not_a_server_error,
    status_code_conformance,
    content_type_conformance,
    response_schema_conformance,
]
CONFIG = schemathesis.Config.from_dict(
    {
        "generation": {
            "max-examples": MAX_EXAMPLES,
            "deterministic": True,
            # Credentials are the test's (below); generated Authorization headers would
            # only test DRF's parsing of them, as someone without a login.
            "with-security-parameters": False,
        },
    }
)
USERS = {"operator": "otto", "viewer": "vera"}


def _api_schema() -> Any:
    """The schema, generated as /api/schema/ generates it, as plain JSON.

    Generated at collection (no database then), not fetched from /api/schema/ by a
    fixture: Schemathesis' lazy loader (schemathesis.pytest.from_fixture) reads
    ``Function._nodeid``, which pytest 9.2 no longer has. test_api_contract.py checks
    what /api/schema/ serves to whom."""
    generated = SchemaGenerator().get_schema(request=None, public=True)
    return json.loads(OpenApiJsonRenderer().render(generated, renderer_context={}))


SCHEMA = schemathesis.openapi.from_dict(_api_schema(), config=CONFIG)


def _basic(role: str) -> dict[str, str]:
    name = USERS[role]
    token = base64.b64encode(f"{name}:pw-{name}-123".encode()).decode()
    return {"Authorization": f"Basic {token}"}


@pytest.fixture
def world(db: None, no_start: list[int]) -> Iterator[dict[str, Any]]:
    """The reference pipeline, one pending run, an operator and a viewer.

    The calls go through the WSGI application, inside the test's transaction, rolled back
    at its end (a flush per operation and role had been a third of this test's time). So
    the connection must outlive each request: Django closes it on the request signals
    unless it is in autocommit mode, which a transaction is not, and Django's own test
    client takes the same handler off them while it calls the application."""
    from django.core.signals import request_finished, request_started
    from django.db import close_old_connections

    from webapp.wsgi import application

    for role, name in USERS.items():
        make_user(name, role)
    world = {"run": make_run(reference()).pk, "pipeline": "reference", "app": application}
    request_started.disconnect(close_old_connections)
    request_finished.disconnect(close_old_connections)
    try:
        yield world
    finally:
        request_started.connect(close_old_connections)
        request_finished.connect(close_old_connections)


def _aim(case: Any, world: dict[str, Any]) -> None:
    """Point half of the generated ids and names (deterministically: even ids, names of
    even length) at the run and pipeline that exist."""
    params = case.path_parameters or {}
    run_id = params.get("run_id")
    if isinstance(run_id, int) and not isinstance(run_id, bool) and run_id % 2 == 0:
        params["run_id"] = world["run"]
    name = params.get("name")
    if isinstance(name, str) and len(name) % 2 == 0:
        params["name"] = world["pipeline"]


# One world per operation, shared by its examples on purpose: a server keeps what earlier
# calls did (a stopped run stays stopped) and answers the next call from there. Setting
# it up per example would cost a database flush each, for no case the schema does not
# already cover. Hypothesis warns about function-scoped fixtures for that reason.
SHARED_WORLD = settings(suppress_health_check=[HealthCheck.function_scoped_fixture])


def _call(case: Any, world: dict[str, Any], role: str) -> None:
    # ``app``: Schemathesis' WSGI transport calls the application in-process.
    case.call_and_validate(app=world["app"], headers=_basic(role), checks=CHECKS)


@SCHEMA.parametrize()
@SHARED_WORLD
def test_every_operation_as_an_operator_answers_as_documented(
    case: Any, world: dict[str, Any]
) -> None:
    # Given an operator's credentials and a pipeline and run to aim at
    _aim(case, world)
    # When Schemathesis calls the operation / Then the answer is no 5xx and conforms
    _call(case, world, "operator")


@SCHEMA.parametrize()
@SHARED_WORLD
def test_every_operation_as_a_viewer_answers_as_documented(
    case: Any, world: dict[str, Any]
) -> None:
    # Given a viewer's credentials (every change is a documented 403)
    _aim(case, world)
    # When Schemathesis calls the operation / Then the answer is no 5xx and conforms
    _call(case, world, "viewer")


# Bodies built to make a scan backtrack or a parser recurse, as large as a document may
# be (tests/webapp/console/test_json_depth.py): each is answered as documented, within
# a second of CPU, by every operation that takes a body.
HOSTILE_BODIES = {name: text.encode() for name, text in WORST_CASES.items()}


def _operations_with_a_body() -> list[Any]:
    operations = [result.ok() for result in SCHEMA.get_all_operations()]
    return [op for op in operations if op.body and op.method.upper() in {"POST", "PUT"}]


@pytest.mark.parametrize("role", ["operator", "viewer"])
@pytest.mark.parametrize("body", HOSTILE_BODIES.values(), ids=HOSTILE_BODIES.keys())
def test_hostile_bodies_are_answered_as_documented_and_at_once(
    world: dict[str, Any], role: str, body: bytes
) -> None:
    operations = _operations_with_a_body()
    assert len(operations) >= 8, [op.label for op in operations]
    arguments = {"run_id": world["run"], "name": world["pipeline"], "lab_id": 1}
    for operation in operations:
        names = re.findall(r"{(\w+)}", operation.path)
        case = operation.Case(
            path_parameters={name: arguments[name] for name in names},
            body=body,
            media_type="application/json",
        )
        # When the body is sent to the operation (timed in this process's CPU seconds:
        # the work the answer took, not the wait for a core the suite's Spark jobs share)
        started = time.process_time()
        response = case.call(app=world["app"], headers=_basic(role))
        elapsed = time.process_time() - started
        # Then the answer is quick and conforms (no 5xx, a documented status and shape)
        assert elapsed < 1.0, (operation.label, elapsed)
        case.validate_response(response, checks=CHECKS)
