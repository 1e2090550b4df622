"""System checks of the notebook origin: set, and not the console's (`manage.py check`, `gpucloud serve`/`up`)."""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.core.checks import CheckMessage, Error, Tags, register
from django.http.request import validate_host

from common.origins import Origin, OriginPattern, parse_origin

_SAMPLE_ID = 1  # a per-notebook origin is checked as notebook 1's: every notebook's differs only in the id


def _loopback(host: str) -> bool:
    return host in ("localhost", "[::1]") or host.startswith("127.") or host.endswith(".localhost")


def _console_problems(pattern: OriginPattern, notebook: Origin) -> list[str]:
    problems = []
    # On loopback the console and the notebooks share a host on two ports (`gpucloud up` checks the ports).
    if validate_host(notebook.host, list(settings.ALLOWED_HOSTS)) and not _loopback(notebook.host):
        problems.append(f"its host {notebook.host} is one of the console's ALLOWED_HOSTS")
    trusted = [parse_origin(o.replace("*.", "")) for o in settings.CSRF_TRUSTED_ORIGINS]
    if any(o is not None and (o == notebook or notebook.host.endswith("." + o.host)) for o in trusted):
        problems.append("CSRF_TRUSTED_ORIGINS trusts it: its pages could post to the console")
    for name in ("SESSION_COOKIE_DOMAIN", "CSRF_COOKIE_DOMAIN"):
        domain = (getattr(settings, name) or "").lstrip(".").lower()
        if domain and (notebook.host == domain or notebook.host.endswith("." + domain)):
            problems.append(f"{name}={domain} sends the console's cookies to it")
    if settings.HTTPS and pattern.scheme != "https":
        problems.append("the console is served over https but notebooks over plain http")
    return problems


def notebook_origin_errors() -> list[str]:
    """Return what is wrong with `NOTEBOOK_ORIGIN` for this console (unset, or the console's own), or nothing."""
    pattern: OriginPattern | None = settings.NOTEBOOK_ORIGIN
    if pattern is None:
        return [
            "NOTEBOOK_ORIGIN is not set: notebooks must be served on an origin that is not the console's, e.g. "
            "https://nb-{id}.apps.example.org (wildcard DNS and certificate) or https://apps.example.org "
            "(docs/deploy.md)."
        ]
    problems = _console_problems(pattern, pattern.origin_of(_SAMPLE_ID))
    return [f"NOTEBOOK_ORIGIN={pattern}: {problem}." for problem in problems]


@register(Tags.security)
def check_notebook_origin(app_configs: Any = None, **kwargs: Any) -> list[CheckMessage]:
    """Fail `check` (and so `check --deploy`) when notebooks would share the console's origin or credentials."""
    return [Error(message, id="jobs.E001") for message in notebook_origin_errors()]
