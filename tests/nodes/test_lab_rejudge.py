"""A changed machine is judged again, against the node lab (real sshd and Docker Engine):
a host-key change then its approval takes no placement until the new preflight passes."""

from __future__ import annotations

import pytest

from nodes import services as node_services
from nodes import ssh
from nodes.models import GateStatus, Node, NodePolicyChange
from nodes.services import registry, rejudge

pytestmark = [pytest.mark.lab, pytest.mark.django_db(transaction=True)]


def test_a_host_key_change_then_approval_takes_no_placement_until_the_new_preflight_passes(
    lab_fleet, ops_user, monkeypatch
):
    queued = []
    for module in (registry, rejudge):  # the test runs the discovery a worker would
        monkeypatch.setattr(module, "enqueue", lambda name, *args, **kw: queued.append(name))
    fleet = lab_fleet()
    lab, node = fleet.nodes[0], fleet.registered[0]
    assert node.gate_status == GateStatus.PASSED, node.gate_reason
    lab.rotate_host_key()
    node_services.nodes_sample(node_ids=[node.pk])
    node.refresh_from_db()
    assert node.status == Node.Status.UNREACHABLE and "host key changed" in node.status_reason
    node_services.node_scan_host_key(node_id=node.pk)
    node.refresh_from_db()
    assert node.pending_host_key
    queued.clear()  # what registration queued

    node_services.node_approve_host_key(
        node=node, fingerprint=ssh.fingerprint(lab.host_key_line()), actor=ops_user
    )
    node.refresh_from_db()
    assert node.status == Node.Status.ACTIVE and node.gate_status == GateStatus.UNCHECKED
    assert node_services.allocation_reserve(owner_key="slice-1", vram_mb=4096) is None
    change = NodePolicyChange.objects.get(node=node, field="gate_status")
    assert change.reason == "host key changed" and change.changed_by == ops_user
    assert queued == ["telemetry.discover_node"]

    node = node_services.node_discover(node_id=node.pk)  # the queued judgement
    assert node.gate_status == GateStatus.PASSED, node.gate_reason
    allocation = node_services.allocation_reserve(owner_key="slice-1", vram_mb=4096)
    assert allocation is not None and allocation.gpu.node_id == node.pk
