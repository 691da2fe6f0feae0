"""ASGI entry point: HTTP through Django, websockets through Channels.

A websocket's Origin must equal one of BPCONSOLE_ALLOWED_ORIGINS in scheme, host and
port (webapp/console/security.py): a page on another port or scheme of the same host, a
missing Origin or an opaque one (``null``) is refused before the session is read.
"""

import os

from django.core.asgi import get_asgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "webapp.settings.local")
django_asgi_app = get_asgi_application()

from channels.auth import AuthMiddlewareStack  # noqa: E402 - needs Django set up first
from channels.routing import ProtocolTypeRouter, URLRouter  # noqa: E402

from webapp.console.middleware import BoundedBodyASGI  # noqa: E402
from webapp.console.security import websocket_origin_validator  # noqa: E402
from webapp.routing import websocket_urlpatterns  # noqa: E402

application = ProtocolTypeRouter(
    {
        # Bodies over the cap are refused as they arrive, before Django receives them.
        "http": BoundedBodyASGI(django_asgi_app),
        "websocket": websocket_origin_validator(
            AuthMiddlewareStack(URLRouter(websocket_urlpatterns))
        ),
    }
)
