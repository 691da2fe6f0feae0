"""``django.contrib.admin`` with the console's site; listed in INSTALLED_APPS in its place.

Kept apart from ``admin_site.py``: app configs load before models, the site needs them.
"""

from django.contrib.admin.apps import AdminConfig


class ConsoleAdminConfig(AdminConfig):
    default_site = "webapp.console.admin_site.ConsoleAdminSite"
