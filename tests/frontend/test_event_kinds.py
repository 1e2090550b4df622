"""Every kind of workload event the code writes has a label for people; the timeline shows it, the kind in its title."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from jobs.choices import WorkloadEventKind, event_kind_label
from jobs.models import WorkloadEvent
from tests.conftest import World
from tests.frontend.test_pages import logged_in
from tests.frontend.test_workload_pages import _submit, detail
from tests.jobs.factories import ready_world

ROOT = Path(__file__).resolve().parents[2]
APPS = ("jobs", "inventory", "tenants", "frontend", "gpucloud", "common")


def _written_kinds() -> set[str]:
    """Return the event kinds the source writes: `kind="workload.…"` in any call, and the dotted strings handed
    to an `_event(...)` helper (the idle watcher writes its events through one)."""
    found: set[str] = set()
    for app in APPS:
        for path in (ROOT / app).rglob("*.py"):
            if "migrations" in path.parts:
                continue
            for node in ast.walk(ast.parse(path.read_text(), str(path))):
                if isinstance(node, ast.Call):
                    found |= _kinds_in(node)
    return found


def _kinds_in(call: ast.Call) -> set[str]:
    values = [k.value for k in call.keywords if k.arg == "kind"]
    if isinstance(call.func, ast.Name) and call.func.id == "_event":
        values += call.args
    strings = [v.value for v in values if isinstance(v, ast.Constant) and isinstance(v.value, str)]
    return {s for s in strings if s.startswith("workload.")}


def test_every_kind_the_code_writes_has_a_label() -> None:
    written = _written_kinds()
    # The scan finds the writers it is meant to: the state machine's, the pull reports', the idle watcher's.
    assert {"workload.state_changed", "workload.image_pulled", "workload.idle_warning"} <= written
    unlabelled = written - set(WorkloadEventKind.values)
    assert not unlabelled, f"give these event kinds a label in jobs.choices.WorkloadEventKind: {sorted(unlabelled)}"
    # The submission writes its events through the enum itself.
    assert WorkloadEventKind.SUBMITTED.value == "workload.submitted"


def test_every_label_reads_as_words_not_as_a_code() -> None:
    for kind in WorkloadEventKind:
        label = event_kind_label(kind.value)
        assert label != kind.value and "." not in label and "_" not in label and label[0].isupper()
    assert event_kind_label("workload.something_new") == "workload.something_new"


@pytest.mark.django_db
def test_the_timeline_shows_the_label_with_the_kind_in_its_title(world: World) -> None:
    team = ready_world(world)
    workload = _submit(team)
    for kind in (WorkloadEventKind.IMAGE_PULLED, WorkloadEventKind.CHECKPOINT):
        WorkloadEvent.all_tenants.create(tenant=team.tenant_a, workload=workload, kind=kind, message="m")
    page = logged_in("member_a").get(detail(workload)).content.decode()
    timeline = page.split('id="workload-timeline"')[1].split("</table>")[0]
    assert '<span class="event-kind" title="workload.image_pulled" data-event-kind="workload.image_pulled">' in timeline
    assert ">Image pulled</span>" in timeline and ">Checkpoint saved</span>" in timeline
    assert 'title="workload.submitted"' in timeline
    assert ">workload.image_pulled<" not in timeline
