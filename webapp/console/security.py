"""Sessions and origins: the Content-Security-Policy of every answer, the page a
locked-out login gets (django-axes), and the websocket's origin check.

docs/security.md describes each control; this module holds only their mechanics.
"""

from __future__ import annotations

from typing import Any

from channels.security.websocket import OriginValidator
from django.conf import settings
from django.contrib.auth.forms import AuthenticationForm
from django.core.exceptions import DisallowedHost
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render
from django.utils.deprecation import MiddlewareMixin
from drf_spectacular.authentication import BasicScheme
from rest_framework.authentication import BasicAuthentication
from rest_framework.exceptions import AuthenticationFailed, Throttled

# Nothing inline: every script and style sheet comes from our own static files, so an
# injected <script> or on*= attribute does not run, and no other site may frame a page.
CSP_DIRECTIVES: dict[str, str] = {
    "default-src": "'self'",
    "script-src": "'self'",
    "style-src": "'self'",
    "img-src": "'self' data:",
    "font-src": "'self'",
    "connect-src": "'self'",
    "frame-ancestors": "'none'",
    "base-uri": "'self'",
    "form-action": "'self'",
    "object-src": "'none'",
}


def content_security_policy(request: HttpRequest) -> str:
    """The policy for one answer. ``connect-src 'self'`` covers the run view's websocket
    in current browsers (CSP level 3); the same host's ws:/wss: URL is named as well
    for browsers that do not yet match websockets with 'self'."""
    directives = dict(CSP_DIRECTIVES)
    try:
        host = request.get_host()  # checked against ALLOWED_HOSTS: no spaces, no ';'
    except DisallowedHost:
        host = ""
    if host:
        scheme = "wss" if request.is_secure() else "ws"
        directives["connect-src"] = f"'self' {scheme}://{host}"
    return "; ".join(f"{name} {value}" for name, value in directives.items())


class ContentSecurityPolicyMiddleware(MiddlewareMixin):
    """Adds the Content-Security-Policy header to every answer: pages, the admin, the
    API, static files, redirects and error pages (it is the outermost middleware, so it
    also sees the answers other middleware makes, such as a login lockout). Sync and
    async alike (MiddlewareMixin), so the ASGI server needs no thread hop for it."""

    def process_response(self, request: HttpRequest, response: HttpResponse) -> HttpResponse:
        response["Content-Security-Policy"] = content_security_policy(request)
        return response


def lockout_response(request: HttpRequest, *_: Any) -> HttpResponse:
    """django-axes' answer once a user name has failed too often from one address: the
    login page again, status 429, saying plainly why and for how long.

    axes calls this as ``(request, original_response, credentials)`` (and, from its
    async middleware, as ``(request, credentials)``): neither is needed here.
    """
    minutes = settings.BPCONSOLE_LOGIN_COOLOFF_MIN
    username = request.POST.get("username", "") if request.method == "POST" else ""
    context = {
        "form": AuthenticationForm(request),
        "locked_out": True,
        "locked_username": username[:150],
        "cooloff_minutes": minutes,
        "failure_limit": settings.BPCONSOLE_LOGIN_FAILURE_LIMIT,
        "next": request.POST.get("next", "") if request.method == "POST" else "",
    }
    response = render(request, "registration/login.html", context, status=429)
    response["Retry-After"] = str(minutes * 60)
    return response


class ThrottledBasicAuthentication(BasicAuthentication):
    """HTTP Basic for the API under the same login throttling, its lockout answered as
    429 with Retry-After. django-axes refuses a locked-out user name here as in the login
    form, but marks DRF's own request object, which its middleware never sees: without
    this the API would answer a plain 403 and not say why."""

    def authenticate_credentials(
        self, userid: str, password: str, request: Any = None
    ) -> tuple[Any, None]:
        try:
            return super().authenticate_credentials(userid, password, request)
        except AuthenticationFailed:
            if getattr(request, "axes_locked_out", False):
                minutes = settings.BPCONSOLE_LOGIN_COOLOFF_MIN
                raise Throttled(
                    wait=minutes * 60,
                    detail="too many failed log-ins as this user from your address: "
                    f"locked until {minutes} minutes after the last attempt, even with the "
                    "right password.",
                ) from None
            raise


# drf-spectacular's extension registry (its __init_subclass__) is unannotated.
class ThrottledBasicScheme(BasicScheme):  # type: ignore[no-untyped-call]
    """The API schema lists it as what it is: HTTP Basic."""

    target_class = "webapp.console.security.ThrottledBasicAuthentication"


# channels has no type information (pyproject: ignore_missing_imports), so the base is Any.
class FullOriginValidator(OriginValidator):  # type: ignore[misc]
    """Channels' origin check given full origins (``scheme://host[:port]``, which the
    settings insist on): scheme, host and port must all equal an allowed origin's, a
    missing or opaque (``null``) Origin is refused, and so is an Origin whose port is
    not a number (urllib raises on it; channels would fail the handshake with an error
    instead of refusing it)."""

    def valid_origin(self, parsed_origin: Any) -> bool:
        try:
            return bool(super().valid_origin(parsed_origin))
        except ValueError:
            return False


def websocket_origin_validator(application: Any) -> FullOriginValidator:
    return FullOriginValidator(application, list(settings.BPCONSOLE_ALLOWED_ORIGINS))
