"""Fast, isolated settings for pytest; services come from the launcher fixture."""

from __future__ import annotations

from webapp.settings.base import *  # noqa: F403

SECRET_KEY = "test-only-not-secret"  # noqa: S105 - used only by the test run
DEBUG = False
PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]
STORAGES = {
    "default": {"BACKEND": "django.core.files.storage.FileSystemStorage"},
    "staticfiles": {"BACKEND": "django.contrib.staticfiles.storage.StaticFilesStorage"},
}

# Static files straight from the apps; the test run never collects them.
WHITENOISE_USE_FINDERS = True

# Test databases are created and dropped per session: hold no connection longer than needed.
DATABASES["default"]["CONN_MAX_AGE"] = 0  # noqa: F405
