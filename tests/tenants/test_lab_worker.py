"""The slice lifecycle with a real Celery worker against the node lab: a worker killed in
the middle of provisioning (while the node's dockerd hangs, or while the container is
created and starting) leaves exactly one container or none once reconcile has run on a
fresh worker; a node whose sshd stops, or whose host key changes, is unreachable with
the reason, and comes back."""

from __future__ import annotations

import signal
import time

import pytest

from incidents import services as incident_services
from incidents.models import Incident
from nodes import services as node_services
from nodes import ssh
from nodes.models import Allocation, Gpu, Node
from tenants import services
from tenants.models import Slice
from tests.conftest import SMALL_MODEL, SSH_KEY
from tests.tenants.test_lifecycle_worker import OWNER_LABEL, assert_counters_exact, state_of
from tests.worker_harness import wait_for

pytestmark = [pytest.mark.lab, pytest.mark.worker, pytest.mark.django_db(transaction=True)]


def labelled(node, owner_key: str) -> list:
    """The lab node's containers carrying this owner's label, running or not."""
    out = []
    for cid in node.container_ids():
        info = node.container(cid)
        if info is not None and info.labels.get(OWNER_LABEL) == owner_key:
            out.append(info)
    return out


@pytest.mark.parametrize("moment", ["dockerd hangs", "container starting"])
def test_worker_killed_mid_provision_leaves_one_container_or_none_after_reconcile(
    moment, lab_fleet, workers, owner_a, funded, lab_image, settings
):
    settings.SLICES_PROVISION_TIMEOUT_S = 2
    fleet = lab_fleet()
    node = fleet.nodes[0]
    first, log = workers()
    if moment == "dockerd hangs":
        node.freeze_dockerd()  # `docker run` on the node waits on the daemon
    else:
        node.set_hook_delay(6)  # created, and waiting in the toolkit hook to start
    s, _ = services.slice_launch(
        membership=owner_a,
        purchase=funded(owner_a, vram_gb=8, hours=2),
        image=lab_image,
        model_request=SMALL_MODEL,
        ssh_public_key=SSH_KEY,
        environment={"WORKLOAD_MB": "900"},
    )
    assert wait_for(lambda: "Task provision.slice" in log.read_text(), timeout=20)
    if moment == "dockerd hangs":
        time.sleep(1.0)  # the worker waits on the daemon (its inspect or its `docker run`)
    else:  # the worker is inside `docker run`: the container is made, its start held
        assert wait_for(lambda: len(labelled(node, s.owner_key)) == 1, timeout=20)
    first.send_signal(signal.SIGKILL)
    first.wait(timeout=10)
    assert state_of(s) == Slice.State.PROVISIONING  # the dead worker recorded nothing
    if moment == "dockerd hangs":
        node.freeze_dockerd(False)
    else:
        assert len(labelled(node, s.owner_key)) == 1  # it exists, its start not finished
    _, log2 = workers()

    def settled() -> bool:
        services.slices_reconcile()
        current = Slice.objects.get(pk=s.pk)
        mine = labelled(node, s.owner_key)
        if current.state == Slice.State.RUNNING:
            return len(mine) == 1 and mine[0].running
        if current.state == Slice.State.FAILED:
            return mine == []
        return False

    assert wait_for(settled, timeout=45, interval=0.5), (
        state_of(s),
        [(c.id[:12], c.status) for c in labelled(node, s.owner_key)],
        log2.read_text()[-3000:],
    )
    s.refresh_from_db()
    mine = labelled(node, s.owner_key)
    if s.state == Slice.State.RUNNING:
        (container,) = mine  # exactly one, the one the slice records
        assert container.id == s.container_id
        assert s.allocation.state == Allocation.State.ACTIVE
        assert Gpu.objects.get(pk=s.allocation.gpu_id).allocated_mb == 8192
        assert wait_for(lambda: node.gpu_processes(container.id), timeout=10)
    else:
        assert s.allocation.state == Allocation.State.RELEASED and mine == []
    live = {x.owner_key for x in Slice.objects.filter(state__in=["provisioning", "running"])}
    assert {c.labels.get(OWNER_LABEL) for c in map(node.container, node.container_ids())} <= live
    assert_counters_exact()


def test_a_node_whose_sshd_stops_is_unreachable_then_recovers(eager, lab_fleet, settings):
    settings.NODES_SSH_CONNECT_TIMEOUT = 2
    fleet = lab_fleet()
    lab, node = fleet.nodes[0], fleet.registered[0]
    node_services.nodes_sample(node_ids=[node.pk])
    lab.stop_sshd()  # the listener only: the session already open keeps sampling
    assert node_services.nodes_sample(node_ids=[node.pk])["sampled"] == 1
    lab.stop_sshd(sessions=True)  # the node goes down: nothing answers any more
    for _ in range(settings.NODES_UNREACHABLE_AFTER):
        ssh.get_pool()._backoff.clear()  # each beat would find it after its backoff
        node_services.nodes_sample(node_ids=[node.pk])
    node.refresh_from_db()
    assert node.status == Node.Status.UNREACHABLE, (node.consecutive_failures, node.last_error)
    assert "cannot connect" in node.status_reason
    incident_services.watch_sweep()
    assert Incident.objects.get(rule="node_unreachable").node_id == node.pk
    lab.start_sshd()
    ssh.get_pool()._backoff.clear()
    node_services.nodes_sample(node_ids=[node.pk])
    node.refresh_from_db()
    assert node.status == Node.Status.ACTIVE
    incident_services.watch_sweep()
    assert Incident.objects.get(rule="node_unreachable").status == Incident.Status.RESOLVED


def test_a_changed_host_key_is_refused_at_once_and_nothing_is_sent(eager, lab_fleet):
    fleet = lab_fleet()
    lab, node = fleet.nodes[0], fleet.registered[0]
    node_services.nodes_sample(node_ids=[node.pk])
    logins = (lab.log_dir / "sshd.log").read_text().count("Accepted publickey")
    lab.rotate_host_key()
    node_services.nodes_sample(node_ids=[node.pk])
    node.refresh_from_db()
    assert node.status == Node.Status.UNREACHABLE  # at once, not after three tries
    assert "host key changed" in node.status_reason
    # the platform never authenticated to the impostor
    assert (lab.log_dir / "sshd.log").read_text().count("Accepted publickey") == logins
