"""The API's one request parser: JSON, bounded like every other document the console
takes (webapp/console/topology_io.py ``parse_json``: size, nesting depth, no NUL
characters or non-finite numbers).

A refused body is a 400 with the documented shape, ``{"detail": ..., "problems":
[{"location", "message"}]}``, raised before the view sees any of it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from django.conf import settings
from rest_framework.exceptions import ParseError
from rest_framework.parsers import JSONParser

from webapp.console.topology_io import max_document_bytes, parse_json
from webapp.console.validation import TopologyError


class DocumentRefused(ParseError):
    """A request body that is not an acceptable JSON document; ``detail`` carries the
    located problems (DRF's exception handler answers a dict detail as it is)."""

    def __init__(self, exc: TopologyError) -> None:
        problems = [{"location": str(p.location), "message": p.message} for p in exc.problems]
        super().__init__(
            {
                "detail": f"the request body is not an acceptable JSON document "
                f"({len(problems)} problem(s)); nothing was changed",
                "problems": problems,
            }
        )


class BoundedJSONParser(JSONParser):
    def parse(
        self,
        stream: Any,
        media_type: str | None = None,
        parser_context: Mapping[str, Any] | None = None,
    ) -> Any:
        encoding = (parser_context or {}).get("encoding", settings.DEFAULT_CHARSET)
        # One byte more than the cap, so that a larger body is seen as such without
        # reading the rest of it (the middleware has already refused a larger
        # Content-Length; this holds for any stream).
        raw = stream.read(max_document_bytes() + 1) if stream is not None else b""
        try:
            return parse_json(raw, encoding)
        except TopologyError as exc:
            raise DocumentRefused(exc) from None
