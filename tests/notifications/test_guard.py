"""Where webhooks may go: a table of URLs and the verdict with and without private networks allowed."""

from __future__ import annotations

import ipaddress

import pytest

from notifications import guard

PUBLIC = "https://hooks.example.com/gpucloud"
CASES = [
    # url, allowed with private networks refused (production default), allowed with them allowed
    (PUBLIC, True, True),
    ("http://hooks.example.com:8080/in?x=1", True, True),
    ("https://93.184.215.14/in", True, True),
    ("ftp://hooks.example.com/in", False, False),
    ("file:///etc/passwd", False, False),
    ("hooks.example.com/in", False, False),
    ("https://user:pass@hooks.example.com/in", False, False),
    ("https://", False, False),
    ("http://127.0.0.1:8000/in", False, True),
    ("http://localhost/in", False, True),
    ("http://10.1.2.3/in", False, True),
    ("http://192.168.1.10/in", False, True),
    ("http://[::1]/in", False, True),
    ("http://[fd12:3456::1]/in", False, True),
    ("http://100.64.0.1/in", False, True),
    ("http://169.254.169.254/latest/meta-data/", False, False),
    ("http://[fe80::1]/in", False, False),
    ("http://[::ffff:169.254.169.254]/in", False, False),
    ("http://[fd00:ec2::254]/in", False, False),
    ("http://100.100.100.200/in", False, False),
    ("http://metadata.google.internal/computeMetadata/v1/", False, False),
    ("http://0.0.0.0/in", False, False),
    ("http://224.0.0.1/in", False, False),
    ("https://hooks.example.com:99999/in", False, False),
    ("https://" + "a" * 2001 + ".example.com/", False, False),
]


@pytest.mark.parametrize(("url", "public_only", "private_too"), CASES)
def test_webhook_urls(url: str, public_only: bool, private_too: bool) -> None:
    assert (guard.url_problem(url, allow_private=False) is None) == public_only
    assert (guard.url_problem(url, allow_private=True) is None) == private_too


def test_the_refusal_says_why() -> None:
    problem = guard.url_problem("http://10.0.0.1/", allow_private=False)
    assert problem is not None and "NOTIFICATIONS_WEBHOOK_ALLOW_PRIVATE" in problem
    metadata = guard.refusal(ipaddress.ip_address("169.254.169.254"), allow_private=True)
    assert metadata == "169.254.169.254 is a link-local or cloud metadata address"


def test_a_name_resolving_to_public_and_private_addresses_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    answers = [(2, 1, 6, "", ("93.184.215.14", 443)), (2, 1, 6, "", ("10.0.0.7", 443))]
    monkeypatch.setattr("socket.getaddrinfo", lambda *args, **kwargs: answers)
    with pytest.raises(guard.AddressRefused, match=r"10\.0\.0\.7"):
        guard.resolve(PUBLIC, allow_private=False)


def test_a_request_goes_to_the_address_that_was_checked(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("socket.getaddrinfo", lambda *args, **kwargs: [(2, 1, 6, "", ("93.184.215.14", 443))])
    target = guard.resolve("https://hooks.example.com/in?a=1", allow_private=False)
    assert target == guard.Target(
        scheme="https", host="hooks.example.com", port=443, path="/in?a=1", address="93.184.215.14"
    )
