from django.contrib import admin
from django.contrib.auth import views as auth_views
from django.urls import path, register_converter

from webapp.console import api, views

admin.site.site_header = "Backpressure console administration"
admin.site.site_title = "Backpressure console"


class RunIdConverter:
    """A run id: at most 18 digits, so that every id that matches fits the database's
    bigint; the schema says so (SPECTACULAR_SETTINGS PATH_CONVERTER_OVERRIDES)."""

    regex = "[0-9]{1,18}"

    def to_python(self, value: str) -> int:
        return int(value)

    def to_url(self, value: int) -> str:
        return str(value)


class PipelineNameConverter:
    """A pipeline name as the topology format defines it (NAME_RE, at most 100
    characters): anything else cannot name a pipeline and is a 404 at once."""

    regex = "[A-Za-z0-9][A-Za-z0-9_.-]{0,99}"

    def to_python(self, value: str) -> str:
        return value

    def to_url(self, value: str) -> str:
        return value


register_converter(RunIdConverter, "run_id")
register_converter(PipelineNameConverter, "pipeline")

# Outside the views, Django's own error answers: JSON under /api/, pages elsewhere.
handler400 = "webapp.console.errors.bad_request"
handler403 = "webapp.console.errors.permission_denied"
handler404 = "webapp.console.errors.not_found"
handler500 = "webapp.console.errors.server_error"

api_urlpatterns = [
    path("api/schema/", api.SchemaView.as_view(), name="api-schema"),
    path("api/pipelines/", api.PipelineListView.as_view(), name="api-pipelines"),
    path("api/pipelines/validate/", api.PipelineValidateView.as_view(), name="api-validate"),
    path("api/pipelines/import/", api.PipelineImportView.as_view(), name="api-import"),
    path(
        "api/pipelines/sample-schema/",
        api.SampleSchemaView.as_view(),
        name="api-sample-schema",
    ),
    path("api/pipelines/<pipeline:name>/", api.PipelineDetailView.as_view(), name="api-pipeline"),
    path("api/pipelines/<pipeline:name>/yaml/", api.PipelineYamlView.as_view(), name="api-yaml"),
    path("api/pipelines/<pipeline:name>/labs/", api.PipelineLabsView.as_view(), name="api-labs"),
    path("api/labs/<run_id:lab_id>/", api.LabDetailView.as_view(), name="api-lab"),
    path("api/labs/<run_id:lab_id>/runs/", api.LabRunsView.as_view(), name="api-lab-runs"),
    path("api/runs/", api.RunListView.as_view(), name="api-runs"),
    path("api/runs/<run_id:run_id>/", api.RunDetailView.as_view(), name="api-run"),
    path("api/runs/<run_id:run_id>/snapshot/", api.RunSnapshotView.as_view(), name="api-snapshot"),
    path("api/runs/<run_id:run_id>/results/", api.RunResultsView.as_view(), name="api-results"),
    path(
        "api/runs/<run_id:run_id>/results.csv",
        api.RunResultsCsvView.as_view(),
        name="api-results-csv",
    ),
    path(
        "api/runs/<run_id:run_id>/completion/",
        api.RunCompletionView.as_view(),
        name="api-completion",
    ),
    path("api/runs/<run_id:run_id>/events/", api.RunEventsView.as_view(), name="api-run-events"),
    path("api/runs/<run_id:run_id>/pause/", api.PauseView.as_view(), name="api-pause"),
    path("api/runs/<run_id:run_id>/resume/", api.ResumeView.as_view(), name="api-resume"),
    path("api/runs/<run_id:run_id>/stop/", api.StopView.as_view(), name="api-stop"),
    path("api/runs/<run_id:run_id>/cancel/", api.CancelView.as_view(), name="api-cancel"),
    path("api/runs/<run_id:run_id>/migrate/", api.MigrateView.as_view(), name="api-migrate"),
    path(
        "api/runs/<run_id:run_id>/stop-migrating/",
        api.StopMigratingView.as_view(),
        name="api-stop-migrating",
    ),
    path("api/runs/<run_id:run_id>/adjust/", api.AdjustView.as_view(), name="api-adjust"),
    path("api/events/", api.EventListView.as_view(), name="api-events"),
    path("api/workers/", api.WorkerListView.as_view(), name="api-workers"),
]

urlpatterns = [
    path("", views.pipeline_list, name="pipelines"),
    path("pipelines/new/", views.pipeline_edit, name="pipeline-new"),
    path("pipelines/import/", views.pipeline_import, name="pipeline-import"),
    path("pipelines/<pipeline:name>/", views.pipeline_detail, name="pipeline"),
    path("pipelines/<pipeline:name>/edit/", views.pipeline_edit, name="pipeline-edit"),
    path("pipelines/<pipeline:name>/export.yaml", views.pipeline_export, name="pipeline-export"),
    path("pipelines/<pipeline:name>/start/", views.run_start, name="run-start"),
    path("pipelines/<pipeline:name>/lab/", views.lab_create, name="lab-create"),
    path("labs/<run_id:lab_id>/", views.lab_view, name="lab"),
    path("labs/<run_id:lab_id>/start/", views.lab_start, name="lab-start"),
    path("runs/<run_id:run_id>/", views.run_view, name="run"),
    path("activity/", views.activity, name="activity"),
    path("login/", auth_views.LoginView.as_view(), name="login"),
    path("logout/", auth_views.LogoutView.as_view(), name="logout"),
    path("healthz", views.healthz, name="healthz"),
    path("admin/", admin.site.urls),
    *api_urlpatterns,
]
