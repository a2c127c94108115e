"""The incidents API's lists against the shared contract: a tenant's view of the incidents
about its slices, its webhook endpoints and each endpoint's deliveries."""

import pytest
from django.utils import timezone

from incidents import services
from incidents.models import Incident, WebhookDelivery, WebhookEndpoint
from incidents.notify import incident_notify
from incidents.rules import APP_PARAMETERS, CRITICAL, STOP_SLICE, Finding
from tenants.models import Membership
from tests.api_contract import ApiResourceContract
from tests.tenants.api_objects import queued_slice

pytestmark = pytest.mark.django_db


def slice_incident(membership: Membership) -> Incident:
    """What the watchdog files for a slice over its VRAM quota, and the notifications it
    queues (a delivery to each of the tenant's active webhook endpoints)."""
    slice = queued_slice(membership)
    finding = Finding(
        rule="quota_breach",
        target=f"slice:{slice.pk}",
        severity=CRITICAL,
        root_cause=APP_PARAMETERS,
        title=f"Slice {slice.pk} over its VRAM quota",
        slice_id=slice.pk,
        tenant_id=membership.tenant_id,
        action=STOP_SLICE,
    )
    incident, created = services.incident_record(finding=finding, now=timezone.now())
    assert created
    incident_notify(incident=incident, event="opened")
    return incident


class TestIncidentsApi(ApiResourceContract):
    list_url = "/api/v1/incidents/"
    filters = {
        "status": ("unresolved", "resolved"),
        "severity": ("critical", "info"),
        "root_cause": ("app_parameters", "hardware"),
        "search": ("VRAM quota", "zzz-nothing"),
    }

    def make(self, membership):
        return slice_incident(membership)


class TestWebhooksApi(ApiResourceContract):
    list_url = "/api/v1/webhooks/"
    filters = {"is_active": ("true", "false"), "search": ("alpha-hooks", "zzz-nothing")}

    def make(self, membership):
        # Written directly: the service caps a tenant at 5 active endpoints, and the
        # contract makes more.
        return WebhookEndpoint.objects.create(
            tenant=membership.tenant, url="https://alpha-hooks.example.com/in", secret="s" * 43
        )


class TestWebhookDeliveriesApi(ApiResourceContract):
    list_url = "/api/v1/webhooks/{id}/deliveries/"
    has_detail = False

    def make(self, membership):
        """A delivery of a new incident to the tenant's one endpoint (made once)."""
        endpoint = WebhookEndpoint.objects.for_tenant(membership.tenant).first()
        if endpoint is None:
            endpoint = services.webhook_create(
                tenant=membership.tenant, url="https://alpha-hooks.example.com/in"
            )
        incident = slice_incident(membership)
        return WebhookDelivery.objects.get(endpoint=endpoint, incident=incident)

    def parent_id(self, obj):
        return obj.endpoint_id
