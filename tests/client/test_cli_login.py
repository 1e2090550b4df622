"""Logging in with `gpc`: a token read from stdin, checked by the console, kept owner-only, never printed."""

from __future__ import annotations

import json
import stat

import pytest

from tests.client.conftest import Gpc, Platform, new_token

pytestmark = pytest.mark.django_db(transaction=True)


def test_login_keeps_the_token_owner_only_and_whoami_shows_who_without_it(platform: Platform) -> None:
    gpc, token = platform.member, platform.member_token
    assert stat.S_IMODE(gpc.config.stat().st_mode) == 0o600
    assert stat.S_IMODE(gpc.config.parent.stat().st_mode) == 0o700
    assert token in gpc.config.read_text(), "the token is kept, in the owner-only file only"

    who = gpc("whoami")
    assert who.returncode == 0, who.stderr
    assert "member_a" in who.stdout and "tenant-a" in who.stdout and "alpha" in who.stdout
    prefix = token.split("_")[1]
    assert f"gpc_{prefix}_" in who.stdout, "the token shows as its prefix only"
    me = json.loads(gpc("-o", "json", "whoami").stdout)
    assert me["username"] == "member_a" and me["token"]["tenant"] == "tenant-a"
    assert [m["tenant"] for m in me["memberships"]] == ["tenant-a"]


def test_a_token_the_console_refuses_is_not_saved(platform: Platform) -> None:
    gpc = Gpc(platform.member.config.with_name("other.yaml"))
    refused = gpc("login", platform.url, "--token-stdin", stdin="gpc_0123456789ab_not-a-real-secret\n")
    assert refused.returncode == 4, refused.stderr
    assert refused.stderr.startswith("error: ")
    assert "not-a-real-secret" not in refused.stdout + refused.stderr
    assert not gpc.config.exists()
    nobody = gpc("ls")
    assert nobody.returncode == 4 and "login" in nobody.stderr


def test_contexts_name_each_console_login_and_never_its_token(platform: Platform) -> None:
    world, gpc = platform.world, platform.member
    outsider = new_token(world.admin_b, world.tenant_b)
    gpc.login(platform.url, outsider, "--name", "b")
    first = f"tenant-a@127.0.0.1:{platform.console.port}"  # named after the token's tenant and the console
    listed = gpc("contexts")
    assert listed.returncode == 0, listed.stderr
    rows = [line.split() for line in listed.stdout.splitlines()[1:]]
    assert ["*", "b", platform.url, "tenant-b"] in [row[:4] for row in rows], listed.stdout
    assert [first, platform.url, "tenant-a", "alpha"] in [row[:4] for row in rows], listed.stdout
    contexts = {c["name"]: c for c in json.loads(gpc("-o", "json", "contexts").stdout)}
    assert set(contexts) == {"b", first}
    assert contexts["b"]["current"] and not contexts[first]["current"]
    assert all("token" not in context for context in contexts.values())
    assert json.loads(gpc("-o", "json", "whoami").stdout)["username"] == "admin_b"
    assert json.loads(gpc("--context", first, "-o", "json", "whoami").stdout)["username"] == "member_a"
    assert gpc("use", first).returncode == 0
    assert json.loads(gpc("-o", "json", "whoami").stdout)["username"] == "member_a"
