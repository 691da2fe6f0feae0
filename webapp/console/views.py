"""HTML pages of the console. Every page needs a role (viewer at least); what changes
state needs the operator role, and refused attempts are recorded (webapp/console/actions.py).
A page that reads a form checks the role its address needs first
(``middleware.body_role_refusal``, as BoundedRequestMiddleware does before the CSRF
check), so that no form is parsed for someone who may not send it.
"""

from __future__ import annotations

import hmac
from typing import Any

from django.conf import settings
from django.contrib import messages
from django.core.exceptions import PermissionDenied
from django.http import Http404, HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.urls import reverse
from django.views.decorators.csrf import ensure_csrf_cookie
from django.views.decorators.http import require_GET, require_http_methods, require_POST

from orchestrator import service
from webapp.console import actions
from webapp.console.middleware import body_role_refusal
from webapp.console.models import Pipeline, Policy
from webapp.console.roles import has_role, role_required
from webapp.console.topology_io import (
    dump_yaml,
    export_document,
    max_document_bytes,
    parse_json,
    parse_yaml,
)
from webapp.console.validation import Problem, TopologyError

DEFAULT_GENERATOR = "seed=7,volume_mb=8,dominance=0.8"
RUN_HISTORY = 15


@role_required("viewer")
def pipeline_list(request: HttpRequest) -> HttpResponse:
    pipelines = list(Pipeline.objects.select_related("policy").prefetch_related("nodes", "edges"))
    latest = service.latest_runs([p.pk for p in pipelines])
    rows = [
        {"pipeline": p, "last_run": latest.get(p.pk), "health": actions.health_of(latest.get(p.pk))}
        for p in pipelines
    ]
    return render(request, "console/pipeline_list.html", {"rows": rows})


@role_required("viewer")
@ensure_csrf_cookie
def pipeline_detail(request: HttpRequest, name: str) -> HttpResponse:
    pipeline = get_object_or_404(Pipeline.objects.select_related("policy"), name=name)
    runs = list(service.runs_of(pipeline_id=pipeline.pk)[:RUN_HISTORY])
    return render(
        request,
        "console/pipeline_detail.html",
        {
            "pipeline": pipeline,
            "document": export_document(pipeline),
            "runs": runs,
            "policies": Policy.objects.all(),
            "default_generator": DEFAULT_GENERATOR,
            "input_roots": actions.input_roots(),
            "stream_urls": bool(settings.BPCONSOLE_STREAM_URLS),
            "labs": [service.lab_json(lab) for lab in service.labs_of(pipeline.pk, limit=5)],
            "replayable_runs": service.replayable_runs(pipeline.pk),
        },
    )


@role_required("viewer")
def pipeline_export(request: HttpRequest, name: str) -> HttpResponse:
    pipeline = get_object_or_404(Pipeline, name=name)
    response = HttpResponse(dump_yaml(export_document(pipeline)), content_type="application/yaml")
    response["Content-Disposition"] = f'attachment; filename="{pipeline.name}.yaml"'
    return response


def _operator_catalog() -> dict[str, Any]:
    return {
        name: {
            "kind": spec.kind,
            "description": spec.description,
            "params": {
                pname: {
                    "default": p.default,
                    "help": p.help,
                    "required": p.required,
                    "number": p.number,
                    "list": p.list,
                    "lines": p.lines,
                    "alternative": p.alternative,
                }
                for pname, p in spec.params.items()
            },
        }
        for name, spec in service.OPERATORS.items()
    }


NEW_DOCUMENT: dict[str, Any] = {
    "name": "",
    "description": "",
    "nodes": [
        {
            "name": "source",
            "kind": "source",
            "operator": service.DEFAULT_OPERATOR["source"],
            "params": {},
            "buffer_mb": service.DEFAULT_BUFFER_MB,
        },
        {
            "name": "output",
            "kind": "sink",
            "operator": service.DEFAULT_OPERATOR["sink"],
            "buffer_mb": service.DEFAULT_BUFFER_MB,
        },
    ],
    "edges": [{"from": "source", "to": "output"}],
}


def _editor(
    request: HttpRequest,
    pipeline: Pipeline | None,
    doc: Any,
    problems: list[Problem],
    *,
    status: int = 200,
) -> HttpResponse:
    return render(
        request,
        "console/pipeline_edit.html",
        {
            "pipeline": pipeline,
            "editor_config": {
                "document": doc,
                "problems": [{"location": p.location, "message": p.message} for p in problems],
                "operators": _operator_catalog(),
                "default_operators": dict(service.DEFAULT_OPERATOR),
                "policies": list(Policy.objects.values_list("name", flat=True)),
                "parameters": [
                    {"name": p.name, "label": p.label, "range": p.range_text(), "unit": p.unit}
                    for p in service.PARAMETERS
                    if p.kind != "choice"
                ],
                "can_change_policy": has_role(request.user, "admin"),
                "editing": pipeline.name if pipeline else None,
                "validate_url": reverse("api-validate"),
                "sample_url": reverse("api-sample-schema"),
            },
        },
        status=status,
    )


@role_required("viewer")
@require_http_methods(["GET", "POST"])
def pipeline_edit(request: HttpRequest, name: str | None = None) -> HttpResponse:
    pipeline = get_object_or_404(Pipeline, name=name) if name else None
    if request.method == "GET":
        if not has_role(request.user, "operator"):
            raise PermissionDenied("editing pipelines needs the operator role")
        doc = export_document(pipeline) if pipeline else NEW_DOCUMENT
        return _editor(request, pipeline, doc, [])
    refused = body_role_refusal(request)
    if refused is not None:
        return refused
    text = request.POST.get("document", "")
    try:
        if not text.strip():
            raise TopologyError([Problem("(document)", "the editor sent no document")])
        doc = parse_json(text)  # bounded: size, depth (docs/security.md)
    except TopologyError as exc:
        shown = export_document(pipeline) if pipeline else NEW_DOCUMENT
        return _editor(request, pipeline, shown, exc.problems, status=400)
    try:
        saved, created = actions.save_pipeline(doc, request.user, name=name)
    except actions.Refused as exc:
        raise PermissionDenied(exc.message) from None
    except TopologyError as exc:
        return _editor(request, pipeline, doc, exc.problems, status=400)
    verb = "created" if created else "saved"
    messages.success(request, f"Pipeline {saved.name} {verb}.")
    return redirect("pipeline", name=saved.name)


@role_required("viewer")
@require_POST
def pipeline_import(request: HttpRequest) -> HttpResponse:
    """A topology file (uploaded or pasted): saved when valid; otherwise it opens in the
    editor with every problem next to its field, and nothing is saved.

    BoundedRequestMiddleware has already refused a user without the operator role and a
    body over the cap before anything read the upload; the role is checked here again so
    that the view is safe on its own, and the file is read only up to the cap."""
    refused = body_role_refusal(request)
    if refused is not None:
        return refused
    upload = request.FILES.get("file")
    if upload:
        text = upload.read(max_document_bytes() + 1).decode("utf-8", "replace")
    else:
        text = request.POST.get("yaml", "")
    try:
        doc = parse_yaml(text)  # bounded: size, depth, no anchors or aliases
        saved, created = actions.save_pipeline(doc, request.user)
    except actions.Refused as exc:
        raise PermissionDenied(exc.message) from None
    except TopologyError as exc:
        doc = locals().get("doc")
        shown = doc if isinstance(doc, dict) else NEW_DOCUMENT
        existing = Pipeline.objects.filter(name=shown.get("name")).first()
        return _editor(request, existing, shown, exc.problems, status=400)
    messages.success(request, f"Pipeline {saved.name} {'created' if created else 'updated'}.")
    return redirect("pipeline", name=saved.name)


def _form_source(request: HttpRequest, kind: str) -> dict[str, str] | None:
    """A landing folder's or a stream's fields from the start form (``source_<field>``),
    or None when the operator chose files or the generator. Any other kind goes on as
    given, for start_run to refuse (after the role check) naming the kinds there are."""
    if kind in ("generator", "path"):
        return None
    fields = actions.SOURCE_FIELDS.get(kind, {})
    return {"kind": kind, **{f: request.POST.get(f"source_{f}", "") for f in fields}}


@role_required("viewer")
@require_POST
def run_start(request: HttpRequest, name: str) -> HttpResponse:
    refused = body_role_refusal(request)
    if refused is not None:
        return refused
    kind = request.POST.get("input", "generator")
    run_request = actions.RunRequest(
        pipeline=name,
        generator=request.POST.get("generator", "") if kind == "generator" else None,
        input_path=request.POST.get("input_path", "") if kind == "path" else None,
        source=_form_source(request, kind),
        policy=request.POST.get("policy") or None,
    )
    try:
        run = actions.start_run(run_request, request.user)
    except actions.ActionError as exc:
        _tell(request, exc, "The run was not started: ")
        return redirect("pipeline", name=name)
    return redirect("run", run_id=run.pk)


def _tell(request: HttpRequest, exc: actions.ActionError, prefix: str = "") -> None:
    """A refusal is a 403 page and something missing a 404; anything else is said on
    the page the form came from."""
    if isinstance(exc, actions.Refused):
        raise PermissionDenied(exc.message) from None
    if exc.status == 404:
        raise Http404(exc.message) from None
    messages.error(request, prefix + exc.message)


@role_required("viewer")
@require_POST
def lab_create(request: HttpRequest, name: str) -> HttpResponse:
    """The pipeline page's policy lab form: a generator spec or one of its runs."""
    refused = body_role_refusal(request)
    if refused is not None:
        return refused
    kind = request.POST.get("workload", "generator")
    raw_run = request.POST.get("lab_run", "")
    try:
        if kind == "run" and not (raw_run.isascii() and raw_run.isdigit() and len(raw_run) <= 18):
            raise actions.ActionError("choose one of the pipeline's completed runs")
        lab = actions.create_lab(
            name,
            request.user,
            generator=request.POST.get("lab_generator", "") if kind != "run" else None,
            run_id=int(raw_run) if kind == "run" else None,
        )
    except actions.ActionError as exc:
        _tell(request, exc)
        return redirect("pipeline", name=name)
    return redirect("lab", lab_id=lab.pk)


@role_required("viewer")
@ensure_csrf_cookie
def lab_view(request: HttpRequest, lab_id: int) -> HttpResponse:
    try:
        lab = actions.get_lab(lab_id)
    except actions.ActionError as exc:
        raise Http404(exc.message) from None
    config = {
        "lab": lab.pk,
        "api": reverse("api-lab", kwargs={"lab_id": lab.pk}),
        "can_operate": has_role(request.user, "operator"),
    }
    return render(
        request,
        "console/lab.html",
        {"lab": lab, "view": service.lab_json(lab), "lab_config": config},
    )


@role_required("viewer")
@require_POST
def lab_start(request: HttpRequest, lab_id: int) -> HttpResponse:
    """Start a live run with the lab policy the operator chose."""
    refused = body_role_refusal(request)
    if refused is not None:
        return refused
    try:
        run = actions.start_lab_run(lab_id, request.POST.get("policy", "")[:100], request.user)
    except actions.ActionError as exc:
        _tell(request, exc, "The run was not started: ")
        return redirect("lab", lab_id=lab_id)
    return redirect("run", run_id=run.pk)


@role_required("viewer")
@ensure_csrf_cookie
def run_view(request: HttpRequest, run_id: int) -> HttpResponse:
    try:
        run = service.get_run(run_id)
    except service.RunNotFound:
        raise Http404(f"there is no run {run_id}") from None
    config = {
        "run": run.pk,
        "status": run.status,
        "pipeline": run.pipeline_name,
        "topology": {
            "nodes": [
                {"name": n["name"], "kind": n["kind"], "stage": n.get("stage") or n["name"]}
                for n in run.topology["nodes"]
            ],
            "edges": [
                {"from": e["from"], "to": e["to"], "bandwidth_mbps": e.get("bandwidth_mbps", 0)}
                for e in run.topology["edges"]
            ],
        },
        "input_bytes": int(run.input_spec.get("extent_total") or 0),
        "source": service.source_view(run),
        "preparing": service.input_preparing(run),
        "can_operate": has_role(request.user, "operator"),
        "user": request.user.get_username(),
        "ws_path": f"/ws/runs/{run.pk}/",
        "api": f"/api/runs/{run.pk}/",
        "workers_api": reverse("api-workers"),
        "prediction": service.prediction_of(run),
    }
    pipeline = (
        Pipeline.objects.filter(pk=run.pipeline_id).first() if run.pipeline_id is not None else None
    )
    return render(
        request, "console/run.html", {"run": run, "pipeline": pipeline, "run_config": config}
    )


@role_required("viewer")
def activity(request: HttpRequest) -> HttpResponse:
    """What people did: operator actions and refused attempts, newest first."""
    events = service.events_of(by_users=True, limit=200)
    return render(request, "console/activity.html", {"events": events})


@require_GET
def healthz(request: HttpRequest) -> JsonResponse:
    """Services up or down. For a logged-in viewer, or a probe that presents the
    ``BPCONSOLE_HEALTH_TOKEN`` as a bearer token (probes cannot log in)."""
    if not (has_role(request.user, "viewer") or _probe_token_ok(request)):
        return JsonResponse({"detail": "log in, or send the health token"}, status=401)
    checks = service.run_checks(spark=request.GET.get("spark", "1") != "0")
    ok = all(c.up for c in checks)
    return JsonResponse(
        {"status": "ok" if ok else "down", "checks": [c.to_json() for c in checks]},
        status=200 if ok else 503,
    )


def _probe_token_ok(request: HttpRequest) -> bool:
    token = settings.HEALTH_TOKEN
    sent = request.headers.get("Authorization", "").removeprefix("Bearer ").strip()
    return bool(token) and hmac.compare_digest(sent.encode(), token.encode())
