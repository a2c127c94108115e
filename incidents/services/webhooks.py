"""Webhook endpoints that receive incident notifications: made with a fresh signing secret
under a small cap per owner (a tenant, or ops when there is none), and deactivated, never
deleted, so that their deliveries stay readable."""

from __future__ import annotations

import secrets

from django.db import transaction

from gpuplatform.errors import Conflict
from tenants.locks import tenant_lock
from tenants.models import Tenant

from ..models import WebhookEndpoint

# Each incident is POSTed to every active endpoint of its tenant: keep the fan-out small.
MAX_ACTIVE_WEBHOOKS = 5


@transaction.atomic
def webhook_create(*, tenant: Tenant | None, url: str) -> WebhookEndpoint:
    """A new active endpoint for the tenant (None: an ops endpoint, for every incident);
    409 `too_many_webhooks` when the owner has MAX_ACTIVE_WEBHOOKS active already."""
    if tenant is not None:  # one create at a time per tenant, so the cap holds
        tenant_lock(tenant.pk)
        endpoints = WebhookEndpoint.objects.for_tenant(tenant)
    else:
        endpoints = WebhookEndpoint.objects.filter(tenant__isnull=True)
    if endpoints.filter(is_active=True).count() >= MAX_ACTIVE_WEBHOOKS:
        raise Conflict(
            f"At most {MAX_ACTIVE_WEBHOOKS} active endpoints: delete one first.",
            code="too_many_webhooks",
        )
    return WebhookEndpoint.objects.create(tenant=tenant, url=url, secret=secrets.token_urlsafe(32))


@transaction.atomic
def webhook_deactivate(*, endpoint: WebhookEndpoint) -> WebhookEndpoint:
    """Stop sending to the endpoint; deactivating an inactive one changes nothing."""
    if endpoint.is_active:
        endpoint.is_active = False
        endpoint.save(update_fields=["is_active"])
    return endpoint
