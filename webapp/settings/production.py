"""Production: everything from the environment, secure cookies, HSTS; fails without a key."""

from __future__ import annotations

from django.core.exceptions import ImproperlyConfigured

from webapp.settings.base import *  # noqa: F403
from webapp.settings.env import env_bool, env_int, env_list

if not SECRET_KEY:  # noqa: F405
    raise ImproperlyConfigured("SECRET_KEY must be set in the environment in production")

DEBUG = False
SESSION_COOKIE_SECURE = True
CSRF_COOKIE_SECURE = True
SECURE_SSL_REDIRECT = env_bool("SECURE_SSL_REDIRECT", default=True)
SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")
SECURE_HSTS_SECONDS = env_int("SECURE_HSTS_SECONDS", 31536000)
SECURE_HSTS_INCLUDE_SUBDOMAINS = True
SECURE_HSTS_PRELOAD = True
SECURE_CONTENT_TYPE_NOSNIFF = True
STORAGES = {
    "default": {"BACKEND": "django.core.files.storage.FileSystemStorage"},
    "staticfiles": {"BACKEND": "whitenoise.storage.CompressedManifestStaticFilesStorage"},
}
# System checks a deployment has reviewed and accepts, e.g. bpconsole.W001 (running as
# root) in a container whose uid 0 is not the host's root.
SILENCED_SYSTEM_CHECKS = env_list("BPCONSOLE_SILENCED_CHECKS", [])
