"""The strict environment readers behind the settings."""

from __future__ import annotations

import pytest
from django.core.exceptions import ImproperlyConfigured

from gpucloud import env


@pytest.mark.parametrize(("raw", "expected"), [("1", True), ("yes", True), ("off", False), ("FALSE", False)])
def test_env_bool_accepts_the_usual_spellings(monkeypatch: pytest.MonkeyPatch, raw: str, expected: bool) -> None:
    monkeypatch.setenv("X_FLAG", raw)
    assert env.env_bool("X_FLAG", not expected) is expected


def test_unset_and_empty_fall_back_to_default(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("X_FLAG", raising=False)
    assert env.env_bool("X_FLAG", True) is True
    monkeypatch.setenv("X_FLAG", "  ")
    assert env.env_int("X_FLAG", 7) == 7


@pytest.mark.parametrize(
    ("reader", "raw"),
    [
        (lambda: env.env_bool("X_VAR", False), "maybe"),
        (lambda: env.env_int("X_VAR", 1), "ten"),
        (lambda: env.env_int("X_VAR", 1, minimum=0), "-1"),
        (lambda: env.env_int("X_VAR", 1, maximum=5), "6"),
        (lambda: env.env_list("X_VAR", []), "a,,b"),
        (lambda: env.env_url("X_VAR", None, schemes=("redis",)), "http://x"),
    ],
)
def test_malformed_values_name_the_variable(monkeypatch: pytest.MonkeyPatch, reader, raw: str) -> None:
    monkeypatch.setenv("X_VAR", raw)
    with pytest.raises(ImproperlyConfigured, match="X_VAR"):
        reader()


def test_env_list_strips_items(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("X_HOSTS", " a.example , b.example")
    assert env.env_list("X_HOSTS", []) == ["a.example", "b.example"]


def test_postgres_url_is_parsed() -> None:
    parsed = env.parse_database_url("DATABASE_URL", "postgres://u%40x:p%2Fw@db.local:6543/gpu?sslmode=require")
    assert parsed.engine == "django.db.backends.postgresql"
    assert (parsed.user, parsed.password, parsed.host, parsed.port, parsed.name) == (
        "u@x",
        "p/w",
        "db.local",
        "6543",
        "gpu",
    )
    assert parsed.options == (("sslmode", "require"),)


def test_sqlite_url_is_parsed() -> None:
    parsed = env.parse_database_url("DATABASE_URL", "sqlite:////var/lib/gpucloud/db.sqlite3")
    assert parsed.engine.endswith("sqlite3")
    assert parsed.name == "/var/lib/gpucloud/db.sqlite3"


@pytest.mark.parametrize(
    "url", ["mysql://u:p@h/db", "postgres://u:p@h:notaport/db", "postgres://u:p@h:5432/", "sqlite://"]
)
def test_bad_database_urls_name_the_variable(url: str) -> None:
    with pytest.raises(ImproperlyConfigured, match="DATABASE_URL"):
        env.parse_database_url("DATABASE_URL", url)
