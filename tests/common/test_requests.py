"""common.requests.client_address: one rule for the client address (audit log, logins, metrics, throttles)."""

from __future__ import annotations

from typing import Any

from django.test import RequestFactory

from common.requests import client_address
from tenants.middleware import request_info_for


def test_without_a_trusted_proxy_the_socket_peer_is_the_client(settings: Any) -> None:
    settings.TRUST_X_FORWARDED_FOR = False
    request = RequestFactory().get("/", REMOTE_ADDR="10.0.0.9", HTTP_X_FORWARDED_FOR="203.0.113.7")
    assert client_address(request) == "10.0.0.9"


def test_behind_a_trusted_proxy_the_entry_it_wrote_counts_never_one_the_client_wrote(settings: Any) -> None:
    settings.TRUST_X_FORWARDED_FOR = True
    # A proxy that appends: the client sent "127.0.0.1" itself; the proxy added the real peer last.
    request = RequestFactory().get("/", REMOTE_ADDR="10.0.0.2", HTTP_X_FORWARDED_FOR="127.0.0.1, 203.0.113.7")
    assert client_address(request) == "203.0.113.7"
    assert request_info_for(request).source_ip == "203.0.113.7", "the audit log records the same address"
    assert client_address(RequestFactory().get("/", REMOTE_ADDR="10.0.0.2")) == "10.0.0.2"
