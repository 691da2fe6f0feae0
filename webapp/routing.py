"""Websocket routes: the live run view."""

from django.urls import URLPattern, re_path

from webapp.console.consumers import RunConsumer

websocket_urlpatterns: list[URLPattern] = [
    re_path(r"^ws/runs/(?P<run_id>\d+)/$", RunConsumer.as_asgi(), name="ws-run"),
]
