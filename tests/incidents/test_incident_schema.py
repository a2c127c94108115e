"""The incident reads answer in the shapes their schema documents: nulls where nobody has
acknowledged or resolved yet, and the tenant's own shape, chosen by who asks."""

from __future__ import annotations

import pytest
from django.utils import timezone
from drf_spectacular.generators import SchemaGenerator

from incidents import services
from incidents.models import Incident
from tenants.models import Purchase, Slice, Tier

pytestmark = pytest.mark.django_db


@pytest.fixture(scope="module")
def schema(django_db_blocker):
    with django_db_blocker.unblock():
        return SchemaGenerator().get_schema(request=None, public=True)


def _incident(tenant) -> Incident:
    """An incident about one of the tenant's (stopped) slices: a tenant sees those."""
    now = timezone.now()
    purchase = Purchase.objects.create(
        tenant=tenant, tier=Tier.objects.get(vram_mb=8192), hours=1, price_paid=0,
        minutes_total=60, minutes_left=60,
    )  # fmt: skip
    slice = Slice.objects.create(
        tenant=tenant, purchase=purchase, image="x/y:1", vram_mb=8192, state="stopped"
    )
    return Incident.objects.create(
        rule="quota_breach", target_key="t:1", title="Slice over its VRAM quota",
        severity="critical", root_cause="app_parameters", tenant=tenant, slice=slice,
        first_seen_at=now, last_seen_at=now,
    )  # fmt: skip


def _shape(schema, name: str) -> tuple[set[str], dict]:
    component = schema["components"]["schemas"][name]
    return set(component["required"]), component["properties"]


def test_an_open_and_a_reopened_incident_answer_null_where_documented_nullable(
    schema, api_ops, ops_user, owner_a
):
    incident = _incident(owner_a.tenant)
    [row] = api_ops.get("/api/v1/incidents/").json()["results"]
    services.incident_resolve(incident=incident, actor=ops_user, note="fixed")
    reopened = api_ops.post(f"/api/v1/incidents/{incident.pk}/reopen/", {}, format="json")
    assert reopened.status_code == 200, reopened.content
    answers = [
        (row, "OpsIncident", ("acknowledged_by", "resolved_by")),
        (reopened.json(), "OpsIncidentDetail", ("resolved_by",)),
    ]
    for body, component, fields in answers:
        _, properties = _shape(schema, component)
        for field in fields:
            assert body[field] is None, (component, field)
            assert properties[field]["nullable"] is True, (component, field)


def test_a_tenant_reads_its_own_documented_shape_and_ops_theirs(schema, api_ops, api_a, owner_a):
    _incident(owner_a.tenant)
    listed = schema["components"]["schemas"]["IncidentForCaller"]["oneOf"]
    detail = schema["components"]["schemas"]["IncidentDetailForCaller"]["oneOf"]
    assert {ref["$ref"].rsplit("/", 1)[1] for ref in listed} == {"OpsIncident", "TenantIncident"}
    assert {ref["$ref"].rsplit("/", 1)[1] for ref in detail} == {
        "OpsIncidentDetail",
        "TenantIncident",
    }
    tenant_required, _ = _shape(schema, "TenantIncident")
    ops_required, _ = _shape(schema, "OpsIncident")
    [theirs] = api_a.get("/api/v1/incidents/").json()["results"]
    [ours] = api_ops.get("/api/v1/incidents/").json()["results"]
    # each answer has every field its shape requires and lacks one the other requires,
    # so exactly one of the two (oneOf) matches it
    assert tenant_required <= set(theirs) and not ops_required <= set(theirs)
    assert ops_required <= set(ours) and not tenant_required <= set(ours)
