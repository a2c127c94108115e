"""Ops' actions from an incident, as services and on the API (the pages' stop-slice,
drain-gpu and drain-node): the effect and its timeline event, ops only, the page's
refusals as 409s; and the webhook services the API's create and delete call."""

import pytest
from django.utils import timezone

from gpuplatform.errors import Conflict, NotAllowed
from incidents import services
from incidents.models import BREAKER_REASON, Incident, IncidentEvent, WebhookEndpoint
from incidents.services.webhooks import MAX_ACTIVE_WEBHOOKS
from nodes.models import Gpu, Node
from tenants.models import Slice
from tests.incidents.support import running_slice

pytestmark = pytest.mark.django_db

INCIDENTS = "/api/v1/incidents/"
ACTIONS = ("stop-slice", "drain-gpu", "drain-node")


@pytest.fixture
def gpu():
    node = Node.objects.create(
        gate_status="passed", name="act1", address="10.7.0.1", status="active", host_key="k"
    )
    return Gpu.objects.create(
        node=node, uuid="GPU-act1-0", index=0, model="A30", vram_total_mb=24576
    )


def make_incident(**kw) -> Incident:
    now = timezone.now()
    values = {
        "rule": "quota_breach",
        "target_key": f"test:{Incident.objects.count() + 1}",
        "title": "Slice over its VRAM quota",
        "severity": "critical",
        "root_cause": "app_parameters",
        "first_seen_at": now,
        "last_seen_at": now,
    }
    values.update(kw)
    return Incident.objects.create(**values)


@pytest.fixture
def breach(owner_a, gpu):
    s = running_slice(owner_a, gpu)
    return make_incident(slice=s, tenant=owner_a.tenant, gpu=gpu, node=gpu.node)


def post(client, incident_id: int, action: str, body=None):
    return client.post(f"{INCIDENTS}{incident_id}/{action}/", body or {}, format="json")


def actions(incident: Incident) -> list[str]:
    events = incident.events.filter(kind=IncidentEvent.Kind.ACTION).order_by("at", "id")
    return [e.data["action"] for e in events]


# --- the services ------------------------------------------------------------------------------


def test_incident_stop_slice_force_stops_it_and_records_the_action(
    breach, ops_user, django_capture_on_commit_callbacks
):
    with django_capture_on_commit_callbacks(execute=False):
        s = services.incident_stop_slice(incident=breach, actor=ops_user, reason="Leaking.")
    assert s.state in ("stopping", "stopped") and "Leaking." in s.state_reason
    event = breach.events.get(kind=IncidentEvent.Kind.ACTION)
    assert event.actor == ops_user and event.data == {
        "action": "stop_slice",
        "slice_id": s.pk,
        "slice_state": s.state,
    }
    assert event.message == f"Slice {s.pk} force-stopped by ops ({s.state}): Leaking."


def test_incident_stop_slice_refuses_a_tenant_and_an_ended_slice(breach, ops_user, owner_a):
    with pytest.raises(NotAllowed):
        services.incident_stop_slice(incident=breach, actor=owner_a.user, reason="x")
    Slice.objects.filter(pk=breach.slice_id).update(state="stopped")
    with pytest.raises(Conflict) as caught:
        services.incident_stop_slice(incident=breach, actor=ops_user, reason="x")
    assert caught.value.code == "no_running_slice"
    assert not breach.events.exists()


def test_incident_drain_gpu_turns_the_breakers_closure_into_a_drain(breach, ops_user, gpu):
    Gpu.objects.filter(pk=gpu.pk).update(
        accepting_placements=False, not_accepting_reason=f"{BREAKER_REASON}: 96% used"
    )
    drained = services.incident_drain_gpu(incident=breach, actor=ops_user, reason="ECC storm")
    assert drained.not_accepting_reason == f"Incident #{breach.pk}: ECC storm"
    # now an ops closure: a second drain is refused, as the page no longer offers it
    with pytest.raises(Conflict) as caught:
        services.incident_drain_gpu(incident=breach, actor=ops_user, reason="again")
    assert caught.value.code == "nothing_to_drain"
    assert actions(breach) == ["drain_gpu"]


def test_incident_drain_node_finds_the_node_through_the_gpu(ops_user, gpu):
    incident = make_incident(gpu=gpu)  # names no node of its own
    node = services.incident_drain_node(incident=incident, actor=ops_user, reason="PSU")
    assert node.pk == gpu.node_id and node.drained_at is not None
    assert node.drain_reason == f"Incident #{incident.pk}: PSU" and node.status == "draining"
    with pytest.raises(Conflict) as caught:
        services.incident_drain_node(incident=incident, actor=ops_user, reason="again")
    assert caught.value.code == "nothing_to_drain"
    assert actions(incident) == ["drain_node"]


def test_webhook_create_caps_each_owner_apart_and_deactivate_is_safe_twice(owner_a):
    tenant = owner_a.tenant
    made = [
        services.webhook_create(tenant=tenant, url=f"https://h.example/{n}")
        for n in range(MAX_ACTIVE_WEBHOOKS)
    ]
    assert len({e.secret for e in made}) == len(made) and all(e.is_active for e in made)
    with pytest.raises(Conflict) as caught:
        services.webhook_create(tenant=tenant, url="https://h.example/over")
    assert caught.value.code == "too_many_webhooks"
    ops = services.webhook_create(tenant=None, url="http://10.0.0.5/pager")  # ops count apart
    assert ops.tenant is None
    for _ in range(2):
        assert not services.webhook_deactivate(endpoint=made[0]).is_active
    assert not WebhookEndpoint.objects.get(pk=made[0].pk).is_active
    services.webhook_create(tenant=tenant, url="https://h.example/again")  # room again


# --- the API -------------------------------------------------------------------------------------


def test_ops_stop_the_slice_through_the_api(
    api_ops, breach, ops_user, django_capture_on_commit_callbacks
):
    with django_capture_on_commit_callbacks(execute=False) as dispatched:
        response = post(api_ops, breach.pk, "stop-slice", {"reason": "Leaking past its quota."})
    assert response.status_code == 202, response.content
    s = Slice.objects.get(pk=breach.slice_id)
    assert s.state in ("stopping", "stopped") and "Leaking past its quota." in s.state_reason
    names = sorted(d.func.__self__.name for d in dispatched)
    assert names == ["provision.stop_slice", "tenants.notify_members"]
    body = response.json()
    assert body["id"] == breach.pk
    assert [e["kind"] for e in body["timeline"]].count("action") == 1
    assert actions(breach) == ["stop_slice"]


def test_ops_drain_the_gpu_then_the_node_through_the_api(api_ops, breach, gpu):
    response = post(api_ops, breach.pk, "drain-gpu", {"reason": "ECC storm"})
    assert response.status_code == 200, response.content
    gpu.refresh_from_db()
    assert not gpu.accepting_placements and "ECC storm" in gpu.not_accepting_reason
    response = post(api_ops, breach.pk, "drain-node", {"reason": "PSU"})
    assert response.status_code == 200, response.content
    node = Node.objects.get(pk=gpu.node_id)
    assert node.drained_at is not None and "PSU" in node.drain_reason
    assert actions(breach) == ["drain_gpu", "drain_node"]
    for action in ("drain-gpu", "drain-node"):  # the page no longer offers them either
        response = post(api_ops, breach.pk, action, {"reason": "again"})
        assert response.status_code == 409, action
        assert response.json()["code"] == "nothing_to_drain"


def test_an_incident_without_slice_gpu_or_node_refuses_each_action(api_ops):
    incident = make_incident(rule="vram_high", target_key="nothing:1")
    codes = {}
    for action in ACTIONS:
        response = post(api_ops, incident.pk, action, {"reason": "x"})
        assert response.status_code == 409, action
        codes[action] = response.json()["code"]
    assert codes == {
        "stop-slice": "no_running_slice",
        "drain-gpu": "nothing_to_drain",
        "drain-node": "nothing_to_drain",
    }
    assert not incident.events.exists()


@pytest.mark.parametrize("action", ACTIONS)
def test_each_action_needs_a_reason_and_takes_no_other_field(api_ops, breach, gpu, action):
    for body, field, code in (
        ({}, "reason", "required"),
        ({"reason": ""}, "reason", "blank"),
        ({"reason": "x" * 301}, "reason", "max_length"),
        ({"reason": "x", "force": True}, "force", "unknown_field"),
    ):
        response = post(api_ops, breach.pk, action, body)
        assert response.status_code == 400, (action, body)
        assert response.json()["code"] == "validation_error"
        assert [e["code"] for e in response.json()["fields"][field]] == [code], body
    gpu.refresh_from_db()
    assert gpu.accepting_placements and Slice.objects.get(pk=breach.slice_id).state == "running"
    assert not breach.events.exists()


@pytest.mark.parametrize("action", ACTIONS)
def test_a_tenant_is_refused_even_on_its_own_incident(api_a, breach, gpu, action):
    response = post(api_a, breach.pk, action, {"reason": "x"})
    assert response.status_code == 403
    assert response.json()["code"] == "permission_denied"
    gpu.refresh_from_db()
    assert gpu.accepting_placements and gpu.node.drained_at is None
    assert Slice.objects.get(pk=breach.slice_id).state == "running"
    assert not breach.events.exists()


@pytest.mark.parametrize("action", ACTIONS)
def test_an_unknown_incident_is_404_and_anonymous_is_401(api_ops, anon_api, breach, action):
    response = post(api_ops, 999999, action, {"reason": "x"})
    assert response.status_code == 404
    assert response.json() == {"code": "not_found", "message": "Not found."}
    response = post(anon_api, breach.pk, action, {"reason": "x"})
    assert response.status_code == 401


def test_the_api_refuses_to_stop_a_slice_resumed_since_the_incident_saw_it(api_ops, breach):
    """The run an incident is about ended and the slice was resumed: the API refuses the
    stop (409, nothing stopped), as the page does."""
    s = Slice.objects.get(pk=breach.slice_id)
    Slice.objects.filter(pk=s.pk).update(runs=s.runs + 1)
    s.transitions.create(from_state="stopped", to_state="requested")
    seen = timezone.now() - timezone.timedelta(minutes=1)
    Incident.objects.filter(pk=breach.pk).update(first_seen_at=seen, last_seen_at=seen)
    response = post(api_ops, breach.pk, "stop-slice", {"reason": "Old news."})
    assert response.status_code == 409, response.content
    assert response.json()["code"] == "no_running_slice"
    assert "resumed" in response.json()["message"]
    assert Slice.objects.get(pk=s.pk).state == "running"
    assert actions(breach) == []
