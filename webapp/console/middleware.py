"""Request bodies: bounded, and read only for a user with the role the request needs.

Django's CsrfViewMiddleware reads ``request.POST`` (and so parses a whole form or
multipart upload) before any view runs, REST framework's session authentication does the
same before a view's permissions, and a view that parses first and checks the role
after lets anyone with a login make the server work. This middleware runs before all of
them (it sits after AuthenticationMiddleware, whose user it needs; the CSRF check runs
later, in ``process_view``) and looks only at the request's headers:

- a request that may carry a body (any method but GET, HEAD, OPTIONS, TRACE) to a URL
  of ``ROLE_BEFORE_BODY`` from a user without the role it needs is refused with 403
  (recorded, as every refused action is; anonymous users of the pages go to the login
  page) before anything reads the body, whatever it holds; such a request to any other
  URL of the console or the API, which take no body, is a 405. Only the login and logout
  pages and Django's admin (which checks its own users) take a body without a role (a
  test sends every URL a body that would be a 400 if parsed);
- then, on every path, a body larger than ``BPCONSOLE_MAX_BODY_BYTES`` (by its
  Content-Length) is refused with 413, a body without a Content-Length (chunked) with
  411, an unreadable Content-Length with 400.

Answers under ``/api/`` are JSON ``{"detail": ...}``; the pages get a page.

Under ASGI (daphne, the production server) Django's handler receives the whole body,
spooling it to a temporary file, before any middleware runs. ``BoundedBodyASGI`` applies
the same size rules in front of it, on the headers and on the bytes as they arrive, so
that an oversized or chunked body is refused before it is received. It takes effect
once webapp/asgi.py wraps the HTTP application with it:
``"http": BoundedBodyASGI(django_asgi_app)``.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, cast

from django.conf import settings
from django.contrib.auth.views import redirect_to_login
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import render
from django.urls import Resolver404, resolve
from rest_framework.authentication import BaseAuthentication, SessionAuthentication
from rest_framework.exceptions import APIException
from rest_framework.settings import api_settings

from webapp.console import actions
from webapp.console.roles import Role, has_role


@dataclass(frozen=True)
class Needs:
    """The role a request to one URL needs before its body is read, and the action its
    refusal is recorded as (actions.require)."""

    role: Role
    action: str


# By URL name. The action of a refusal is what the URL says; what the body asked (a
# node, a pipeline's name) is not known, since it is never read.
ROLE_BEFORE_BODY: dict[str, Needs] = {
    # pages
    "pipeline-new": Needs("operator", "edit_pipeline"),
    "pipeline-edit": Needs("operator", "edit_pipeline"),
    "pipeline-import": Needs("operator", "edit_pipeline"),
    "run-start": Needs("operator", "start_run"),
    "lab-create": Needs("operator", "run_policy_lab"),
    "lab-start": Needs("operator", "start_run"),
    # the API
    "api-pipelines": Needs("operator", "edit_pipeline"),
    "api-pipeline": Needs("operator", "edit_pipeline"),
    "api-validate": Needs("viewer", "validate_pipeline"),
    "api-import": Needs("operator", "edit_pipeline"),
    "api-sample-schema": Needs("operator", "sample_input"),
    "api-labs": Needs("operator", "run_policy_lab"),
    "api-lab-runs": Needs("operator", "start_run"),
    "api-runs": Needs("operator", "start_run"),
    "api-pause": Needs("operator", "pause_run"),
    "api-resume": Needs("operator", "resume_run"),
    "api-stop": Needs("operator", "stop_run"),
    "api-cancel": Needs("operator", "cancel_run"),
    "api-migrate": Needs("operator", "migrate"),
    "api-stop-migrating": Needs("operator", "stop_migrating"),
    "api-adjust": Needs("operator", "adjust"),
}
# URLs that take a body from anyone: logging in and out. Django's admin checks its own
# users (staff) and is not listed either way.
BODY_FROM_ANYONE = ("login", "logout")
SAFE_METHODS = {"GET", "HEAD", "OPTIONS", "TRACE"}


def is_api(request: HttpRequest) -> bool:
    return request.path_info.startswith("/api/")


def _refuse(request: HttpRequest, status: int, message: str) -> HttpResponse:
    if is_api(request):
        return JsonResponse({"detail": message}, status=status)
    return render(request, "console/body_refused.html", {"message": message}, status=status)


def body_refusal(request: HttpRequest) -> HttpResponse | None:
    """413, 411 or 400 for a body the console does not read; None when it may."""
    headers = {
        b"content-length": request.META.get("CONTENT_LENGTH") or None,
        b"transfer-encoding": request.META.get("HTTP_TRANSFER_ENCODING") or None,
    }
    given = {name: value.encode("latin-1", "replace") for name, value in headers.items() if value}
    refusal = _declared_refusal(given, settings.BPCONSOLE_MAX_BODY_BYTES)
    return None if refusal is None else _refuse(request, *refusal)


def _api_user(request: HttpRequest) -> Any:
    """The session's user, or for a script on the API the user of its credentials
    (HTTP Basic): REST framework's own authentication classes, which read headers only
    and apply the login throttling; the view checks them again."""
    user = request.user
    if user.is_authenticated:
        return user
    # drf-stubs type this setting as the dotted paths it is written as; api_settings
    # imports them, so it holds the classes.
    authenticators = cast(
        "Sequence[type[BaseAuthentication]]", api_settings.DEFAULT_AUTHENTICATION_CLASSES
    )
    for authenticator_class in authenticators:
        if issubclass(authenticator_class, SessionAuthentication):
            continue  # the session's user is request.user, above
        # drf-stubs want DRF's Request; the header-only authenticators left here (HTTP
        # Basic) read request.META, which Django's request has, before DRF wraps it.
        found = authenticator_class().authenticate(request)  # type: ignore[arg-type]
        if found is not None:
            return found[0]
    return user


def role_refusal(
    request: HttpRequest, needs: Needs, kwargs: Mapping[str, Any]
) -> HttpResponse | None:
    """403 (or the login page) for a request from someone without the role ``needs``
    says, recorded with what the URL names (``kwargs``: a run, a pipeline, a lab)."""
    if is_api(request):
        try:
            user = _api_user(request)
        except APIException as exc:  # wrong credentials, locked out (429)
            # 403, not 401, as REST framework answers it: the session comes first, and
            # it names no WWW-Authenticate scheme (docs/api.md).
            status = 403 if exc.status_code == 401 else exc.status_code
            response = JsonResponse({"detail": str(exc.detail)}, status=status)
            wait = getattr(exc, "wait", None)  # Throttled's seconds to wait, if any
            if wait:
                response["Retry-After"] = str(int(wait))
            return response
    else:
        user = request.user
    if not user.is_authenticated:
        if is_api(request):
            return JsonResponse(
                {"detail": "Authentication credentials were not provided."}, status=403
            )
        return redirect_to_login(request.get_full_path())
    if has_role(user, needs.role):
        return None
    run_id, data = named_by(kwargs)  # for the refusal's record only
    try:
        actions.require(user, needs.role, action=needs.action, run_id=run_id, data=data)
    except actions.Refused as exc:
        if is_api(request):
            return JsonResponse({"detail": exc.message}, status=403)
        raise PermissionDenied(exc.message) from None
    return None


def named_by(kwargs: Mapping[str, Any]) -> tuple[int | None, dict[str, Any]]:
    """The run (when it exists) and the pipeline or lab a URL's arguments name."""
    data: dict[str, Any] = {}
    if "name" in kwargs:
        data["pipeline"] = kwargs["name"]
    if "lab_id" in kwargs:
        data["lab"] = kwargs["lab_id"]
    run_id = kwargs.get("run_id")
    if run_id is not None:
        try:
            run_id = actions.get_run(run_id).pk
        except actions.ActionError:  # no such run: recorded outside any run, naming it
            data["run"] = run_id
            run_id = None
    return run_id, data


def body_role_refusal(request: HttpRequest) -> HttpResponse | None:
    """For a request that may carry a body: 403 (recorded) without the role its URL
    needs, 405 on a URL that takes no body; None when the body may be read."""
    if request.method in SAFE_METHODS:
        return None
    try:
        match = resolve(request.path_info)
    except Resolver404:
        return None  # a 404, and nothing reads the body of a request no view takes
    needs = ROLE_BEFORE_BODY.get(match.url_name or "")
    if needs is not None:
        return role_refusal(request, needs, match.kwargs)
    if match.url_name in BODY_FROM_ANYONE or "admin" in match.namespaces:
        return None
    response = _refuse(request, 405, f"{request.method} is not accepted here")
    response["Allow"] = "GET, HEAD, OPTIONS"
    return response


class BoundedRequestMiddleware:
    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        # The role comes first: someone without it learns nothing from what they sent
        # (its size included), and the refusal is what gets recorded.
        refusal = body_role_refusal(request)
        if refusal is None:
            refusal = body_refusal(request)
        if refusal is not None:
            return refusal
        return self.get_response(request)


# -- ASGI: the same bounds before Django's handler receives the body ----------------------

# As django-stubs type Django's ASGIHandler, so that it is an app this wraps.
Scope = dict[str, Any]
Message = Mapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]


def _declared_refusal(headers: dict[bytes, bytes], limit: int) -> tuple[int, str] | None:
    declared = headers.get(b"content-length")
    if declared is None:
        if headers.get(b"transfer-encoding"):
            return 411, "a request body needs a Content-Length (chunked bodies are refused)"
        return None
    try:
        length = int(declared)
    except ValueError:
        length = -1
    if length < 0:
        return 400, "the Content-Length is not a size"
    if length > limit:
        return 413, (
            f"the request body has {length} bytes; at most {limit} are accepted "
            f"(documents: {settings.BPCONSOLE_MAX_DOCUMENT_KB} KB, BPCONSOLE_MAX_DOCUMENT_KB)"
        )
    return None


class BoundedBodyASGI:
    """ASGI wrapper of the HTTP application: 413, 411 or 400 on the request's headers
    (as BoundedRequestMiddleware), and a request whose body grows past the cap anyway is
    cut off (the application sees the client disconnect) rather than received."""

    def __init__(self, app: Callable[[Scope, Receive, Send], Awaitable[None]]) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        limit = settings.BPCONSOLE_MAX_BODY_BYTES
        headers = {name.lower(): value for name, value in scope.get("headers", [])}
        refusal = _declared_refusal(headers, limit)
        if refusal is not None:
            await self._refuse(scope, send, *refusal)
            return
        received = 0

        async def bounded_receive() -> Message:
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > limit:
                    return {"type": "http.disconnect"}
            return message

        await self.app(scope, bounded_receive, send)

    @staticmethod
    async def _refuse(scope: Scope, send: Send, status: int, message: str) -> None:
        if str(scope.get("path", "")).startswith("/api/"):
            body, kind = json.dumps({"detail": message}).encode(), b"application/json"
        else:
            body, kind = message.encode(), b"text/plain; charset=utf-8"
        await send(
            {
                "type": "http.response.start",
                "status": status,
                "headers": [
                    (b"content-type", kind),
                    (b"content-length", str(len(body)).encode()),
                    (b"connection", b"close"),
                ],
            }
        )
        await send({"type": "http.response.body", "body": body})
