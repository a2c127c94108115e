"""The incident ledger's invariants, enforced by the database."""

from datetime import timedelta

import pytest
from django.db import IntegrityError, transaction
from django.utils import timezone

from incidents.models import Incident, IncidentEvent

pytestmark = pytest.mark.django_db


def _incident(**kw):
    now = timezone.now()
    data = {
        "rule": "vram_warning",
        "target_key": "gpu:GPU-1",
        "title": "85% VRAM",
        "first_seen_at": now,
        "last_seen_at": now,
        **kw,
    }
    return Incident.objects.create(**data)


def test_one_unresolved_incident_per_rule_and_target():
    first = _incident()
    with pytest.raises(IntegrityError), transaction.atomic():
        _incident()
    _incident(target_key="gpu:GPU-2")  # another target is fine
    first.status = Incident.Status.RESOLVED
    first.resolved_at = timezone.now()
    first.save()
    _incident()  # after resolution the rule may fire again


def test_timestamps_and_resolution_are_consistent():
    now = timezone.now()
    with pytest.raises(IntegrityError), transaction.atomic():
        _incident(first_seen_at=now, last_seen_at=now - timedelta(seconds=1))
    with pytest.raises(IntegrityError), transaction.atomic():
        _incident(status=Incident.Status.RESOLVED)  # resolved without a time
    with pytest.raises(IntegrityError), transaction.atomic():
        _incident(occurrences=0)


def test_timeline_is_ordered_and_deleted_with_incident():
    incident = _incident()
    for kind in ["detected", "located", "classified"]:
        IncidentEvent.objects.create(incident=incident, kind=kind, message=kind)
    assert [e.kind for e in incident.events.all()] == ["detected", "located", "classified"]
    incident.delete()
    assert not IncidentEvent.objects.exists()


def test_tenant_scoping_of_incidents(owner_a, owner_b):
    mine = _incident(tenant=owner_a.tenant)
    _incident(tenant=owner_b.tenant, target_key="gpu:GPU-9")
    assert list(Incident.objects.for_tenant(owner_a.tenant)) == [mine]
    assert not Incident.objects.for_tenant(None).exists()


def test_ops_only_incidents_are_never_a_tenants(owner_a):
    mine = _incident(tenant=owner_a.tenant)
    _incident(tenant=owner_a.tenant, rule="accounting_drift", target_key="slice:1")
    assert list(Incident.objects.for_tenant(owner_a.tenant)) == [mine]
