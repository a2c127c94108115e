"""Incident notifications: email to ops (and to the tenant, for incidents about their
slices), and signed webhooks, delivered by tasks with retries after commit."""

from __future__ import annotations

import hashlib
import hmac
import http.client
import ipaddress
import json
import socket
import time
import urllib.error
import urllib.parse
import urllib.request

from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.mail import send_mail
from django.db.models import Q
from django.utils import timezone

from .models import Incident, WebhookDelivery, WebhookEndpoint

SIGNATURE_HEADER = "X-Gpuplatform-Signature"
TIMESTAMP_HEADER = "X-Gpuplatform-Timestamp"
WEBHOOK_TIMEOUT_S = 10


def incident_notify(*, incident: Incident, event: str) -> None:
    """Queue the notifications for an incident event (after commit)."""
    from .tasks import deliver_webhook, notify_email

    notify_email.delay_on_commit(incident.pk, event)
    endpoints = WebhookEndpoint.objects.filter(is_active=True).filter(
        Q(tenant__isnull=True) | Q(tenant_id=incident.tenant_id)
        if incident.tenant_id
        else Q(tenant__isnull=True)
    )
    for endpoint in endpoints:
        delivery = WebhookDelivery.objects.create(
            endpoint=endpoint,
            incident=incident,
            event=event,
            payload=payload(incident, event, for_tenant=endpoint.tenant_id is not None),
        )
        deliver_webhook.delay_on_commit(delivery.pk)


def payload(incident: Incident, event: str, *, for_tenant: bool) -> dict:
    body = {
        "event": f"incident.{event}",
        "incident": {
            "id": incident.pk,
            "rule": incident.rule,
            "title": incident.title,
            "severity": incident.severity,
            "status": incident.status,
            "root_cause": incident.root_cause,
            "slice": incident.slice_id,
            "first_seen_at": incident.first_seen_at.isoformat(),
            "last_seen_at": incident.last_seen_at.isoformat(),
        },
    }
    if not for_tenant:  # ops see where; a tenant sees only their own slice
        body["incident"].update(
            tenant=incident.tenant_id, node=incident.node_id, gpu=incident.gpu_id
        )
    return body


def sign(secret: str, timestamp: str, body: bytes) -> str:
    """HMAC-SHA256 over "<timestamp>.<body>", hex: receivers check it and the age."""
    mac = hmac.new(secret.encode(), timestamp.encode() + b"." + body, hashlib.sha256)
    return "sha256=" + mac.hexdigest()


class _NoRedirects(urllib.request.HTTPRedirectHandler):
    """A webhook is answered, not forwarded: a redirect is a failed delivery (and never
    a way to make the platform fetch an internal address)."""

    def redirect_request(self, req, fp, code, msg, headers, newurl):  # type: ignore[no-untyped-def]
        return None


_OPENER = urllib.request.build_opener(_NoRedirects)


def _refuse_private_destination(url: str) -> None:
    """Tenant endpoints must resolve to public addresses only, checked at send time (a
    name can be re-pointed after the endpoint was saved)."""
    host = urllib.parse.urlsplit(url).hostname or ""
    try:
        infos = socket.getaddrinfo(host, None, proto=socket.IPPROTO_TCP)
    except socket.gaierror as exc:
        raise ValueError(f"cannot resolve {host}: {exc}") from exc
    for info in infos:
        address = ipaddress.ip_address(info[4][0])
        if not address.is_global:
            raise ValueError(f"{host} resolves to a non-public address ({address})")


class DeliveryFailed(Exception):
    """The endpoint did not take the webhook; the task retries."""


def webhook_deliver(*, delivery_id: int, final_attempt: bool) -> str:
    delivery = WebhookDelivery.objects.select_related("endpoint").get(pk=delivery_id)
    if delivery.status == WebhookDelivery.Status.DELIVERED:
        return delivery.status
    body = json.dumps(delivery.payload, sort_keys=True).encode()
    timestamp = str(int(time.time()))
    request = urllib.request.Request(  # noqa: S310 - ops-configured https/http URL
        delivery.endpoint.url,
        data=body,
        method="POST",
        headers={
            "Content-Type": "application/json",
            "User-Agent": "gpuplatform-webhooks/1",
            TIMESTAMP_HEADER: timestamp,
            SIGNATURE_HEADER: sign(delivery.endpoint.secret, timestamp, body),
        },
    )
    delivery.attempts += 1
    try:
        if delivery.endpoint.tenant_id is not None and not settings.WEBHOOKS_ALLOW_PRIVATE:
            _refuse_private_destination(delivery.endpoint.url)
        with _OPENER.open(request, timeout=WEBHOOK_TIMEOUT_S) as response:
            delivery.response_status = response.status
        delivery.status = WebhookDelivery.Status.DELIVERED
        delivery.delivered_at = timezone.now()
        delivery.last_error = ""
    except (urllib.error.URLError, OSError, ValueError, http.client.HTTPException) as exc:
        code = getattr(exc, "code", None)
        delivery.response_status = code if isinstance(code, int) else None
        delivery.last_error = str(exc)[:500]
        if final_attempt:
            delivery.status = WebhookDelivery.Status.FAILED
    delivery.save()
    if delivery.status == WebhookDelivery.Status.PENDING:
        raise DeliveryFailed(delivery.last_error)
    return delivery.status


def email_send(*, incident_id: int, event: str) -> int:
    incident = Incident.objects.select_related("tenant", "slice").get(pk=incident_id)
    sent = 0
    ops = list(
        get_user_model()
        .objects.filter(is_staff=True, is_active=True)
        .exclude(email="")
        .values_list("email", flat=True)
    )
    subject = f"[gpuplatform] {incident.severity}: {incident.title}"[:150]
    link = f"{settings.SITE_URL}/ops/incidents/{incident.pk}/"
    if ops:
        send_mail(
            subject,
            f"{incident.title}\n\nRule: {incident.rule}\nClass: "
            f"{incident.get_root_cause_display()}\n\n{link}",
            settings.DEFAULT_FROM_EMAIL,
            ops,
        )
        sent += len(ops)
    if incident.tenant_id and incident.slice_id:
        from tenants.services import members_notify_send

        sent += members_notify_send(
            tenant_id=incident.tenant_id,
            subject=f"About your slice {incident.slice_id}: {incident.title}"[:150],
            body=tenant_text(incident),
        )
    return sent


TENANT_ADVICE = {
    "quota_breach": "Your job used more GPU memory than your tier. Lower the batch size "
    "or context length, load the model quantized (8-bit or 4-bit), or buy a bigger tier.",
    "oom_exit": "Your job ran out of GPU memory. Lower the batch size or context length, "
    "quantize the model, or buy a bigger tier.",
    "idle_slice": "Your slice did no GPU work for a long time, so its memory was released "
    "for others. Launch again when you need it.",
    "slow_leak": "Your job's GPU memory keeps growing. Check for tensors kept across "
    "steps (for example losses kept with their graph) or an unbounded cache.",
    "bandwidth_hog": "Your job used most of the card's memory bandwidth, so it was slowed "
    "down to protect other tenants on the card. It runs at full speed again once it uses less.",
    "process_jump": "Your job's GPU memory jumped by several GB at once.",
    "hardware_fault": "The GPU your slice runs on reported a hardware fault. We took it "
    "out of service for new work; relaunch to move to a healthy GPU.",
    "node_unreachable": "The machine your slice runs on stopped answering. You are not "
    "charged while it is down.",
}


def tenant_text(incident: Incident) -> str:
    """What happened to the tenant's slice, in plain words, and what to change."""
    advice = TENANT_ADVICE.get(incident.rule, "")
    return f"{incident.title}.\n\n{advice}".strip()
