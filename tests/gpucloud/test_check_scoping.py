"""tools/check_scoping.py: tenant-scoping bypasses only where the allow-list says, each named file:line otherwise."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
import textwrap
from pathlib import Path
from types import ModuleType

import pytest

from tests.gpucloud.test_up import ROOT


def _load_checker() -> ModuleType:
    # A script of tools/, not a package.
    spec = importlib.util.spec_from_file_location("check_scoping", ROOT / "tools" / "check_scoping.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["check_scoping"] = module  # dataclasses look their module up while the class is made
    spec.loader.exec_module(module)
    return module


check_scoping = _load_checker()

# A module of a console app that bypasses the scoping every way the checker knows, and once harmlessly.
VIOLATIONS = """\
from django.db import connection, connections
from django.db.models.expressions import RawSQL

from common.sql import fetch
from jobs.models import Workload


def page(request, tenant):
    rows = Workload.all_tenants.filter(tenant=tenant)
    with connection.cursor() as cursor:
        cursor.execute("SELECT 1")
    raw = Workload.objects.raw("SELECT * FROM jobs_workload")
    extra = Workload.objects.extra(where=["1 = 1"])
    other = connections["default"].cursor()
    return rows, raw, extra, other, RawSQL("1", []), fetch


class Schema:
    queryset = Workload.all_tenants.none()  # reads nothing: no bypass


def sweep():
    return Workload.all_tenants.all()
"""

ALL_REPORTED = [
    ("jobs/views.py:2", "RawSQL"),
    ("jobs/views.py:4", "import of common.sql"),
    ("jobs/views.py:9", "all_tenants"),
    ("jobs/views.py:10", "connection.cursor"),
    ("jobs/views.py:12", ".raw()"),
    ("jobs/views.py:13", ".extra()"),
    ("jobs/views.py:14", "connection.cursor"),
    ("jobs/views.py:15", "RawSQL"),
    ("jobs/views.py:23", "all_tenants"),
]


def _tree(tmp_path: Path, allowlist: str) -> Path:
    (tmp_path / "jobs").mkdir()
    (tmp_path / "jobs" / "views.py").write_text(VIOLATIONS)
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "test_views.py").write_text("Workload.all_tenants.all()\n")  # tests are not checked
    (tmp_path / "allow.toml").write_text(textwrap.dedent(allowlist))
    return tmp_path


def _run(root: Path, capsys: pytest.CaptureFixture[str]) -> tuple[int, list[str]]:
    status = check_scoping.main(["--root", str(root), "--allowlist", str(root / "allow.toml")])
    return status, capsys.readouterr().out.splitlines()


def test_every_bypass_outside_the_allowlist_is_named_by_file_and_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    status, lines = _run(_tree(tmp_path, ""), capsys)
    assert status == 1
    assert [(line.split(": ")[0], line.split(": ")[1].split(" outside")[0]) for line in lines] == ALL_REPORTED


def test_an_entry_allows_its_function_and_kind_only_and_an_unused_entry_fails(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    allowlist = """
        [[allow]]
        path = "jobs/views.py:sweep"
        uses = ["all_tenants"]
        reason = "controller sweep"

        [[allow]]
        path = "jobs/"
        uses = ["raw_sql"]
        reason = "fast path"

        [[allow]]
        path = "inventory/"
        uses = ["all_tenants"]
        reason = "nothing there any more"
    """
    status, lines = _run(_tree(tmp_path, allowlist), capsys)
    assert status == 1
    assert [line.split(": ")[0] for line in lines] == ["jobs/views.py:9", "allow.toml"], lines
    assert "'inventory/' allows all_tenants where there is none" in lines[1]


def test_an_entry_without_a_reason_is_refused(tmp_path: Path) -> None:
    root = _tree(tmp_path, '[[allow]]\npath = "jobs/"\nuses = ["all_tenants"]\nreason = " "\n')
    with pytest.raises(ValueError, match="reason"):
        check_scoping.load_allowlist(root / "allow.toml")


def test_the_console_keeps_to_its_allowlist() -> None:
    result = subprocess.run(
        [sys.executable, str(ROOT / "tools" / "check_scoping.py")], capture_output=True, text=True, check=False
    )
    assert result.returncode == 0, result.stdout
