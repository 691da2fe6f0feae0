"""Typed readers for settings from the environment (12-factor)."""

from __future__ import annotations

import math
import os
from urllib.parse import parse_qs, unquote, urlsplit

from django.core.exceptions import ImproperlyConfigured

TRUE_WORDS = {"1", "true", "yes", "on"}
FALSE_WORDS = {"0", "false", "no", "off", ""}


def env_str(name: str, default: str) -> str:
    return os.environ.get(name, default)


def env_bool(name: str, *, default: bool) -> bool:
    raw = os.environ.get(name)
    if raw is None:
        return default
    word = raw.strip().lower()
    if word in TRUE_WORDS:
        return True
    if word in FALSE_WORDS:
        return False
    raise ImproperlyConfigured(f"{name}={raw!r} is not a boolean (use true/false)")


def env_list(name: str, default: list[str]) -> list[str]:
    raw = os.environ.get(name)
    if raw is None:
        return default
    return [item.strip() for item in raw.split(",") if item.strip()]


def env_int(name: str, default: int) -> int:
    raw = os.environ.get(name)
    if raw is None:
        return default
    try:
        return int(raw)
    except ValueError:
        raise ImproperlyConfigured(f"{name}={raw!r} is not a whole number") from None


def env_seconds(name: str, default: float) -> float:
    """A duration in seconds: a finite number, not negative."""
    raw = os.environ.get(name)
    if raw is None:
        return default
    try:
        value = float(raw)
    except ValueError:
        value = math.nan
    if not math.isfinite(value) or value < 0:
        raise ImproperlyConfigured(f"{name}={raw[:40]!r} is not a number of seconds (0 or more)")
    return value


def _origin_problem(origin: str) -> str:
    """Why ``origin`` is not an exact ``http(s)://host[:port]`` origin ("" when it is)."""
    parts = urlsplit(origin)
    if parts.scheme not in {"http", "https"}:
        return "the scheme must be http or https"
    if not parts.hostname:
        return "a host is needed"
    if "*" in origin or parts.hostname.startswith("."):
        return "wildcards are not accepted; name each origin"
    try:
        parts.port  # noqa: B018 - urllib checks the port when it is read
    except ValueError:
        return "the port is not a number"
    if parts.path not in {"", "/"} or parts.query or parts.fragment or parts.username:
        return "an origin has no path, query or user part"
    return ""


def full_origins(name: str, origins: list[str]) -> list[str]:
    """``origins`` as ``scheme://host[:port]`` (lower case), each an exact http(s)
    origin: a wildcard, a bare host name, a path or a user part is refused, because an
    origin check that sees only the host (or any subdomain) accepts pages it should not.
    ``name`` is the setting the list came from, for the error message."""
    checked = []
    for raw in origins:
        origin = raw.strip().lower()
        problem = _origin_problem(origin)
        if problem:
            raise ImproperlyConfigured(
                f"{name}: {raw!r} is not an origin like https://console.example.org "
                f"or http://127.0.0.1:8000 ({problem})"
            )
        checked.append(f"{urlsplit(origin).scheme}://{urlsplit(origin).netloc}")
    return checked


def database_from_url(url: str) -> dict[str, object]:
    """Django DATABASES entry for a ``postgresql://user:pass@host:port/name`` URL."""
    parts = urlsplit(url)
    if parts.scheme not in {"postgres", "postgresql"}:
        raise ImproperlyConfigured(f"DATABASE_URL must be postgresql://..., got {url!r}")
    options = {key: values[-1] for key, values in parse_qs(parts.query).items()}
    host = options.pop("host", None) or parts.hostname or ""
    return {
        "ENGINE": "django.db.backends.postgresql",
        "NAME": unquote(parts.path.lstrip("/")) or "bpconsole",
        "USER": unquote(parts.username or ""),
        "PASSWORD": unquote(parts.password or ""),
        "HOST": host,
        "PORT": str(parts.port or ""),
        "OPTIONS": options,
        # Reuse connections (the ASGI server's database thread would otherwise open one
        # per websocket connect); checked before reuse, so a restarted server is harmless.
        "CONN_MAX_AGE": int(os.environ.get("DB_CONN_MAX_AGE", "60")),
        "CONN_HEALTH_CHECKS": True,
    }


def sink_databases(items: list[str], *, console: str) -> dict[str, str]:
    """``name=url`` items as a mapping; ``console`` (the console's own database) is
    always there, under that name."""
    named = {"console": console}
    for item in items:
        name, sep, url = item.partition("=")
        name = name.strip()
        if not sep or not name.isidentifier() or not url.strip() or name == "console":
            raise ImproperlyConfigured(
                "BPCONSOLE_SINK_DATABASES items are name=postgresql://... (a name other "
                f"than console, the console's own), got {item[:40]!r}"
            )
        database_from_url(url.strip())  # refuses what is not a PostgreSQL URL
        named[name] = url.strip()
    return named
