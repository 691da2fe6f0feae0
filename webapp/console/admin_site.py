"""The Django admin, opened to the console's admins.

Policies and thresholds are edited in the admin by users with the console's admin role
(the ``admin`` group, or superusers); they do not also need Django's staff flag.
"""

from __future__ import annotations

from django.contrib.admin import AdminSite
from django.http import HttpRequest

from webapp.console.roles import has_role


class ConsoleAdminSite(AdminSite):
    site_header = "Backpressure console administration"
    site_title = "Backpressure console"
    site_url = "/"

    def has_permission(self, request: HttpRequest) -> bool:
        user = request.user
        return bool(user.is_active and (user.is_staff or has_role(user, "admin")))
