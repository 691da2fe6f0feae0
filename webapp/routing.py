"""Websocket routes (the live run view arrives with the runtime)."""

from django.urls import URLPattern

websocket_urlpatterns: list[URLPattern] = []
