from __future__ import annotations

import hmac

from django.conf import settings
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import render
from django.views.decorators.http import require_GET

from orchestrator.health import run_checks
from webapp.console.models import Pipeline
from webapp.console.roles import has_role, role_of, role_required


@role_required("viewer")
def pipeline_list(request: HttpRequest) -> HttpResponse:
    pipelines = Pipeline.objects.select_related("policy").prefetch_related("nodes")
    return render(
        request,
        "console/pipeline_list.html",
        {"pipelines": pipelines, "role": role_of(request.user)},
    )


@require_GET
def healthz(request: HttpRequest) -> JsonResponse:
    """Services up or down. For a logged-in viewer, or a probe that presents the
    ``BPCONSOLE_HEALTH_TOKEN`` as a bearer token (probes cannot log in)."""
    if not (has_role(request.user, "viewer") or _probe_token_ok(request)):
        return JsonResponse({"detail": "log in, or send the health token"}, status=401)
    checks = run_checks(spark=request.GET.get("spark", "1") != "0")
    ok = all(c.up for c in checks)
    return JsonResponse(
        {"status": "ok" if ok else "down", "checks": [c.to_json() for c in checks]},
        status=200 if ok else 503,
    )


def _probe_token_ok(request: HttpRequest) -> bool:
    token = settings.HEALTH_TOKEN
    sent = request.headers.get("Authorization", "").removeprefix("Bearer ").strip()
    return bool(token) and hmac.compare_digest(sent.encode(), token.encode())
