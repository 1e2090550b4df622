"""The agent gateway: join tokens, node credentials, and messages bound to the node that sends them.

A second node's agent is the hostile neighbour here: it forges reports on
the first node's replicas, GPUs and commands, and every one is refused with
nothing applied. Revocation and retirement cut an agent off at its next
request.
"""

from __future__ import annotations

import threading
import time
from datetime import timedelta
from typing import Any

import pytest
from django.utils import timezone
from rest_framework.test import APIClient

from inventory.choices import NodeState
from inventory.models import Gpu, Node, NodeCredential, NodeEvent, NodeJoinToken
from inventory.services import agents
from inventory.services.provisioning import dispatch_probe
from jobs.models import Replica
from jobs.services import agent_gateway
from tests.conftest import World, actor, client_for
from tests.inventory.factories import make_node
from tests.jobs.factories import add_replica
from tests.workers import running_worker, wait_until

pytestmark = pytest.mark.django_db


def _docker_node(world: World, name: str, *, state: NodeState = NodeState.REGISTERED, gpus: int = 0) -> Node:
    node = make_node(actor(world.operator), world.pool, name=name, state=state, runtime="docker")
    for index in range(gpus):
        Gpu.objects.create(node=node, index=index, uuid=f"GPU-{name}-{index}", model="NVIDIA H100 80GB HBM3")
    return node


def _join(world: World, node: Node, *, host: str = "host-1") -> str:
    """Issue a join token as the operator and redeem it; return the node credential."""
    issued = client_for(world.operator).post(f"/api/v1/nodes/{node.name}/join-token/", {}, format="json")
    assert issued.status_code == 201, issued.content
    joined = APIClient().post("/api/v1/agent/join", {"token": issued.json()["token"], "hostname": host}, format="json")
    assert joined.status_code == 201, joined.content
    return str(joined.json()["credential"])


def _agent(credential: str) -> APIClient:
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Node {credential}")
    return client


def _replica(world: World, node: Node) -> Replica:
    return add_replica(world, node, name=f"on-{node.name}")


def _started(replica: Replica) -> dict[str, Any]:
    kwargs = {"workload_id": replica.workload_id, "attempt": 1, "replica": 0, "handle": {"id": "forged"}}
    return {"kind": "task", "task": "jobs.replica_started", "kwargs": kwargs}


NOT_A_FIELD = "is not a field of this message"


def _reading(uuid: str) -> dict[str, Any]:
    return {"uuid": uuid, "index": 0, "timestamp": 1_700_000_000.0}


def test_a_join_token_is_shown_once_works_once_and_names_one_node(world: World) -> None:
    node = _docker_node(world, "gpu-a")
    issued = client_for(world.operator).post(f"/api/v1/nodes/{node.name}/join-token/", {}, format="json")
    assert issued.status_code == 201
    body = issued.json()
    assert body["command"] == f"gpucloud agent join http://testserver {body['token']}"
    stored = NodeJoinToken.objects.get(node=node)
    assert body["token"] not in (stored.digest, stored.prefix)  # only a digest is kept

    first = APIClient().post("/api/v1/agent/join", {"token": body["token"], "hostname": "h1"}, format="json")
    assert first.status_code == 201
    assert first.json()["node"] == "gpu-a"
    again = APIClient().post("/api/v1/agent/join", {"token": body["token"], "hostname": "h2"}, format="json")
    assert again.status_code == 403
    assert "already used" in again.json()["error"]["message"]
    # Joining starts provisioning; the credential is the node's only live one.
    assert Node.objects.get(pk=node.pk).state == NodeState.PROVISIONING
    assert NodeCredential.objects.filter(node=node, revoked_at__isnull=True).count() == 1
    assert NodeEvent.objects.filter(node=node, kind="agent.joined").exists()


def test_expired_unknown_and_voided_join_tokens_are_refused(world: World) -> None:
    node = _docker_node(world, "gpu-a")
    old = agents.issue_join_token(actor=actor(world.operator), node=node)
    new = agents.issue_join_token(actor=actor(world.operator), node=node)
    assert APIClient().post("/api/v1/agent/join", {"token": old.secret}, format="json").status_code == 403
    NodeJoinToken.objects.filter(pk=new.row.pk).update(expires_at=timezone.now() - timedelta(seconds=1))
    expired = APIClient().post("/api/v1/agent/join", {"token": new.secret}, format="json")
    assert expired.status_code == 403 and "expired" in expired.json()["error"]["message"]
    forged = new.secret[:-4] + "AAAA"
    assert APIClient().post("/api/v1/agent/join", {"token": forged}, format="json").status_code == 403
    assert APIClient().post("/api/v1/agent/join", {"token": "nonsense"}, format="json").status_code == 403
    assert not NodeCredential.objects.exists()


def test_only_operators_issue_join_tokens_and_not_for_retired_or_simulated_nodes(world: World) -> None:
    node = _docker_node(world, "gpu-a")

    def issue(user: Any, name: str, body: dict[str, Any] | None = None) -> Any:
        return client_for(user).post(f"/api/v1/nodes/{name}/join-token/", body or {}, format="json")

    assert issue(world.admin_a, node.name).status_code in (403, 404)
    simulated = make_node(actor(world.operator), world.pool, name="sim")
    assert issue(world.operator, simulated.name).status_code == 409
    retired = _docker_node(world, "old", state=NodeState.RETIRED)
    assert issue(world.operator, retired.name).status_code == 409
    bad = issue(world.operator, node.name, {"expires_in": 5})
    assert bad.status_code == 400 and "expires_in" in bad.json()["error"]["fields"]


def test_credentials_open_the_gateway_only_and_user_credentials_do_not_open_it(world: World) -> None:
    node = _docker_node(world, "gpu-a")
    credential = _join(world, node)
    # A node credential is no user: no tenant or operator endpoint answers it.
    assert _agent(credential).get("/api/v1/nodes/").status_code == 401
    assert _agent(credential).get(f"/api/v1/tenants/{world.tenant_a.slug}/workloads/").status_code == 401
    # And no user, not even an operator, speaks for a node.
    assert client_for(world.operator).post("/api/v1/agent/reports", {"messages": []}, format="json").status_code in (
        401,
        403,
    )
    assert APIClient().get("/api/v1/agent/commands").status_code == 401
    assert _agent(credential).post("/api/v1/agent/reports", {"messages": []}, format="json").json() == {"accepted": 0}


def test_a_node_cannot_report_on_another_nodes_replicas_gpus_or_name(world: World) -> None:
    victim = _docker_node(world, "victim", state=NodeState.READY, gpus=1)
    attacker = _docker_node(world, "attacker", state=NodeState.READY, gpus=1)
    _join(world, victim, host="victim-host")
    forged_by = _agent(_join(world, attacker, host="attacker-host"))
    theirs = _replica(world, victim)
    exited = {
        "kind": "task",
        "task": "jobs.replica_exited",
        "kwargs": {"workload_id": theirs.workload_id, "attempt": 1, "replica": 0, "exit_code": 1},
    }
    logs = {
        "kind": "task",
        "task": "jobs.ingest_log_batches",
        "kwargs": {
            "batches": [
                {"workload_id": theirs.workload_id, "attempt": 1, "replica": 0, "since": "", "cursor": "c", "lines": []}
            ]
        },
    }
    forgeries = [
        _started(theirs),
        exited,
        logs,
        {"kind": "task", "task": "jobs.node_replicas", "kwargs": {"node": "victim", "managed": []}},
        {"kind": "heartbeat", "report": {"node": "victim", "samples": []}},
        {"kind": "heartbeat", "report": {"node": "attacker", "samples": [_reading("GPU-victim-0")]}},
        {"kind": "samples", "samples": [{**_reading("GPU-victim-0"), "utilization_gpu": 100}]},
    ]
    for index, forged in enumerate(forgeries):
        answer = forged_by.post("/api/v1/agent/reports", {"messages": [forged]}, format="json")
        assert answer.status_code == 403, (index, answer.content)
        assert answer.json()["error"]["rejected"][0]["index"] == 0
    # One forged message spoils its whole batch: the honest one beside it is not delivered either.
    mine = _replica(world, attacker)
    mixed = forged_by.post("/api/v1/agent/reports", {"messages": [_started(mine), _started(theirs)]}, format="json")
    assert mixed.status_code == 403
    assert [r["index"] for r in mixed.json()["error"]["rejected"]] == [1]
    theirs.refresh_from_db()
    assert theirs.handle == {} and theirs.state == "launching"
    assert agent_gateway.check_messages(attacker, [_started(mine)]) == []


def test_a_report_that_does_not_fit_its_protocol_message_spoils_its_batch_with_each_field_named(world: World) -> None:
    node = _docker_node(world, "gpu-a", state=NodeState.READY, gpus=1)
    agent = _agent(_join(world, node))
    mine = _replica(world, node)
    malformed = [
        ({"kind": "task", "task": "inventory.complete_provisioning", "kwargs": {}}, None),
        (
            {"kind": "task", "task": "jobs.replica_started", "kwargs": {"workload_id": "1", "attempt": 1}},
            {
                "workload_id": "must be an integer in 0..9223372036854775807",
                "replica": "is missing",
                "handle": "is missing",
            },
        ),
        (
            {**_started(mine), "kwargs": {**_started(mine)["kwargs"], "replica": -1, "endpoint": 7, "pid": 1}},
            {
                "replica": "must be an integer in 0..4095",
                "endpoint": "must be a string",
                "pid": "is not a field of this message",
            },
        ),
        ({**_started(mine), "version": 99}, {"version": "99 is not 1, the version this side reads"}),
        (
            {"kind": "heartbeat", "report": {"node": "gpu-a", "samples": [{"uuid": "GPU-x", "index": -1}]}},
            {"samples[0].index": "must be an integer in 0..1023", "samples[0].timestamp": "is missing"},
        ),
        (
            {"kind": "samples", "samples": [{**_reading("GPU-x"), "utilization_gpu": "full", "xid_events": [79.5]}]},
            {
                "samples[0].utilization_gpu": "must be a number",
                "samples[0].xid_events[0]": "must be an integer in 0..9223372036854775807",
            },
        ),
        (
            {"kind": "heartbeat", "report": {"history": {"GPU-x": [[1.0, "busy"]]}}},
            {"history['GPU-x'][0][1]": "must be a number"},
        ),
    ]
    for forged, fields in malformed:
        answer = agent.post("/api/v1/agent/reports", {"messages": [_started(mine), forged]}, format="json")
        assert answer.status_code == 400, answer.content
        (rejected,) = answer.json()["error"]["rejected"]
        assert rejected["index"] == 1 and rejected.get("fields") == fields
    mine.refresh_from_db()
    assert mine.handle == {} and mine.state == "launching", "the well-formed report beside it was not taken either"
    assert agent_gateway.check_messages(node, [{**_started(mine), "version": 1}]) == []


def test_a_heartbeat_or_samples_of_an_older_version_are_refused_as_nodes_md_says(world: World) -> None:
    # Heartbeat and LiveSamples v1 named GPU memory `_mb`; v2 names it `_mib`. The console reads only the
    # version it writes (docs/nodes.md: a console and its agents are upgraded together), so an agent not yet
    # upgraded has its batch refused whole, with the version named, and nothing of it is delivered.
    node = _docker_node(world, "gpu-a", state=NodeState.READY, gpus=1)
    agent = _agent(_join(world, node))
    mine = _replica(world, node)
    old = {**_reading("GPU-gpu-a-0"), "memory_used_mb": 1024, "memory_total_mb": 81559}
    old_heartbeat = {"kind": "heartbeat", "report": {"node": "gpu-a", "samples": [old]}}
    old_samples = {"kind": "samples", "samples": [old]}
    refused = [
        ({**old_heartbeat, "version": 1}, {"version": "1 is not 2, the version this side reads"}),
        ({**old_samples, "version": 1}, {"version": "1 is not 2, the version this side reads"}),
        (old_heartbeat, {"samples[0].memory_used_mb": NOT_A_FIELD, "samples[0].memory_total_mb": NOT_A_FIELD}),
    ]
    for message, fields in refused:
        answer = agent.post("/api/v1/agent/reports", {"messages": [_started(mine), message]}, format="json")
        assert answer.status_code == 400, answer.content
        (rejected,) = answer.json()["error"]["rejected"]
        assert rejected["index"] == 1 and rejected.get("fields") == fields
    mine.refresh_from_db()
    assert mine.handle == {} and mine.state == "launching", "the report beside it was not delivered either"
    new = {**_reading("GPU-gpu-a-0"), "memory_used_mib": 1024, "memory_total_mib": 81559}
    upgraded = [
        {"kind": "heartbeat", "version": 2, "report": {"node": "gpu-a", "samples": [new]}},
        {"kind": "samples", "version": 2, "samples": [new]},
    ]
    assert agent_gateway.check_messages(node, upgraded) == []


def test_a_result_for_a_command_sent_to_another_node_is_refused(world: World) -> None:
    victim = _docker_node(world, "victim")
    attacker = _docker_node(world, "attacker")
    _join(world, victim)
    forged_by = _agent(_join(world, attacker))
    agent_gateway._command(victim, {"task": "agent.probe_node", "id": "cmd-1"}, [[{}], {}, {"callbacks": [{}]}])
    answer = forged_by.post(
        "/api/v1/agent/reports", {"messages": [{"kind": "result", "id": "cmd-1", "result": {}}]}, format="json"
    )
    assert answer.status_code == 403


def test_revoking_or_retiring_cuts_the_agent_off_at_its_next_request(
    world: World, django_capture_on_commit_callbacks: Any
) -> None:
    node = _docker_node(world, "gpu-a", state=NodeState.MAINTENANCE)
    credential = _join(world, node)
    assert _agent(credential).post("/api/v1/agent/reports", {"messages": []}, format="json").status_code == 200
    with django_capture_on_commit_callbacks(execute=True):
        revoked = client_for(world.operator).post(
            f"/api/v1/nodes/{node.name}/revoke-agent/", {"reason": "stolen disk"}, format="json"
        )
    assert revoked.status_code == 200
    refused = _agent(credential).post("/api/v1/agent/reports", {"messages": []}, format="json")
    assert refused.status_code == 401 and "revoked" in refused.json()["error"]["message"]
    assert _agent(credential).get("/api/v1/agent/commands").status_code == 401
    assert agents.is_cut_off(NodeCredential.objects.get(node=node))

    # A new join works again; retiring the node ends that credential too.
    credential = _join(world, node, host="host-2")
    assert _agent(credential).post("/api/v1/agent/reports", {"messages": []}, format="json").status_code == 200
    retired = client_for(world.operator).post(f"/api/v1/nodes/{node.name}/retire/", {"reason": "gone"}, format="json")
    assert retired.status_code == 200
    assert _agent(credential).post("/api/v1/agent/reports", {"messages": []}, format="json").status_code == 401
    assert NodeCredential.objects.filter(node=node, revoked_at__isnull=True).count() == 0


def test_a_rejoin_replaces_the_old_hosts_credential(world: World) -> None:
    node = _docker_node(world, "gpu-a")
    first = _join(world, node, host="old-host")
    second = _join(world, node, host="new-host")
    assert _agent(first).post("/api/v1/agent/reports", {"messages": []}, format="json").status_code == 401
    assert _agent(second).post("/api/v1/agent/reports", {"messages": []}, format="json").status_code == 200


def test_malformed_batches_name_what_is_wrong(world: World) -> None:
    node = _docker_node(world, "gpu-a")
    agent = _agent(_join(world, node))
    assert agent.post("/api/v1/agent/reports", {"nothing": 1}, format="json").status_code == 400
    answer = agent.post(
        "/api/v1/agent/reports",
        {"messages": [{"kind": "nope"}, {"kind": "task", "task": "jobs.reconcile", "kwargs": {"x": 1}}, 7]},
        format="json",
    )
    assert answer.status_code == 400
    rejected = answer.json()["error"]["rejected"]
    assert len(rejected) == 3 and "kind must be" in rejected[0]["reason"]
    assert rejected[1]["fields"] == {"x": "is not a field of this message"}
    for wait in ("nan", "inf", "soon"):
        assert agent.get(f"/api/v1/agent/commands?wait={wait}").status_code == 400, wait


def test_join_token_secrets_never_reach_the_database_or_the_log_in_clear(world: World, caplog: Any) -> None:
    node = _docker_node(world, "gpu-a")
    credential = _join(world, node)
    row = NodeCredential.objects.get(node=node, revoked_at__isnull=True)
    assert credential.split("_", 2)[2] not in row.digest
    assert credential not in caplog.text


@pytest.mark.django_db(transaction=True)
def test_commands_reach_only_their_node_and_a_probe_result_completes_provisioning(world: World) -> None:
    node = _docker_node(world, "gpu-a")
    other = _docker_node(world, "gpu-b")
    agent, neighbour = _agent(_join(world, node)), _agent(_join(world, other))
    node.refresh_from_db()
    assert node.state == NodeState.PROVISIONING
    with running_worker(["control"]):
        assert dispatch_probe(node.pk, node.provisioning_attempt)
        assert neighbour.get("/api/v1/agent/commands?wait=0.5").json() == {"commands": []}
        commands = agent.get("/api/v1/agent/commands?wait=5").json()["commands"]
        assert [c["task"] for c in commands] == ["agent.probe_node"]
        assert commands[0]["args"][0]["node"] == "gpu-a"
        # Not acknowledged: the answer never arrived (a cut connection), so the next poll gets it again.
        assert agent.get("/api/v1/agent/commands?wait=0").json()["commands"] == commands
        assert agent.get(f"/api/v1/agent/commands?wait=0&ack={commands[0]['id']}").json() == {"commands": []}
        # The neighbour cannot answer it; the node itself can, and provisioning completes with its report.
        result = {"kind": "result", "id": commands[0]["id"], "result": {"error": {"step": "probe", "message": "x"}}}
        assert neighbour.post("/api/v1/agent/reports", {"messages": [result]}, format="json").status_code == 403
        assert agent.post("/api/v1/agent/reports", {"messages": [result]}, format="json").status_code == 200
        assert wait_until(lambda: Node.objects.get(pk=node.pk).state == NodeState.FAILED)
    assert "probe: x" in Node.objects.get(pk=node.pk).state_reason


@pytest.mark.django_db(transaction=True)
def test_a_waiting_command_poll_ends_when_the_credential_is_revoked(world: World) -> None:
    node = _docker_node(world, "gpu-a", state=NodeState.MAINTENANCE)
    agent = _agent(_join(world, node))
    answers: list[Any] = []
    poll = threading.Thread(target=lambda: answers.append(agent.get("/api/v1/agent/commands?wait=20")))
    started = time.monotonic()
    poll.start()
    time.sleep(0.5)
    agents.revoke_node_credentials(actor=actor(world.operator), node=node, reason="test")
    poll.join(timeout=10)
    assert not poll.is_alive() and time.monotonic() - started < 5
    assert answers[0].json() == {"commands": []}
    assert agent.get("/api/v1/agent/commands?wait=0").status_code == 401
