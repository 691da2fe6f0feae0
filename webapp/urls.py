from django.contrib import admin
from django.contrib.auth import views as auth_views
from django.urls import path

from webapp.console import views

admin.site.site_header = "Backpressure console administration"
admin.site.site_title = "Backpressure console"

urlpatterns = [
    path("", views.pipeline_list, name="pipelines"),
    path("login/", auth_views.LoginView.as_view(), name="login"),
    path("logout/", auth_views.LogoutView.as_view(), name="logout"),
    path("healthz", views.healthz, name="healthz"),
    path("admin/", admin.site.urls),
]
