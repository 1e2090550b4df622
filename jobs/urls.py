"""The console's notebook hand-off URLs (jobs.views), under `/notebooks/`."""

from __future__ import annotations

from django.urls import URLPattern, path, register_converter

from jobs import views


class WorkloadId:
    """A workload id as the proxy's paths bound it: always fits a database integer."""

    regex = "[1-9][0-9]{0,17}"

    def to_python(self, value: str) -> int:
        return int(value)

    def to_url(self, value: int) -> str:
        return str(value)


register_converter(WorkloadId, "workload")

app_name = "notebooks"

urlpatterns: list[URLPattern] = [
    path("<workload:workload_id>/open", views.open_notebook, name="open"),
    path("<workload:workload_id>/<path:rest>", views.notebook_path, name="path"),
]
