"""Each message's shape is pinned per version: changing a message without raising its VERSION fails here.

Regenerate the snapshot after raising a VERSION: `.venv/bin/python -m common.protocol.schema --write`.
"""

from __future__ import annotations

import dataclasses
import json
from typing import ClassVar

import pytest

from common.protocol import schema
from common.protocol.messages import Heartbeat, LiveSamples, ReplicaReady
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


def test_a_field_renamed_inside_a_nested_record_is_caught_too() -> None:
    # GpuReading is no message of its own: a change to it changes every message holding it, and each of
    # those needs a new VERSION. Pin the current shape under a stale name and the snapshot no longer matches.
    pinned = schema.load_snapshot()
    for kind in (Heartbeat, LiveSamples):
        stale = json.loads(json.dumps(pinned))
        reading = stale[kind.TASK][str(kind.VERSION)]["samples"]["fields"]
        reading["memory_used_mb"] = reading.pop("memory_used_mib")
        assert schema.changed_without_version(stale) == [kind.TASK]


def test_the_telemetry_messages_pin_their_memory_fields_in_mib_and_keep_version_1_in_mb() -> None:
    pinned = schema.load_snapshot()
    for kind in (Heartbeat, LiveSamples):
        versions = pinned[kind.TASK]
        assert {"1", "2"} <= versions.keys()
        old, new = (versions[v]["samples"]["fields"] for v in ("1", "2"))
        assert {"memory_used_mb", "memory_total_mb"} <= old.keys() and not {"memory_used_mib"} & old.keys()
        assert {"memory_used_mib", "memory_total_mib"} <= new.keys() and not {"memory_used_mb"} & new.keys()
        assert new["processes"]["fields"].keys() == {"pid", "used_memory_mib"}
