"""Three roles, each including the one below: viewer < operator < admin."""

from __future__ import annotations

from collections.abc import Callable
from functools import wraps
from typing import Any, Literal

from django.contrib.auth.decorators import login_required
from django.contrib.auth.models import AnonymousUser, User
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponse
from rest_framework.permissions import BasePermission

Role = Literal["viewer", "operator", "admin"]
ROLES: tuple[Role, ...] = ("viewer", "operator", "admin")


def role_of(user: User | AnonymousUser) -> Role | None:
    """The highest role the user holds (superusers are admins), or None."""
    if not user.is_authenticated:
        return None
    if getattr(user, "is_superuser", False):
        return "admin"
    names = set(user.groups.values_list("name", flat=True))
    for role in reversed(ROLES):
        if role in names:
            return role
    return None


def has_role(user: User | AnonymousUser, role: Role) -> bool:
    held = role_of(user)
    return held is not None and ROLES.index(held) >= ROLES.index(role)


View = Callable[..., HttpResponse]


def role_required(role: Role) -> Callable[[View], View]:
    """Login first (redirect), then the role (403 for a logged-in user without it)."""

    def decorator(view: View) -> View:
        @wraps(view)
        @login_required
        def wrapper(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
            if not has_role(request.user, role):
                raise PermissionDenied(f"this needs the {role} role")
            return view(request, *args, **kwargs)

        return wrapper

    return decorator


class IsViewer(BasePermission):
    """REST framework permission: the viewer role (or above). Also guards the OpenAPI
    schema (SPECTACULAR_SETTINGS SERVE_PERMISSIONS): a logged-in user without a role
    gets 403 there as everywhere else under /api/."""

    message = "this needs the viewer role"

    def has_permission(self, request: Any, view: Any) -> bool:
        return has_role(request.user, "viewer")
