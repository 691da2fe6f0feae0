"""Single-machine settings used by `make run`: debug off unless asked, loopback only."""

from __future__ import annotations

import os

from orchestrator.services.credentials import secret
from webapp.settings.base import *  # noqa: F403
from webapp.settings.base import BPCONSOLE_ALLOWED_ORIGINS, SECRET_KEY, VAR_DIR
from webapp.settings.env import env_str, full_origins

# A local console without SECRET_KEY gets a random key kept under ./var, so sessions
# survive restarts without a secret ever being written into the code.
# The file is 0600 from its creation (a key written first and narrowed after could be
# read in between), in the 0700 state folder.
if not SECRET_KEY:
    SECRET_KEY = secret(VAR_DIR, "django")

# Serve static files straight from the apps (no collectstatic step on one machine).
WHITENOISE_USE_FINDERS = True

# `make run` serves on BPCONSOLE_HOST:BPCONSOLE_PORT (orchestrator/services/runconsole.py): its own
# pages may open the run view's websocket whatever the port, unless the origins are set.
if "BPCONSOLE_ALLOWED_ORIGINS" not in os.environ:
    _port = env_str("BPCONSOLE_PORT", "8000")
    _hosts = ["127.0.0.1", "localhost", env_str("BPCONSOLE_HOST", "127.0.0.1")]
    _served = [
        f"http://[{h}]:{_port}" if ":" in h else f"http://{h}:{_port}"
        for h in _hosts
        if h and h not in {"0.0.0.0", "::"}  # noqa: S104 - any address: no one origin
    ]
    BPCONSOLE_ALLOWED_ORIGINS = list(
        dict.fromkeys(
            [*BPCONSOLE_ALLOWED_ORIGINS, *full_origins("BPCONSOLE_HOST/BPCONSOLE_PORT", _served)]
        )
    )
