"""Console responses carry a strict Content-Security-Policy (common/csp.py); tests/browser/test_csp.py runs it."""

from __future__ import annotations

import pytest
from django.test import Client

pytestmark = pytest.mark.django_db


def _directives(header: str) -> dict[str, list[str]]:
    parts = (part.split() for part in header.split(";") if part.strip())
    return {name: values for name, *values in parts}


@pytest.mark.parametrize("secure", [False, True])
def test_a_console_page_allows_only_its_own_scripts_and_its_websocket_origin(secure: bool) -> None:
    response = Client().get("/login/", secure=secure)
    policy = _directives(response.headers["Content-Security-Policy"])
    assert policy["script-src"] == ["'self'"]
    assert policy["object-src"] == ["'none'"] and policy["frame-ancestors"] == ["'none'"]
    assert policy["base-uri"] == ["'self'"]
    assert policy["connect-src"] == ["'self'", f"{'wss' if secure else 'ws'}://testserver"]


def test_the_api_docs_need_no_inline_script() -> None:
    page = Client().get("/api/v1/docs/").content.decode()
    assert "<script>" not in page and "<script " in page
