"""The contexts file: owner-only permissions, atomic writes, refusal of unsafe files, environment overrides."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from gpucloud_client.config import Config, Context, default_path, redact
from gpucloud_client.errors import EXIT_AUTH, EXIT_FAILED, ConfigError

TOKEN = "gpc_0123456789ab_abcdefghijklmnopqrstuvwxyz012345"
NO_ENV: dict[str, str] = {}


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def _saved(tmp_path: Path) -> Config:
    config = Config(path=tmp_path / "gpucloud" / "config.yaml")
    config.add(Context("prod", "https://gpu.example.com", TOKEN, tenant="acme", project="vision"))
    config.add(Context("lab", "http://127.0.0.1:8000", TOKEN, tenant="lab"), make_current=False)
    config.save()
    return config


def test_save_writes_owner_only_file_in_owner_only_directory(tmp_path: Path) -> None:
    config = _saved(tmp_path)

    assert _mode(config.path) == 0o600
    assert _mode(config.path.parent) == 0o700
    loaded = Config.load(config.path)
    assert loaded.current == "prod"
    assert loaded.contexts["prod"] == Context("prod", "https://gpu.example.com", TOKEN, "acme", "vision")
    assert loaded.contexts["lab"].tenant == "lab" and loaded.contexts["lab"].project is None


def test_save_tightens_an_existing_wider_directory(tmp_path: Path) -> None:
    (tmp_path / "gpucloud").mkdir()
    os.chmod(tmp_path / "gpucloud", 0o755)  # noqa: S103 - the too-wide directory the test starts from

    config = _saved(tmp_path)

    assert _mode(config.path.parent) == 0o700


def test_load_refuses_a_file_the_group_may_read(tmp_path: Path) -> None:
    config = _saved(tmp_path)
    os.chmod(config.path, 0o640)

    with pytest.raises(ConfigError) as caught:
        Config.load(config.path)

    assert "0640" in caught.value.message and "chmod 600" in caught.value.message
    assert TOKEN not in str(caught.value)


def test_load_refuses_a_file_others_may_read(tmp_path: Path) -> None:
    config = _saved(tmp_path)
    os.chmod(config.path, 0o604)

    with pytest.raises(ConfigError):
        Config.load(config.path)


def test_save_replaces_the_file_atomically_and_leaves_no_temporary_file(tmp_path: Path) -> None:
    config = _saved(tmp_path)
    before = config.path.stat().st_ino
    config.use("lab")

    config.save()

    assert config.path.stat().st_ino != before  # a new file renamed over the old one, not rewritten in place
    assert Config.load(config.path).current == "lab"
    assert sorted(p.name for p in config.path.parent.iterdir()) == ["config.yaml"]


def test_failed_save_keeps_the_old_file_whole(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    config = _saved(tmp_path)
    before = config.path.read_text()
    config.remove("prod")

    def refuse(src: str, dst: str) -> None:
        raise OSError("disk full")

    monkeypatch.setattr(os, "replace", refuse)
    with pytest.raises(OSError, match="disk full"):
        config.save()

    assert config.path.read_text() == before
    assert sorted(p.name for p in config.path.parent.iterdir()) == ["config.yaml"]


def test_missing_file_is_an_empty_config(tmp_path: Path) -> None:
    config = Config.load(tmp_path / "nothing" / "config.yaml")

    assert config.contexts == {} and config.current is None


def test_malformed_file_is_a_clear_error(tmp_path: Path) -> None:
    path = tmp_path / "config.yaml"
    path.write_text("contexts: [1, 2\n")
    os.chmod(path, 0o600)

    with pytest.raises(ConfigError, match="not valid YAML") as caught:
        Config.load(path)

    assert caught.value.exit_code == EXIT_FAILED


def test_resolve_picks_name_then_environment_then_current(tmp_path: Path) -> None:
    config = _saved(tmp_path)

    assert config.resolve(environ=NO_ENV).name == "prod"
    assert config.resolve("lab", environ={"GPUCLOUD_CONTEXT": "prod"}).name == "lab"
    assert config.resolve(environ={"GPUCLOUD_CONTEXT": "lab"}).name == "lab"


def test_resolve_applies_environment_overrides(tmp_path: Path) -> None:
    config = _saved(tmp_path)
    env = {"GPUCLOUD_URL": "http://other:9000/", "GPUCLOUD_TENANT": "beta", "GPUCLOUD_PROJECT": "nlp"}

    context = config.resolve(environ=env)

    assert (context.name, context.url, context.token) == ("prod", "http://other:9000", TOKEN)
    assert (context.tenant, context.project) == ("beta", "nlp")


def test_environment_alone_is_enough(tmp_path: Path) -> None:
    env = {"GPUCLOUD_URL": "https://ci.example.com", "GPUCLOUD_TOKEN": TOKEN, "GPUCLOUD_TENANT": "acme"}

    context = Config(path=tmp_path / "none.yaml").resolve(environ=env)

    assert (context.name, context.url, context.tenant, context.project) == ("env", env["GPUCLOUD_URL"], "acme", None)
    assert context.api_url == "https://ci.example.com/api/v1/"
    assert context.ws_url == "wss://ci.example.com"


def test_no_login_is_an_auth_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="gpc login") as caught:
        Config(path=tmp_path / "none.yaml").resolve(environ=NO_ENV)

    assert caught.value.exit_code == EXIT_AUTH


def test_unknown_context_names_the_known_ones(tmp_path: Path) -> None:
    config = _saved(tmp_path)

    with pytest.raises(ConfigError, match=r"'staging'.*known: lab, prod"):
        config.resolve("staging", environ=NO_ENV)


def test_removing_the_current_context_moves_current(tmp_path: Path) -> None:
    config = _saved(tmp_path)

    config.remove("prod")

    assert config.current == "lab"
    with pytest.raises(ConfigError):
        config.remove("prod")


def test_default_path_follows_environment(tmp_path: Path) -> None:
    assert default_path({"GPUCLOUD_CONFIG": str(tmp_path / "c.yaml")}) == tmp_path / "c.yaml"
    assert default_path({"XDG_CONFIG_HOME": str(tmp_path)}) == tmp_path / "gpucloud" / "config.yaml"
    assert default_path({}) == Path.home() / ".config" / "gpucloud" / "config.yaml"


def test_a_token_is_never_shown() -> None:
    context = Context("prod", "https://gpu.example.com", TOKEN, "acme")

    assert redact(TOKEN) == "gpc_0123456789ab_…"
    assert redact("not-a-token") == "…"
    assert TOKEN not in repr(context)
    assert context.describe()["token"] == "gpc_0123456789ab_…"


def test_bad_url_is_refused() -> None:
    with pytest.raises(ConfigError, match="http"):
        Config().resolve(environ={"GPUCLOUD_URL": "gpu.example.com", "GPUCLOUD_TOKEN": TOKEN})
