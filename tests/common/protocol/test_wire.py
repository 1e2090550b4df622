"""The protocol's wire form: messages round-trip, and anything that does not fit is refused, every field named."""

from __future__ import annotations

from typing import Any

import pytest

from common.protocol import BY_TASK, ProtocolError
from common.protocol.messages import (
    LogBatch,
    LogBatches,
    MountSpec,
    ReplicaExited,
    ReplicaSpec,
    ReplicaStarted,
    RunAsSpec,
    StartReplica,
)


def _spec(**changes: Any) -> dict[str, Any]:
    spec = ReplicaSpec(
        node="n1",
        runtime="docker",
        name="gpucloud-7-r0-a1",
        workload_id=7,
        tenant="acme",
        attempt=1,
        replica=0,
        image="busybox",
        mounts=[MountSpec(source="/srv/a/home", target="/home/alice", uid=1001, subdirs=["x"])],
        run_as=RunAsSpec(uid=1001, gid=2001, groups=[2001]),
    ).to_wire()
    return {**spec, **changes}


def test_a_start_round_trips_with_its_nested_records() -> None:
    wire = StartReplica(spec=ReplicaSpec.from_wire(_spec())).to_wire()
    decoded = StartReplica.from_wire(wire)
    assert decoded.to_wire() == wire
    assert decoded.spec.mounts[0] == MountSpec(source="/srv/a/home", target="/home/alice", uid=1001, subdirs=["x"])
    assert decoded.spec.run_as == RunAsSpec(uid=1001, gid=2001, groups=[2001])


def test_a_starts_shm_size_round_trips_and_is_checked() -> None:
    wire = StartReplica(spec=ReplicaSpec.from_wire(_spec(memory_mib=4096, shm_mib=2048))).to_wire()
    assert wire["spec"]["shm_mib"] == 2048
    assert StartReplica.from_wire(wire, version=StartReplica.VERSION).spec.shm_mib == 2048
    assert StartReplica.from_wire({"spec": _spec()}).spec.shm_mib is None  # unset: the runtime's default
    for bad in (0, -1, "64", 1.5, True):
        with pytest.raises(ProtocolError) as raised:
            StartReplica.from_wire({"spec": _spec(shm_mib=bad)})
        assert set(raised.value.problems) == {"spec.shm_mib"}, bad


def test_every_bad_field_is_named_in_one_error() -> None:
    bad = _spec(attempt="1", replica=-1, runtime="kubernetes", service_port=70000, surprise=1)
    bad["mounts"] = [{"source": "/a", "target": 3}]
    with pytest.raises(ProtocolError) as raised:
        StartReplica.from_wire({"spec": bad})
    assert set(raised.value.problems) == {
        "spec.attempt",
        "spec.replica",
        "spec.runtime",
        "spec.service_port",
        "spec.surprise",
        "spec.mounts[0].target",
    }
    assert "agent.start_replica" in str(raised.value)


def test_missing_keys_are_refused_and_defaults_fill_the_optional_ones() -> None:
    with pytest.raises(ProtocolError) as raised:
        ReplicaExited.from_wire({"workload_id": 1, "attempt": 1})
    assert raised.value.problems == {"replica": "is missing", "exit_code": "is missing"}
    exited = ReplicaExited.from_wire({"workload_id": 1, "attempt": 1, "replica": 0, "exit_code": -9})
    assert (exited.message, exited.launch_failed, exited.log_cursor) == ("", False, None)


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("workload_id", True),  # a boolean is not an integer
        ("workload_id", 1.5),
        ("workload_id", None),
        ("handle", []),
        ("handle", {"a": object()}),
        ("endpoint", 5),
        ("endpoint", "x" * 300),
    ],
)
def test_types_and_ranges_of_a_report_are_checked(field: str, value: Any) -> None:
    wire = {"workload_id": 1, "attempt": 1, "replica": 0, "handle": {"id": "c"}, field: value}
    with pytest.raises(ProtocolError) as raised:
        ReplicaStarted.from_wire(wire)
    assert [path.split("[")[0] for path in raised.value.problems] == [field]


def test_a_version_this_side_does_not_read_is_refused() -> None:
    wire = {"workload_id": 1, "attempt": 1, "replica": 0, "handle": {}}
    assert ReplicaStarted.from_wire(wire, version=ReplicaStarted.VERSION).handle == {}
    with pytest.raises(ProtocolError) as raised:
        ReplicaStarted.from_wire(wire, version=ReplicaStarted.VERSION + 1)
    assert list(raised.value.problems) == ["version"]


def test_log_batches_check_each_line() -> None:
    batch = LogBatch(workload_id=1, attempt=1, replica=0, since="", cursor="c1", lines=[["t", "stdout", "hi"]])
    assert LogBatches.from_wire(LogBatches(batches=[batch]).to_wire()).batches == [batch]
    with pytest.raises(ProtocolError) as raised:
        LogBatches.from_wire({"batches": [{**batch.to_wire(), "lines": [["t", "stdout", 3]]}]})
    assert list(raised.value.problems) == ["batches[0].lines[0][2]"]


def test_task_names_are_unique() -> None:
    assert len(BY_TASK) == len({cls.__name__ for cls in BY_TASK.values()})
