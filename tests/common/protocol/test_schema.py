"""Each message's shape is pinned per version: changing a message without raising its VERSION fails here.

Regenerate the snapshot after raising a VERSION: `.venv/bin/python -m common.protocol.schema --write`.
"""

from __future__ import annotations

import dataclasses
import json
from typing import ClassVar

import pytest

from common.protocol import schema
from common.protocol.messages import ReplicaReady
from common.protocol.wire import Message


def test_every_message_has_the_shape_its_version_pins() -> None:
    pinned = schema.load_snapshot()
    for task, versions in schema.shapes().items():
        for version, shape in versions.items():
            assert version in pinned.get(task, {}), f"{task} v{version} is not in schema.json: run the --write command"
            assert pinned[task][version] == json.loads(json.dumps(shape)), (
                f"{task} changed shape without a new VERSION: raise it, then run the --write command"
            )


def test_a_changed_message_under_the_same_version_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    @dataclasses.dataclass(frozen=True)
    class Changed(Message):
        TASK: ClassVar[str] = ReplicaReady.TASK
        VERSION: ClassVar[int] = ReplicaReady.VERSION

        workload_id: int
        attempt: int
        replica: int
        extra: str = ""

    @dataclasses.dataclass(frozen=True)
    class Bumped(Changed):
        VERSION: ClassVar[int] = ReplicaReady.VERSION + 1

    pinned = schema.load_snapshot()
    monkeypatch.setattr(schema, "ALL", {**schema.ALL, ReplicaReady.TASK: Changed})
    assert schema.changed_without_version(pinned) == [ReplicaReady.TASK]
    assert schema.main(["--write"]) == 1, "the snapshot refuses a new shape under a pinned version"
    monkeypatch.setattr(schema, "ALL", {**schema.ALL, ReplicaReady.TASK: Bumped})
    assert schema.changed_without_version(pinned) == []
    versions = schema.merged(pinned)[ReplicaReady.TASK]
    assert set(versions) == {str(ReplicaReady.VERSION), str(Bumped.VERSION)}
    assert versions[str(ReplicaReady.VERSION)] == pinned[ReplicaReady.TASK][str(ReplicaReady.VERSION)]
