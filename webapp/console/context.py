"""Template context every console page gets: the user's role and what it allows."""

from __future__ import annotations

from typing import Any

from django.http import HttpRequest

from webapp.console.roles import has_role, role_of


def console(request: HttpRequest) -> dict[str, Any]:
    user = getattr(request, "user", None)
    if user is None or not user.is_authenticated:
        return {"role": None, "can_operate": False, "is_admin": False}
    return {
        "role": role_of(user),
        "can_operate": has_role(user, "operator"),
        "is_admin": has_role(user, "admin"),
    }
