"""Where `gpucloud serve`/`up` serve notebooks: the notebook origin's own port, or refusing to start."""

from __future__ import annotations

import socket

import pytest
from django.test import override_settings

from common.origins import parse_origin_pattern
from gpucloud.embedded import default_notebook_origin, notebook_socket

LOOPBACK = ["127.0.0.1", "localhost", "[::1]"]


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _serving(origin: str | None, *, host: str = "127.0.0.1", port: int = 8000) -> socket.socket | None:
    pattern = parse_origin_pattern(origin) if origin else None
    with override_settings(NOTEBOOK_ORIGIN=pattern):
        return notebook_socket(host, port)


def test_a_console_on_loopback_serves_notebooks_on_the_next_port_by_default() -> None:
    assert default_notebook_origin("127.0.0.1", 8000, LOOPBACK) == "http://127.0.0.1:8001"
    assert default_notebook_origin("::1", 9000, LOOPBACK) == "http://[::1]:9001"
    assert default_notebook_origin("0.0.0.0", 8000, LOOPBACK) is None  # noqa: S104 -- names the wildcard address
    assert default_notebook_origin("127.0.0.1", 8000, ["gpucloud.example.com"]) is None


@pytest.mark.parametrize("origin", ["http://127.0.0.1:{free}", "http://lab.example:{free}"])
def test_plain_http_on_a_port_of_its_own_is_served_by_this_process(origin: str) -> None:
    free = _free_port()
    served = _serving(origin.format(free=free))
    assert served is not None
    with served:
        assert served.getsockname() == ("127.0.0.1", free)


@pytest.mark.parametrize("origin", ["https://nb-{id}.apps.example.net", "https://apps.example.net", "http://apps.lab"])
def test_behind_a_reverse_proxy_the_console_port_serves_notebooks_too(origin: str) -> None:
    assert _serving(origin) is None


@pytest.mark.parametrize(
    ("origin", "problem"),
    [(None, "NOTEBOOK_ORIGIN is not set"), ("http://127.0.0.1:8000", "the console's own address")],
)
def test_no_notebook_origin_or_the_consoles_own_stops_the_server(origin: str | None, problem: str) -> None:
    with pytest.raises(SystemExit) as stopped:
        _serving(origin)
    assert problem in str(stopped.value)
