"""WebSocket routes. Live logs, GPU metrics and events arrive with the live-data issue."""

from __future__ import annotations

from django.urls import URLPattern

websocket_urlpatterns: list[URLPattern] = []
