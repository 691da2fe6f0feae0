from django.contrib import admin
from django.contrib.auth import views as auth_views
from django.urls import path
from drf_spectacular.views import SpectacularAPIView

from webapp.console import api, views

admin.site.site_header = "Backpressure console administration"
admin.site.site_title = "Backpressure console"

api_urlpatterns = [
    path("api/schema/", SpectacularAPIView.as_view(), name="api-schema"),
    path("api/pipelines/", api.PipelineListView.as_view(), name="api-pipelines"),
    path("api/pipelines/validate/", api.PipelineValidateView.as_view(), name="api-validate"),
    path("api/pipelines/import/", api.PipelineImportView.as_view(), name="api-import"),
    path("api/pipelines/<str:name>/", api.PipelineDetailView.as_view(), name="api-pipeline"),
    path("api/pipelines/<str:name>/yaml/", api.PipelineYamlView.as_view(), name="api-yaml"),
    path("api/runs/", api.RunListView.as_view(), name="api-runs"),
    path("api/runs/<int:run_id>/", api.RunDetailView.as_view(), name="api-run"),
    path("api/runs/<int:run_id>/snapshot/", api.RunSnapshotView.as_view(), name="api-snapshot"),
    path(
        "api/runs/<int:run_id>/completion/",
        api.RunCompletionView.as_view(),
        name="api-completion",
    ),
    path("api/runs/<int:run_id>/events/", api.RunEventsView.as_view(), name="api-run-events"),
    path("api/runs/<int:run_id>/pause/", api.PauseView.as_view(), name="api-pause"),
    path("api/runs/<int:run_id>/resume/", api.ResumeView.as_view(), name="api-resume"),
    path("api/runs/<int:run_id>/stop/", api.StopView.as_view(), name="api-stop"),
    path("api/runs/<int:run_id>/migrate/", api.MigrateView.as_view(), name="api-migrate"),
    path(
        "api/runs/<int:run_id>/stop-migrating/",
        api.StopMigratingView.as_view(),
        name="api-stop-migrating",
    ),
    path("api/runs/<int:run_id>/adjust/", api.AdjustView.as_view(), name="api-adjust"),
    path("api/events/", api.EventListView.as_view(), name="api-events"),
    path("api/workers/", api.WorkerListView.as_view(), name="api-workers"),
]

urlpatterns = [
    path("", views.pipeline_list, name="pipelines"),
    path("pipelines/new/", views.pipeline_edit, name="pipeline-new"),
    path("pipelines/import/", views.pipeline_import, name="pipeline-import"),
    path("pipelines/<str:name>/", views.pipeline_detail, name="pipeline"),
    path("pipelines/<str:name>/edit/", views.pipeline_edit, name="pipeline-edit"),
    path("pipelines/<str:name>/export.yaml", views.pipeline_export, name="pipeline-export"),
    path("pipelines/<str:name>/start/", views.run_start, name="run-start"),
    path("runs/<int:run_id>/", views.run_view, name="run"),
    path("activity/", views.activity, name="activity"),
    path("login/", auth_views.LoginView.as_view(), name="login"),
    path("logout/", auth_views.LogoutView.as_view(), name="logout"),
    path("healthz", views.healthz, name="healthz"),
    path("admin/", admin.site.urls),
    *api_urlpatterns,
]
