"""The JSON API under /api/ (Django REST framework); described in docs/api.md and served
as an OpenAPI schema at /api/schema/.

Reading needs the viewer role. Run controls, node actions, adjustments (hot migration,
adding and removing instances) and starting runs need the
operator role; when someone without it tries, the attempt is recorded as an
``action_refused`` event and the answer is 403. Editing a pipeline needs the operator
role, changing its policy the admin role.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from django.http import HttpResponse, StreamingHttpResponse
from django.http.response import HttpResponseBase
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiExample, OpenApiParameter, OpenApiResponse, extend_schema
from drf_spectacular.views import SpectacularAPIView
from rest_framework import status
from rest_framework.exceptions import PermissionDenied
from rest_framework.permissions import BasePermission, IsAuthenticated
from rest_framework.renderers import JSONRenderer
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from orchestrator import service
from webapp.console import actions
from webapp.console.middleware import ROLE_BEFORE_BODY, SAFE_METHODS, named_by
from webapp.console.models import Pipeline
from webapp.console.roles import IsViewer, has_role
from webapp.console.serializers import (
    ActionResultSerializer,
    AdjustSerializer,
    BadRequestSerializer,
    CompletionSerializer,
    DetailSerializer,
    EventSerializer,
    LabSerializer,
    NodeActionSerializer,
    PipelineDetailSerializer,
    PipelineDocumentSerializer,
    PipelineSummarySerializer,
    ProblemsSerializer,
    ResultsSerializer,
    RunSerializer,
    SampledSchemaSerializer,
    SampleRequestSerializer,
    StartLabRunSerializer,
    StartLabSerializer,
    StartRunSerializer,
    ValidationResultSerializer,
    WorkerSerializer,
    YamlImportSerializer,
    event_json,
    run_json,
)
from webapp.console.topology_io import dump_yaml, export_document, parse_yaml, validate_for_save
from webapp.console.validation import TopologyError, shown

# What the schema says every answer may be besides the success: each 4xx is a JSON
# object with a ``detail`` sentence, and a 400 about a document lists its ``problems``
# (docs/api.md, "Errors"). A body that is not an acceptable JSON document (too large,
# too deep, not JSON) is a 400 with problems on every operation that takes one.
DENIED = {
    403: OpenApiResponse(DetailSerializer, description="not logged in, or the role is missing")
}
NOT_FOUND = {404: OpenApiResponse(DetailSerializer, description="no such pipeline or run")}
BAD_QUERY = {400: OpenApiResponse(DetailSerializer, description="an unusable query parameter")}
BAD_BODY = {
    400: OpenApiResponse(
        BadRequestSerializer,
        description="invalid input; for a body that is not an acceptable JSON document, "
        "its problems",
    )
}
BAD_DOCUMENT = {
    400: OpenApiResponse(ProblemsSerializer, description="invalid document: every problem"),
    413: OpenApiResponse(
        DetailSerializer, description="the body is larger than BPCONSOLE_MAX_DOCUMENT_KB allows"
    ),
}
CONFLICT = {409: OpenApiResponse(DetailSerializer, description="the run's state does not allow it")}
OVER_QUOTA = {
    429: OpenApiResponse(
        DetailSerializer, description="the operator has as many active runs or labs as allowed"
    )
}


class RoleBeforeBody(BasePermission):
    """The role a request that may carry a body needs (middleware ``ROLE_BEFORE_BODY``),
    checked before the view reads the body, as the middleware checks it before anything
    does: so each view is safe on its own. A refusal is recorded (actions.require)."""

    def has_permission(self, request: Any, view: Any) -> bool:
        match = request.resolver_match
        needs = ROLE_BEFORE_BODY.get(match.url_name if match else "")
        if request.method in SAFE_METHODS or needs is None or has_role(request.user, needs.role):
            return True
        run_id, data = named_by(view.kwargs)  # for the refusal's record only
        try:
            actions.require(request.user, needs.role, action=needs.action, run_id=run_id, data=data)
        except actions.Refused as exc:
            raise PermissionDenied(exc.message) from None
        return True


# Every view that takes a body: logged in, then the role before the body.
TAKES_A_BODY = [IsAuthenticated, RoleBeforeBody]


def _error(exc: actions.ActionError) -> Response:
    return Response({"detail": exc.message}, status=exc.status)


def _problem_list(problems: list[Any]) -> list[dict[str, str]]:
    return [{"location": str(p.location), "message": str(p.message)} for p in problems]


def _problems(exc: TopologyError) -> Response:
    problems = _problem_list(exc.problems)
    return Response(
        {"detail": f"{len(problems)} problem(s), nothing saved", "problems": problems},
        status=status.HTTP_400_BAD_REQUEST,
    )


def _text(request: Request, name: str) -> str | None:
    """A query parameter's text; 400 (ActionError) for a NUL character, which no stored
    value holds and the database refuses to compare with."""
    value = request.query_params.get(name)
    if value is not None and "\x00" in value:
        raise actions.ActionError(f"the query parameter {name!r} contains a NUL character")
    return value


def _pipeline_json(pipeline: Pipeline, last: Any, *, detail: bool = False) -> dict[str, Any]:
    data: dict[str, Any] = {
        "name": pipeline.name,
        "description": pipeline.description,
        "policy": pipeline.policy.name if pipeline.policy else "default",
        "policy_overrides": pipeline.policy_overrides or {},
        "nodes": pipeline.nodes.count(),
        "edges": pipeline.edges.count(),
        "last_run": None
        if last is None
        else {"id": last.pk, "status": last.status, "created_at": last.created_at.isoformat()},
        "health": actions.health_of(last),
    }
    if detail:
        data["document"] = export_document(pipeline)
    return data


def _pipeline_or_404(name: str) -> Pipeline:
    pipeline = Pipeline.objects.select_related("policy").filter(name=name).first()
    if pipeline is None:
        raise actions.ActionError(f"there is no pipeline {shown(name)}", status=404)
    return pipeline


# -- the schema -------------------------------------------------------------------------


class SchemaView(SpectacularAPIView):
    """The OpenAPI 3 schema of this API (YAML; JSON with ?format=json or Accept:
    application/json), for users with the viewer role."""

    # The role: SPECTACULAR_SETTINGS SERVE_PERMISSIONS. Errors (403, an unknown format's
    # 404) are JSON {"detail": ...} like every other answer under /api/, whatever format
    # was asked for: drf-spectacular would render them with the schema's YAML renderer.
    def handle_exception(self, exc: Exception) -> Response:
        self.request.accepted_renderer = JSONRenderer()
        self.request.accepted_media_type = "application/json"
        return super().handle_exception(exc)

    @extend_schema(
        responses={
            200: OpenApiResponse(OpenApiTypes.OBJECT, description="This schema"),
            (403, "application/json"): DENIED[403],
            (404, "application/json"): OpenApiResponse(
                DetailSerializer, description="an unknown format"
            ),
        },
        tags=["schema"],
    )
    def get(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        # drf-spectacular's views are unannotated; this one answers with a Response.
        schema: Response = super().get(request, *args, **kwargs)  # type: ignore[no-untyped-call]
        return schema


# -- pipelines --------------------------------------------------------------------------


class PipelineListView(APIView):
    permission_classes = TAKES_A_BODY

    @extend_schema(
        responses={200: PipelineSummarySerializer(many=True), **DENIED}, tags=["pipelines"]
    )
    def get(self, request: Request) -> Response:
        if not has_role(request.user, "viewer"):
            return Response({"detail": IsViewer.message}, status=403)
        pipelines = list(Pipeline.objects.select_related("policy"))
        latest = service.latest_runs([p.pk for p in pipelines])
        return Response([_pipeline_json(p, latest.get(p.pk)) for p in pipelines])

    @extend_schema(
        request=PipelineDocumentSerializer,
        responses={
            201: PipelineDetailSerializer,
            200: PipelineDetailSerializer,
            **BAD_DOCUMENT,
            **DENIED,
        },
        tags=["pipelines"],
        summary="Create (or update) a pipeline from a document; nothing saved when invalid",
    )
    def post(self, request: Request) -> Response:
        return _save(request, lambda: request.data)


def _require_editor(request: Request, name: str = "") -> None:
    """The operator role before the body is parsed: someone without it is refused (403,
    recorded) without making the server parse their document first."""
    actions.require(request.user, "operator", action="edit_pipeline", data={"pipeline": name})


def _save(request: Request, document: Callable[[], Any]) -> Response:
    """Create or update a pipeline from a document (parsed inside the guard, so a YAML
    error is reported like any other problem); 201 when created, 200 when updated."""
    try:
        _require_editor(request)
        pipeline, created = actions.save_pipeline(document(), request.user)
    except actions.ActionError as exc:
        return _error(exc)
    except TopologyError as exc:
        return _problems(exc)
    return Response(_pipeline_json(pipeline, None, detail=True), status=201 if created else 200)


class PipelineDetailView(APIView):
    permission_classes = TAKES_A_BODY

    @extend_schema(
        responses={200: PipelineDetailSerializer, **DENIED, **NOT_FOUND}, tags=["pipelines"]
    )
    def get(self, request: Request, name: str) -> Response:
        if not has_role(request.user, "viewer"):
            return Response({"detail": IsViewer.message}, status=403)
        try:
            pipeline = _pipeline_or_404(name)
        except actions.ActionError as exc:
            return _error(exc)
        last = service.latest_runs([pipeline.pk]).get(pipeline.pk)
        return Response(_pipeline_json(pipeline, last, detail=True))

    @extend_schema(
        request=PipelineDocumentSerializer,
        responses={200: PipelineDetailSerializer, **BAD_DOCUMENT, **DENIED, **NOT_FOUND},
        tags=["pipelines"],
        summary="Replace a pipeline's topology; nothing saved when invalid",
    )
    def put(self, request: Request, name: str) -> Response:
        try:
            _pipeline_or_404(name)
            _require_editor(request, name)
            pipeline, _ = actions.save_pipeline(request.data, request.user, name=name)
        except actions.ActionError as exc:
            return _error(exc)
        except TopologyError as exc:
            return _problems(exc)
        return Response(_pipeline_json(pipeline, None, detail=True))


class PipelineValidateView(APIView):
    permission_classes = [IsViewer]

    @extend_schema(
        request=PipelineDocumentSerializer,
        responses={200: ValidationResultSerializer, **BAD_DOCUMENT, **DENIED},
        tags=["pipelines"],
        summary="Check a document without saving it (every problem, with where it is)",
    )
    def post(self, request: Request) -> Response:
        # A reference table's columns are read for an operator only, as an input
        # file's first records are (the sample-schema view).
        reads = has_role(request.user, "operator")
        problems = validate_for_save(request.data, read_tables=reads)
        doc = request.data if isinstance(request.data, Mapping) else {}
        name = doc.get("name")
        tables = service.reference_columns(name) if reads and isinstance(name, str) else None
        schemas = service.derive_schemas(doc.get("nodes"), doc.get("edges"), tables=tables)
        return Response(
            {
                "valid": not problems,
                "problems": _problem_list(problems),
                "schemas": {name: s.as_list() for name, s in schemas.by_node.items()},
            }
        )


class SampleSchemaView(APIView):
    permission_classes = TAKES_A_BODY

    @extend_schema(
        request=SampleRequestSerializer,
        responses={200: SampledSchemaSerializer, **BAD_BODY, **DENIED},
        tags=["pipelines"],
        summary="Propose a source's schema from the first records of an input file",
    )
    def post(self, request: Request) -> Response:
        try:
            sample = actions.sample_schema(request.data, request.user)
        except actions.ActionError as exc:
            return _error(exc)
        proposal = sample.proposal
        return Response(
            {
                "schema": proposal.ddl,
                "nested": proposal.nested,
                "file": sample.file,
                "records": sample.records,
                "malformed": sample.malformed,
            }
        )


class PipelineYamlView(APIView):
    permission_classes = [IsViewer]

    @extend_schema(
        responses={
            (200, "application/yaml"): OpenApiResponse(
                OpenApiTypes.OBJECT,
                description="The pipeline as a topology file (docs/topology-format.md): "
                "a YAML mapping with name, nodes and edges",
            ),
            (403, "application/json"): DENIED[403],
            (404, "application/json"): NOT_FOUND[404],
        },
        tags=["pipelines"],
        summary="Export a pipeline as a topology file",
    )
    def get(self, request: Request, name: str) -> HttpResponse | Response:
        try:
            pipeline = _pipeline_or_404(name)
        except actions.ActionError as exc:
            return _error(exc)
        response = HttpResponse(
            dump_yaml(export_document(pipeline)), content_type="application/yaml"
        )
        response["Content-Disposition"] = f'attachment; filename="{pipeline.name}.yaml"'
        return response


class PipelineImportView(APIView):
    permission_classes = TAKES_A_BODY

    @extend_schema(
        request=YamlImportSerializer,
        responses={
            200: PipelineDetailSerializer,
            201: PipelineDetailSerializer,
            **BAD_DOCUMENT,
            **DENIED,
        },
        tags=["pipelines"],
        summary="Create or update a pipeline from a topology file's text (operator; the "
        "role is checked before the body is read)",
    )
    def post(self, request: Request) -> Response:
        payload = YamlImportSerializer(data=request.data)
        if not payload.is_valid():
            problems = [
                {
                    "location": "(document)" if field == "non_field_errors" else field,
                    "message": str(message),
                }
                for field, messages in payload.errors.items()
                for message in messages
            ]
            return Response(
                {
                    "detail": "send {'yaml': '<topology file text>'}; nothing saved",
                    "problems": problems,
                },
                status=400,
            )
        return _save(request, lambda: parse_yaml(payload.validated_data["yaml"]))


# -- runs -------------------------------------------------------------------------------


class RunListView(APIView):
    permission_classes = TAKES_A_BODY

    @extend_schema(
        parameters=[
            OpenApiParameter("pipeline", str, description="pipeline name"),
            OpenApiParameter("status", str, description="pending, running, paused, ..."),
            OpenApiParameter("limit", int, description="at most this many (default 50)"),
        ],
        responses={200: RunSerializer(many=True), **BAD_QUERY, **DENIED, **NOT_FOUND},
        tags=["runs"],
    )
    def get(self, request: Request) -> Response:
        if not has_role(request.user, "viewer"):
            return Response({"detail": IsViewer.message}, status=403)
        try:
            name, run_status = _text(request, "pipeline"), _text(request, "status")
        except actions.ActionError as exc:
            return _error(exc)
        pipeline_id = None
        if name:
            pipeline = Pipeline.objects.filter(name=name).first()
            if pipeline is None:
                return Response({"detail": f"there is no pipeline {shown(name)}"}, status=404)
            pipeline_id = pipeline.pk
        limit = _int(request.query_params.get("limit"), 50)
        runs = service.runs_of(pipeline_id=pipeline_id, status=run_status)
        return Response([run_json(r) for r in runs[: max(1, min(limit, 500))]])

    @extend_schema(
        request=StartRunSerializer,
        examples=[
            OpenApiExample(
                "generated input",
                value={"pipeline": "reference", "generator": "seed=7,volume_mb=8,dominance=0.8"},
                request_only=True,
            ),
            OpenApiExample(
                "a landing folder",
                value={
                    "pipeline": "reference",
                    "source": {"kind": "folder", "folder": "landing", "clean": "keep"},
                },
                request_only=True,
            ),
            OpenApiExample(
                "a Redis stream",
                value={"pipeline": "reference", "source": {"kind": "stream", "stream": "events"}},
                request_only=True,
            ),
        ],
        responses={
            201: RunSerializer,
            **BAD_BODY,
            **DENIED,
            **NOT_FOUND,
            **OVER_QUOTA,
            503: OpenApiResponse(
                DetailSerializer,
                description="the broker is down; the run was created and marked cancelled",
            ),
        },
        tags=["runs"],
        summary="Start a run of a saved pipeline (operator)",
    )
    def post(self, request: Request) -> Response:
        payload = StartRunSerializer(data=request.data)
        if not payload.is_valid():
            return _invalid(payload)
        data = payload.validated_data
        try:
            run = actions.start_run(
                actions.RunRequest(
                    pipeline=data["pipeline"],
                    generator=data.get("generator") or None,
                    input_path=data.get("input_path") or None,
                    policy=data.get("policy") or None,
                    source=data.get("source") or None,
                ),
                request.user,
            )
        except actions.ActionError as exc:
            return _error(exc)
        return Response(run_json(run), status=201)


def _invalid(payload: Any) -> Response:
    errors = _field_errors(payload.errors)
    fields = "; ".join(f"{field}: {' '.join(messages)}" for field, messages in errors.items())
    return Response({"detail": f"invalid request ({fields})", "errors": errors}, status=400)


def _field_errors(errors: Any, prefix: str = "") -> dict[str, list[str]]:
    """DRF's errors by field, a nested serializer's (``source``) as ``source.kind``: the
    documented shape is one list of messages per field."""
    if isinstance(errors, dict):
        flat: dict[str, list[str]] = {}
        for field, nested in errors.items():
            flat.update(_field_errors(nested, f"{prefix}.{field}" if prefix else str(field)))
        return flat
    messages = errors if isinstance(errors, list) else [errors]
    return {prefix or "non_field_errors": [str(m) for m in messages]}


class RunDetailView(APIView):
    permission_classes = [IsViewer]

    @extend_schema(responses={200: RunSerializer, **DENIED, **NOT_FOUND}, tags=["runs"])
    def get(self, request: Request, run_id: int) -> Response:
        try:
            return Response(run_json(actions.get_run(run_id)))
        except actions.ActionError as exc:
            return _error(exc)


class RunSnapshotView(APIView):
    permission_classes = [IsViewer]

    @extend_schema(
        responses={
            200: OpenApiResponse(
                OpenApiTypes.OBJECT,
                description="The same snapshot the websocket sends: run, nodes, links, events "
                "(see docs/api.md)",
            ),
            **DENIED,
            **NOT_FOUND,
        },
        tags=["runs"],
    )
    def get(self, request: Request, run_id: int) -> Response:
        try:
            actions.get_run(run_id)
        except actions.ActionError as exc:
            return _error(exc)
        return Response(service.snapshot(run_id))


class RunCompletionView(APIView):
    permission_classes = [IsViewer]

    @extend_schema(
        responses={200: CompletionSerializer, **DENIED, **NOT_FOUND},
        tags=["runs"],
        summary="Completed fraction over time (Figures 7/8)",
    )
    def get(self, request: Request, run_id: int) -> Response:
        try:
            actions.get_run(run_id)
        except actions.ActionError as exc:
            return _error(exc)
        return Response({"run": run_id, "points": service.completion_history(run_id)})


class RunResultsView(APIView):
    permission_classes = [IsViewer]

    @extend_schema(
        parameters=[
            OpenApiParameter("limit", int, description="at most this many keys (100, up to 1000)")
        ],
        responses={200: ResultsSerializer, **BAD_QUERY, **DENIED, **NOT_FOUND},
        tags=["runs"],
        summary="The result so far: the keys with the most records, exact up to a position",
    )
    def get(self, request: Request, run_id: int) -> Response:
        try:
            actions.get_run(run_id)
        except actions.ActionError as exc:
            return _error(exc)
        raw = request.query_params.get("limit", "100")
        # ASCII and short first: "²" is a digit to isdigit() but not to int(), and int()
        # refuses a string of more than 4,300 digits with a ValueError (a 500).
        if not (raw.isascii() and raw.isdigit() and len(raw) <= 4) or not 1 <= int(raw) <= 1000:
            return Response({"detail": "limit must be a whole number from 1 to 1000"}, status=400)
        return Response(service.run_results(run_id, limit=int(raw)))


class RunResultsCsvView(APIView):
    permission_classes = [IsViewer]

    @extend_schema(
        responses={
            (200, "text/csv"): OpenApiResponse(description="the columns, then every row"),
            **DENIED,
            **NOT_FOUND,
        },
        tags=["runs"],
        summary="The whole result as CSV, each column by its name",
    )
    def get(self, request: Request, run_id: int) -> HttpResponseBase:
        try:
            actions.get_run(run_id)
        except actions.ActionError as exc:
            return _error(exc)
        response = StreamingHttpResponse(
            service.results_csv(run_id), content_type="text/csv; charset=utf-8"
        )
        response["Content-Disposition"] = f'attachment; filename="run-{run_id}-results.csv"'
        return response


EVENT_FILTERS = [
    OpenApiParameter("since", int, description="only events with a larger id"),
    OpenApiParameter("node", str),
    OpenApiParameter("kind", str, description="e.g. set_flag, start_migration, action_refused"),
    OpenApiParameter("limit", int, description="at most this many, newest first (200)"),
]


class RunEventsView(APIView):
    permission_classes = [IsViewer]

    @extend_schema(
        parameters=EVENT_FILTERS,
        responses={200: EventSerializer(many=True), **BAD_QUERY, **DENIED, **NOT_FOUND},
        tags=["runs"],
    )
    def get(self, request: Request, run_id: int) -> Response:
        try:
            actions.get_run(run_id)
            return Response(_events(request, run_id=run_id))
        except actions.ActionError as exc:
            return _error(exc)


class EventListView(APIView):
    permission_classes = [IsViewer]

    @extend_schema(
        parameters=[
            *EVENT_FILTERS,
            OpenApiParameter("run", int),
            OpenApiParameter("actor", str, description="'user': operator actions and refusals"),
        ],
        responses={200: EventSerializer(many=True), **BAD_QUERY, **DENIED},
        tags=["events"],
    )
    def get(self, request: Request) -> Response:
        run = request.query_params.get("run")
        try:
            return Response(_events(request, run_id=_int(run, None)))
        except actions.ActionError as exc:
            return _error(exc)


def _events(request: Request, *, run_id: int | None) -> list[dict[str, Any]]:
    params = request.query_params
    events = service.events_of(
        run_id=run_id,
        since_id=_int(params.get("since"), None),
        node=_text(request, "node") or None,
        kind=_text(request, "kind") or None,
        by_users=params.get("actor") == "user",
        limit=_int(params.get("limit"), 200) or 200,
    )
    return [event_json(e) for e in events]


def _int(raw: str | None, default: int | None) -> Any:
    try:
        return int(raw) if raw not in (None, "") else default
    except ValueError:
        return default


# -- actions ----------------------------------------------------------------------------


class RunControlView(APIView):
    """pause / resume / stop / cancel; ``verb`` comes from the URL."""

    permission_classes = [IsAuthenticated]
    verb = ""

    @extend_schema(
        request=None,
        responses={200: ActionResultSerializer, **DENIED, **NOT_FOUND, **CONFLICT},
        tags=["actions"],
    )
    def post(self, request: Request, run_id: int) -> Response:
        try:
            run = actions.control_run(run_id, self.verb, request.user)
        except actions.ActionError as exc:
            return _error(exc)
        return Response({"detail": f"run {run.pk} is {run.status}", "run": run_json(run)})


class PauseView(RunControlView):
    verb = "pause"


class ResumeView(RunControlView):
    verb = "resume"


class StopView(RunControlView):
    """A landing folder's or a stream's run stops reading and completes once what it took
    in is merged (status stopping, then completed); any other run is cancelled."""

    verb = "stop"


class CancelView(RunControlView):
    """Cancel an active run at once: what it took in and has not merged is abandoned."""

    verb = "cancel"


class NodeActionView(APIView):
    permission_classes = TAKES_A_BODY
    stop = False

    @extend_schema(
        request=NodeActionSerializer,
        examples=[OpenApiExample("a node", value={"node": "task1"}, request_only=True)],
        responses={200: DetailSerializer, **BAD_BODY, **DENIED, **NOT_FOUND, **CONFLICT},
        tags=["actions"],
    )
    def post(self, request: Request, run_id: int) -> Response:
        node = request.data.get("node") if hasattr(request.data, "get") else None
        try:
            detail = actions.node_action(run_id, node, request.user, stop=self.stop)
        except actions.ActionError as exc:
            return _error(exc)
        return Response({"detail": detail})


class MigrateView(NodeActionView):
    """Migrate this branch's data now (to the lightest branch, by pressure score)."""

    stop = False


class StopMigratingView(NodeActionView):
    """Stop migrating this branch's data (back to the default routing)."""

    stop = True


class AdjustView(APIView):
    """Hot-migrate, add or remove an operator instance (docs/spec/hot-rescale.md)."""

    permission_classes = TAKES_A_BODY

    @extend_schema(
        request=AdjustSerializer,
        examples=[
            OpenApiExample(
                "hot migration",
                value={"action": "hot_migrate", "node": "task2"},
                request_only=True,
            ),
            OpenApiExample(
                "one more instance",
                value={"action": "add_instance", "stage": "agg"},
                request_only=True,
            ),
        ],
        responses={200: DetailSerializer, **BAD_BODY, **DENIED, **NOT_FOUND, **CONFLICT},
        tags=["actions"],
        summary="Hot-migrate, add or remove an operator instance; the driver acts next tick",
    )
    def post(self, request: Request, run_id: int) -> Response:
        body = request.data if hasattr(request.data, "get") else {}
        try:
            detail = actions.adjust(
                run_id,
                body.get("action"),
                request.user,
                node=body.get("node") or "",
                stage=body.get("stage") or "",
                worker=body.get("worker") or "",
            )
        except actions.ActionError as exc:
            return _error(exc)
        return Response({"detail": detail})


# -- workers ----------------------------------------------------------------------------


class WorkerListView(APIView):
    permission_classes = [IsViewer]

    @extend_schema(
        responses={200: WorkerSerializer(many=True), **DENIED},
        tags=["workers"],
        summary="Live Spark workers, where instances can be placed",
    )
    def get(self, request: Request) -> Response:
        return Response(actions.live_workers())


# -- policy lab -------------------------------------------------------------------------


class PipelineLabsView(APIView):
    """A pipeline's policy labs: every policy simulated on one workload (docs/console.md)."""

    permission_classes = TAKES_A_BODY

    @extend_schema(
        responses={200: LabSerializer(many=True), **DENIED, **NOT_FOUND},
        tags=["labs"],
        summary="The pipeline's latest policy labs, newest first",
    )
    def get(self, request: Request, name: str) -> Response:
        if not has_role(request.user, "viewer"):
            return Response({"detail": IsViewer.message}, status=403)
        pipeline = Pipeline.objects.filter(name=name).first()
        if pipeline is None:
            return Response({"detail": f"there is no pipeline {shown(name)}"}, status=404)
        return Response([service.lab_json(lab) for lab in service.labs_of(pipeline.pk)])

    @extend_schema(
        request=StartLabSerializer,
        examples=[
            OpenApiExample(
                "generated workload", value={"generator": "seed=7,volume_mb=64"}, request_only=True
            ),
            OpenApiExample("a completed run's input", value={"run": 12}, request_only=True),
        ],
        responses={
            201: LabSerializer,
            **BAD_BODY,
            **DENIED,
            **NOT_FOUND,
            **OVER_QUOTA,
            503: OpenApiResponse(DetailSerializer, description="the broker is down"),
        },
        tags=["labs"],
        summary="Simulate every policy on a workload of the pipeline, in a worker (operator)",
    )
    def post(self, request: Request, name: str) -> Response:
        payload = StartLabSerializer(data=request.data)
        if not payload.is_valid():
            return _invalid(payload)
        data = payload.validated_data
        try:
            lab = actions.create_lab(
                name, request.user, generator=data.get("generator") or None, run_id=data.get("run")
            )
        except actions.ActionError as exc:
            return _error(exc)
        return Response(service.lab_json(lab), status=201)


class LabDetailView(APIView):
    permission_classes = [IsViewer]

    @extend_schema(
        responses={200: LabSerializer, **DENIED, **NOT_FOUND},
        tags=["labs"],
        summary="A policy lab: its status and, once done, each policy's predicted curve",
    )
    def get(self, request: Request, lab_id: int) -> Response:
        try:
            lab = actions.get_lab(lab_id)
        except actions.ActionError as exc:
            return _error(exc)
        return Response(service.lab_json(lab))


class LabRunsView(APIView):
    permission_classes = TAKES_A_BODY

    @extend_schema(
        request=StartLabRunSerializer,
        examples=[OpenApiExample("ours", value={"policy": "ours"}, request_only=True)],
        responses={
            201: RunSerializer,
            **BAD_BODY,
            **DENIED,
            **NOT_FOUND,
            **CONFLICT,
            **OVER_QUOTA,
            503: OpenApiResponse(DetailSerializer, description="the broker is down"),
        },
        tags=["labs"],
        summary="Start a live run of the lab's workload with one of its policies (operator)",
    )
    def post(self, request: Request, lab_id: int) -> Response:
        payload = StartLabRunSerializer(data=request.data)
        if not payload.is_valid():
            return _invalid(payload)
        try:
            run = actions.start_lab_run(lab_id, payload.validated_data["policy"], request.user)
        except actions.ActionError as exc:
            return _error(exc)
        return Response(run_json(run), status=201)
