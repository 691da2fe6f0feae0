"""Error answers Django gives outside the views (no URL matches, an unreadable request,
an error in a view): JSON ``{"detail": ...}`` under ``/api/``, as the API's schema
says, and the console's pages elsewhere."""

from __future__ import annotations

from django.http import HttpRequest, HttpResponse, JsonResponse
from django.views import defaults


def _is_api(request: HttpRequest) -> bool:
    return request.path_info.startswith("/api/")


def bad_request(request: HttpRequest, exception: Exception) -> HttpResponse:
    if _is_api(request):
        # Never the exception's text: it may name settings or internals.
        return JsonResponse({"detail": "the request could not be read"}, status=400)
    return defaults.bad_request(request, exception)


def permission_denied(request: HttpRequest, exception: Exception) -> HttpResponse:
    if _is_api(request):
        return JsonResponse({"detail": str(exception) or "not allowed"}, status=403)
    return defaults.permission_denied(request, exception)


def not_found(request: HttpRequest, exception: Exception) -> HttpResponse:
    if _is_api(request):
        return JsonResponse(
            {
                "detail": "not found: no such object or endpoint (see /api/schema/; "
                "run ids are whole numbers, pipeline names are letters, digits, _ . -)"
            },
            status=404,
        )
    return defaults.page_not_found(request, exception)


def server_error(request: HttpRequest) -> HttpResponse:
    if _is_api(request):
        return JsonResponse({"detail": "internal error; it was logged"}, status=500)
    return defaults.server_error(request)
