"""Dynamic limiting against the emulator: a slice hogging the card's memory bandwidth
is slowed by pausing and resuming its container, and only that container."""

import pytest
from django.db import transaction
from django.utils import timezone

from incidents import rules, throttle
from incidents import services as incident_services
from incidents.models import Incident, IncidentEvent, SliceWatch
from nodes import services as node_services
from tenants import services
from tenants.models import Slice
from tests.conftest import SMALL_MODEL, SSH_KEY

pytestmark = pytest.mark.django_db(transaction=True)


def test_a_bandwidth_hog_is_paused_and_resumed_alone(
    eager, worker_fleet, owner_a, owner_b, funded, image_ssh, monkeypatch
):
    monkeypatch.setattr(throttle, "DUTY_PAUSE_S", 0.05)
    monkeypatch.setattr(throttle, "DUTY_RUN_S", 0.05)
    monkeypatch.setattr(throttle, "duty_cycles", lambda _interval: 2)
    fleet = worker_fleet()
    emu = fleet.nodes[0]

    def launch(member, env):
        s, _ = services.slice_launch(
            membership=member,
            purchase=funded(member, vram_gb=8),
            image=image_ssh,
            model_request=SMALL_MODEL,
            ssh_public_key=SSH_KEY,
            environment=env,
        )
        s.refresh_from_db()
        assert s.state == Slice.State.RUNNING, s.state_reason
        return s

    hog = launch(owner_a, {"EMULATOR_MEM_UTIL": "90", "EMULATOR_SM_UTIL": "80"})
    calm = launch(owner_b, {"EMULATOR_MEM_UTIL": "20"})
    emu.clear_audit()
    node_services.nodes_sample(node_ids=[fleet.registered[0].pk])

    incident = Incident.objects.get(rule="bandwidth_hog")
    assert incident.slice_id == hog.pk
    assert SliceWatch.objects.get(slice=hog).throttled_at is not None
    docker = [a for a in emu.audit_log if a[:1] == ["docker"]]
    assert ["docker", "pause", hog.container_id] in docker
    assert ["docker", "unpause", hog.container_id] in docker
    assert not [a for a in docker if calm.container_id in a]  # the neighbour untouched
    assert emu.container(hog.container_id).status == "running"  # resumed at the end
    assert IncidentEvent.objects.filter(incident=incident, kind="disposed").exists()
    assert not Incident.objects.filter(slice=calm).exists()

    # back under the limit: the watchdog's release finding resolves the incident, and the
    # release task (after commit) resumes the container, no further pause cycle
    emu.clear_audit()
    back = rules.Finding(
        rule="bandwidth_hog",
        target=f"slice:{hog.pk}",
        severity=rules.WARNING,
        root_cause=rules.APP_PARAMETERS,
        title=f"Slice {hog.pk} is back under the bandwidth limit",
        slice_id=hog.pk,
        action=rules.UNTHROTTLE,
        resolves=True,
    )
    with transaction.atomic():
        incident_services.findings_apply(findings=[back], now=timezone.now())
    docker = [a for a in emu.audit_log if a[:1] == ["docker"]]
    assert docker == [["docker", "unpause", hog.container_id]]
    assert SliceWatch.objects.get(slice=hog).throttled_at is None
    incident.refresh_from_db()
    assert incident.status == Incident.Status.RESOLVED
