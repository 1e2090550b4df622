"""Every Celery task name is written once: in `common.task_names`, or on its protocol message class.

The beat schedule and the routes name tasks that exist; every task the
project registers is named in one of those two places; and no module of the
project spells a task's name out again as a string.
"""

from __future__ import annotations

import ast
from pathlib import Path

from django.conf import settings

from common import task_names
from common.protocol.messages import BY_TASK
from gpucloud.celery import app

ROOT = Path(__file__).resolve().parents[2]
APPS = ("accounting", "common", "frontend", "gpucloud", "inventory", "jobs", "notifications", "tenants")
# Where a name may be written: its one definition.
DEFINITIONS = {ROOT / "common" / "task_names.py", ROOT / "common" / "protocol" / "messages.py"}
DECLARED = {value for name, value in vars(task_names).items() if name.isupper()} | set(BY_TASK)


def _registered() -> set[str]:
    """Return the names of the tasks the project's apps register (Celery's own, and tests' tasks, left out)."""
    app.loader.import_default_modules()
    return {name for name, task in app.tasks.items() if type(task).__module__.split(".")[0] in APPS}


def test_every_beat_entry_names_a_registered_task() -> None:
    registered = _registered()
    unknown = {entry: spec["task"] for entry, spec in settings.CELERY_BEAT_SCHEDULE.items()}
    assert {entry: task for entry, task in unknown.items() if task not in registered} == {}


def test_every_route_names_a_registered_task() -> None:
    assert set(settings.CELERY_TASK_ROUTES) - _registered() == set()


def test_every_registered_task_is_named_in_the_one_place() -> None:
    assert _registered() - DECLARED == set()


def test_every_declared_name_is_a_task_someone_runs() -> None:
    """A name in task_names that no task carries is a leftover (agent commands run on the agent, also here)."""
    assert DECLARED - _registered() == set()


def test_no_module_spells_a_task_name_out_again() -> None:
    repeated: list[str] = []
    for app_name in APPS:
        for path in sorted((ROOT / app_name).rglob("*.py")):
            if path in DEFINITIONS or "migrations" in path.parts:
                continue
            for node in ast.walk(ast.parse(path.read_text(), str(path))):
                if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value in DECLARED:
                    repeated.append(f"{path.relative_to(ROOT)}:{node.lineno}: {node.value}")
    assert repeated == []
