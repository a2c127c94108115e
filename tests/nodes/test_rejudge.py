"""A changed machine is judged again (issue 20): a host-key change and its approval, a
repin, or an absence longer than NODES_REJUDGE_AFTER_ABSENCE_MINUTES puts the node's gate
back to unchecked, off placements until a new preflight passes, which the platform queues
itself; a new node takes placements only once its verdict is in. Against emulated nodes
(the lab's version is tests/nodes/test_lab_rejudge.py)."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.db.models import F
from django.utils import timezone

from nodes import services as node_services
from nodes import ssh
from nodes.models import GateStatus, Gpu, Node, NodePolicyChange
from nodes.services import registry, rejudge, sampling

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def queued(monkeypatch):
    """What the services queue (task name, args), recorded instead of sent: the test runs
    the discovery a worker would."""
    sent: list[tuple[str, tuple]] = []

    def record(name, *args, countdown=None):
        sent.append((name, args))

    for module in (registry, rejudge, sampling):
        monkeypatch.setattr(module, "enqueue", record)
    return sent


def placeable(node: Node) -> bool:
    return Gpu.objects.taking_placements().filter(node=node).exists()


def gate_events(node: Node) -> list[tuple]:
    return list(
        NodePolicyChange.objects.filter(node=node, field=rejudge.GATE_RESET_FIELD)
        .order_by("pk")
        .values_list("old_value", "new_value", "reason")
    )


def forget(node: Node) -> None:
    """The node's row gone (its GPUs with it): the machine is a new node to the platform."""
    Node.objects.filter(pk=node.pk).delete()


def go_unreachable(emu, node: Node, settings) -> None:
    emu.set_down(True)
    ssh.reset_pool()
    for _ in range(settings.NODES_UNREACHABLE_AFTER):
        ssh.get_pool()._backoff.clear()  # each beat would find it after its backoff
        node_services.nodes_sample(node_ids=[node.pk])
    node.refresh_from_db()
    assert node.status == Node.Status.UNREACHABLE


def back_after(emu, node: Node, minutes: int) -> dict[str, int]:
    """The node answers again, `minutes` after it last did."""
    Node.objects.filter(pk=node.pk).update(
        last_seen_at=F("last_seen_at") - timedelta(minutes=minutes)
    )
    emu.set_down(False)
    ssh.get_pool()._backoff.clear()
    return node_services.nodes_sample(node_ids=[node.pk])


# --- a host-key change, then its approval ------------------------------------------------------


def test_a_host_key_change_then_approval_takes_no_placement_until_the_new_preflight_passes(
    worker_fleet, ops_user, queued, client
):
    fleet = worker_fleet()
    emu, node = fleet.nodes[0], fleet.registered[0]
    assert node.gate_status == GateStatus.PASSED and placeable(node)
    emu.rotate_host_key()  # a reinstall, or an impostor at the same address
    ssh.reset_pool()  # a fresh connection must handshake again
    node_services.nodes_sample(node_ids=[node.pk])
    node.refresh_from_db()
    assert node.status == Node.Status.UNREACHABLE and "host key changed" in node.status_reason
    node_services.node_scan_host_key(node_id=node.pk)
    node.refresh_from_db()
    queued.clear()

    node = node_services.node_approve_host_key(
        node=node, fingerprint=emu.host_key_fingerprint(), actor=ops_user
    )
    node.refresh_from_db()
    assert node.status == Node.Status.ACTIVE  # it answers, but is not sold on the old verdict
    assert node.gate_status == GateStatus.UNCHECKED
    assert "host key changed" in node.gate_reason
    assert not placeable(node)
    assert node_services.allocation_reserve(owner_key="slice-1", vram_mb=4096) is None
    [change] = NodePolicyChange.objects.filter(node=node, field="gate_status")
    assert (change.old_value, change.new_value, change.reason) == (
        "passed",
        "unchecked",
        "host key changed",
    )
    assert change.changed_by == ops_user
    # the platform queued the new judgement itself: a discovery, which runs the preflight
    assert queued == [("telemetry.discover_node", (node.pk,))]
    client.force_login(ops_user)
    page = client.get(f"/ops/nodes/{node.pk}/").content.decode()
    assert "judged again before it takes slices: host key changed" in page
    history = client.get("/ops/fleet/node-policy/").content.decode()
    assert "gate_status" in history and "host key changed" in history

    node = node_services.node_discover(node_id=node.pk)
    assert node.gate_status == GateStatus.PASSED, node.gate_reason
    assert node_services.allocation_reserve(owner_key="slice-1", vram_mb=4096) is not None


def test_a_first_approval_is_no_change_and_records_none(worker_fleet, queued):
    fleet = worker_fleet()
    emu = fleet.nodes[0]
    forget(fleet.registered[0])
    node = node_services.node_register(name=emu.name, address="127.0.0.1", port=emu.port)
    node_services.node_scan_host_key(node_id=node.pk)
    node.refresh_from_db()
    node_services.node_approve_host_key(node=node, fingerprint=emu.host_key_fingerprint())
    assert gate_events(node) == []
    assert ("telemetry.discover_node", (node.pk,)) in queued


def test_a_verdict_reached_while_the_key_changed_is_not_stored(worker_fleet, monkeypatch):
    fleet = worker_fleet()
    node = fleet.registered[0]
    original = node_services.gate.image_inspect

    def key_changes_meanwhile(**kwargs):
        # ops approve another key (and reset the gate) while this preflight probes
        Node.objects.filter(pk=node.pk).update(
            host_key="ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIOtherMachineOtherMachineOtherMachine12",
            gate_status=GateStatus.UNCHECKED,
        )
        return original(**kwargs)

    monkeypatch.setattr(node_services.gate, "image_inspect", key_changes_meanwhile)
    node_services.node_discover(node_id=node.pk)
    node.refresh_from_db()
    assert node.gate_status == GateStatus.UNCHECKED  # the old machine's verdict is dropped


# --- a repin -------------------------------------------------------------------------------------


def test_a_repinned_node_is_judged_again_before_it_takes_slices(worker_fleet, api_ops, queued):
    fleet = worker_fleet()
    emu, node = fleet.nodes[0], fleet.registered[0]
    assert placeable(node)
    new_line = emu.rotate_host_key()
    ssh.reset_pool()
    queued.clear()
    response = api_ops.patch(f"/api/v1/nodes/{node.pk}/", {"host_key": new_line}, format="json")
    assert response.status_code == 200, response.content
    assert response.json()["gate_status"] == "unchecked"
    node.refresh_from_db()
    assert not placeable(node)
    assert gate_events(node) == [("passed", "unchecked", "repinned")]
    assert NodePolicyChange.objects.get(node=node, field="gate_status").changed_by.is_staff
    assert queued == [("telemetry.discover_node", (node.pk,))]
    node = node_services.node_discover(node_id=node.pk)
    assert node.gate_status == GateStatus.PASSED and placeable(node)
    # the same key pinned again changes nothing
    again = api_ops.patch(f"/api/v1/nodes/{node.pk}/", {"host_key": new_line}, format="json")
    assert again.status_code == 200 and again.json()["gate_status"] == "passed"
    assert len(gate_events(node)) == 1


def test_a_node_moved_to_another_address_loses_its_verdict(worker_fleet, queued):
    fleet = worker_fleet()
    node = fleet.registered[0]
    node = node_services.node_update(node=node, address="10.20.0.7")
    assert node.status == Node.Status.PENDING and node.gate_status == GateStatus.UNCHECKED
    assert gate_events(node) == [("passed", "unchecked", "address changed")]
    assert ("telemetry.scan_host_key", (node.pk,)) in queued


# --- an absence ---------------------------------------------------------------------------------


def test_a_node_unreachable_longer_than_the_setting_is_judged_again_when_it_answers(
    worker_fleet, settings, queued
):
    settings.NODES_REJUDGE_AFTER_ABSENCE_MINUTES = 10
    fleet = worker_fleet()
    emu, node = fleet.nodes[0], fleet.registered[0]
    go_unreachable(emu, node, settings)
    queued.clear()
    assert back_after(emu, node, minutes=25)["sampled"] == 1
    node.refresh_from_db()
    assert node.status == Node.Status.ACTIVE and node.gate_status == GateStatus.UNCHECKED
    assert not placeable(node)
    [(before, after, reason)] = gate_events(node)
    assert (before, after) == ("passed", "unchecked")
    assert reason == "unreachable for 25 minutes"
    assert NodePolicyChange.objects.get(node=node, field="gate_status").changed_by is None
    assert queued == [("telemetry.discover_node", (node.pk,))]
    node = node_services.node_discover(node_id=node.pk)
    assert node.gate_status == GateStatus.PASSED and placeable(node)


def test_a_shorter_absence_keeps_the_verdict(worker_fleet, settings, queued):
    settings.NODES_REJUDGE_AFTER_ABSENCE_MINUTES = 10
    fleet = worker_fleet()
    emu, node = fleet.nodes[0], fleet.registered[0]
    go_unreachable(emu, node, settings)
    queued.clear()
    assert back_after(emu, node, minutes=5)["sampled"] == 1
    node.refresh_from_db()
    assert node.status == Node.Status.ACTIVE and node.gate_status == GateStatus.PASSED
    assert placeable(node) and gate_events(node) == [] and queued == []


def test_a_long_absent_node_found_again_by_discovery_is_judged_before_it_is_sold(
    worker_fleet, settings, monkeypatch
):
    settings.NODES_REJUDGE_AFTER_ABSENCE_MINUTES = 10
    fleet = worker_fleet()
    emu, node = fleet.nodes[0], fleet.registered[0]
    go_unreachable(emu, node, settings)
    Node.objects.filter(pk=node.pk).update(last_seen_at=timezone.now() - timedelta(hours=3))
    emu.set_down(False)
    ssh.get_pool()._backoff.clear()
    seen = []
    original = registry.node_preflight

    def judged(**kwargs):
        seen.append((Node.objects.get(pk=node.pk).gate_status, placeable(node)))
        return original(**kwargs)

    monkeypatch.setattr(registry, "node_preflight", judged)
    node = node_services.node_discover(node_id=node.pk)
    assert seen == [(GateStatus.UNCHECKED, False)]  # not sold while the probes ran
    assert node.gate_status == GateStatus.PASSED
    assert gate_events(node) == [("passed", "unchecked", "unreachable for 180 minutes")]


def test_the_absence_rule_reads_the_setting(settings) -> None:
    now = timezone.now()
    node = Node(status=Node.Status.UNREACHABLE, last_seen_at=now - timedelta(minutes=11))
    settings.NODES_REJUDGE_AFTER_ABSENCE_MINUTES = 10
    assert node.absence_reason(now) == "unreachable for 11 minutes"
    settings.NODES_REJUDGE_AFTER_ABSENCE_MINUTES = 15
    assert node.absence_reason(now) == ""
    node.status = Node.Status.ACTIVE  # not seen for a while, but never found unreachable
    settings.NODES_REJUDGE_AFTER_ABSENCE_MINUTES = 10
    assert node.absence_reason(now) == ""


# --- discovery of a new node ---------------------------------------------------------------------


def test_a_new_node_takes_placements_only_after_its_verdict(worker_fleet, monkeypatch):
    fleet = worker_fleet()
    emu = fleet.nodes[0]
    forget(fleet.registered[0])
    node = node_services.node_register(
        name=emu.name, address="127.0.0.1", port=emu.port, host_key=emu.host_key_line()
    )
    seen = []
    original = registry.node_preflight

    def judged(**kwargs):
        row = Node.objects.get(pk=node.pk)
        reserved = node_services.allocation_reserve(owner_key="early", vram_mb=4096)
        seen.append((row.gate_status, placeable(row), reserved))
        return original(**kwargs)

    monkeypatch.setattr(registry, "node_preflight", judged)
    node = node_services.node_discover(node_id=node.pk)
    assert seen == [(GateStatus.UNCHECKED, False, None)]
    assert node.gate_status == GateStatus.PASSED and placeable(node)
