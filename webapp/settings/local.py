"""Single-machine settings used by `make run`: debug off unless asked, loopback only."""

from __future__ import annotations

import secrets

from webapp.settings.base import *  # noqa: F403
from webapp.settings.base import VAR_DIR

# A local console without SECRET_KEY gets a random key kept under ./var, so sessions
# survive restarts without a secret ever being written into the code.
if not SECRET_KEY:  # noqa: F405
    _key_file = VAR_DIR / "secret_key"
    if not _key_file.exists():
        VAR_DIR.mkdir(parents=True, exist_ok=True)
        _key_file.write_text(secrets.token_urlsafe(50))
        _key_file.chmod(0o600)
    SECRET_KEY = _key_file.read_text().strip()

# Serve static files straight from the apps (no collectstatic step on one machine).
WHITENOISE_USE_FINDERS = True
