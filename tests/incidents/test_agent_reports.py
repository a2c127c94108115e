"""What a node agent's journal becomes in the ledger, without a node: entries as the agent
writes them (the lab tests produce real ones), filed by incidents' agent hook."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from incidents.models import Incident, NeighbourHarm
from incidents.selectors import incident_harms
from incidents.services.agent_reports import agent_entries_file
from nodes.models import AgentEntry, AgentState, Gpu, NodeAgent
from tests.incidents.support import placeable_node, running_slice

pytestmark = pytest.mark.django_db

HARMED, OFFENDER = "a" * 64, "b" * 64


@pytest.fixture
def card():
    node = placeable_node("node-agent1", "10.0.0.1")
    return Gpu.objects.create(node=node, uuid="GPU-1", index=0, model="A30", vram_total_mb=24576)


def entries(node, *payloads):
    first = AgentEntry.objects.filter(node=node).count() + 1
    rows = [
        AgentEntry.objects.create(
            node=node, journal_id="j", seq=i, kind=p["kind"], at=timezone.now(),
            container_id=p.get("container_id") or "", payload={"seq": i, **p},
        )
        for i, p in enumerate(payloads, first)
    ]  # fmt: skip
    return rows


BEGAN = timezone.now() - timedelta(seconds=2)


def harm(ended: bool, short: int = 3616, began=BEGAN):
    return {
        "kind": "harm",
        "harm_id": "h1",
        "container_id": HARMED,
        "offenders": [OFFENDER],
        "short_mb": short,
        "quota_mb": 8192,
        "device_uuid": "GPU-1",
        "started_at": began.isoformat(),
        "ended_at": (began + timedelta(seconds=1.2)).isoformat() if ended else None,
    }


def test_a_harm_is_recorded_once_told_to_the_harmed_tenant_alone_and_resolved_when_it_ends(
    card, owner_a, owner_b, client, ops_user
):
    harmed = running_slice(owner_a, card, cid=HARMED)
    offender = running_slice(owner_b, card, cid=OFFENDER)
    agent = NodeAgent.objects.create(node=card.node, state=AgentState.OK)
    agent_entries_file(node=card.node, agent=agent, entries=entries(card.node, harm(False)))
    row = NeighbourHarm.objects.get()
    assert (row.slice, row.ended_at, row.short_mb) == (harmed, None, 3616)
    assert row.offender_slices == [offender.pk] and row.gpu == card
    open_ = Incident.objects.get(rule="neighbour_harm")
    assert open_.status == "open" and open_.slice == harmed
    assert open_.title == f"Slice {harmed.pk} was short of its VRAM"
    # the end, reported twice (at-least-once): one row, one incident, resolved
    ends = entries(card.node, *[harm(True, 4000)] * 1)
    for _ in range(2):
        agent_entries_file(node=card.node, agent=agent, entries=ends)
    row.refresh_from_db()
    assert NeighbourHarm.objects.count() == 1
    assert row.short_mb == 4000 and row.duration_s == pytest.approx(1.2, abs=0.01)
    [hurt] = Incident.objects.filter(rule="neighbour_harm")
    assert hurt.status == "resolved" and incident_harms(incident=hurt) == [row]
    assert list(Incident.objects.for_tenant(owner_a.tenant)) == [hurt]
    assert not Incident.objects.for_tenant(owner_b.tenant).exists()
    told = hurt.title + " ".join(hurt.events.values_list("message", flat=True))
    assert f"Slice {offender.pk}" not in told and owner_b.tenant.name not in told
    # the tenant's page says it in plain words; ops' page shows the harm and its cause
    client.force_login(owner_a.user)
    page = client.get(f"/incidents/{hurt.pk}/").content.decode()
    assert f"Slice {harmed.pk} was short of its VRAM" in page
    assert "held more memory than its own quota" in page and "nothing is needed from you" in page
    client.force_login(ops_user)
    page = client.get(f"/ops/incidents/{hurt.pk}/").content.decode()
    assert 'id="neighbour-harms"' in page and "1.2 s" in page and "4000 MiB" in page
    kpis = client.get("/ops/incidents/kpis/").content.decode()
    assert '<p class="kpi-value" id="kpi-harms">1</p>' in kpis
    assert "1 harm, longest 1.2 s, 1.2 s in all" in kpis


def test_an_agent_that_ran_before_and_stops_answering_is_an_ops_incident_until_it_runs(card):
    agent = NodeAgent.objects.create(node=card.node, state=AgentState.SILENT, reason="gone.")
    agent_entries_file(node=card.node, agent=agent, entries=[])
    assert not Incident.objects.exists()  # never seen running: being set up, not failing
    agent.healthy_at = timezone.now()
    agent_entries_file(node=card.node, agent=agent, entries=[])
    down = Incident.objects.get(rule="agent_down")
    assert down.severity == "critical" and down.tenant_id is None
    agent.state = AgentState.OK
    agent_entries_file(node=card.node, agent=agent, entries=[])
    down.refresh_from_db()
    assert down.status == "resolved"


def test_a_stray_and_a_restart_are_ops_only(card, owner_a):
    agent = NodeAgent.objects.create(node=card.node, state=AgentState.OK)
    stray = {"kind": "stray", "pid": 77, "device_uuid": "GPU-1", "used_mb": 900,
             "name": "python3", "container_id": None, "action": "reported"}  # fmt: skip
    agent_entries_file(
        node=card.node, agent=agent, entries=entries(card.node, stray, {"kind": "exit", "code": -9})
    )
    assert set(Incident.objects.values_list("rule", flat=True)) == {"stray_process", "agent_failed"}
    assert not Incident.objects.for_tenant(owner_a.tenant).exists()


def test_an_agent_restart_closes_the_harms_it_had_open(card, owner_a):
    harmed = running_slice(owner_a, card, cid=HARMED)
    agent = NodeAgent.objects.create(node=card.node, state=AgentState.OK)
    agent_entries_file(node=card.node, agent=agent, entries=entries(card.node, harm(False)))
    restart = {"kind": "start", "version": "1.0.0", "pid": 9}
    agent_entries_file(node=card.node, agent=agent, entries=entries(card.node, restart))
    row = NeighbourHarm.objects.get(slice=harmed)
    assert row.ended_at is not None
    assert Incident.objects.get(rule="neighbour_harm").status == "resolved"
