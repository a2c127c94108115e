"""Incident notifications: email to ops (and to the tenant, for incidents about their
slices), and signed webhooks, delivered by tasks with retries after commit."""

from __future__ import annotations

import hashlib
import hmac
import http.client
import ipaddress
import json
import socket
import ssl
import time
import urllib.parse
from typing import Any

from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.mail import send_mail
from django.db.models import Q
from django.utils import timezone

from gpuplatform.dispatch import enqueue
from tenants.services import members_notify_send

from . import rules
from .models import Incident, IncidentEvent, WebhookDelivery, WebhookEndpoint

SIGNATURE_HEADER = "X-Gpuplatform-Signature"
TIMESTAMP_HEADER = "X-Gpuplatform-Timestamp"
WEBHOOK_TIMEOUT_S = 10


def incident_notify(*, incident: Incident, event: str) -> None:
    """Queue the notifications for an incident event (after commit)."""
    enqueue("incidents.notify_email", incident.pk, event)
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
        enqueue("incidents.deliver_webhook", delivery.pk)


def payload(incident: Incident, event: str, *, for_tenant: bool) -> dict[str, Any]:
    about: dict[str, Any] = {
        "id": incident.pk,
        "rule": incident.rule,
        "title": incident.title,
        "severity": incident.severity,
        "status": incident.status,
        "root_cause": incident.root_cause,
        "slice": incident.slice_id,
        "first_seen_at": incident.first_seen_at.isoformat(),
        "last_seen_at": incident.last_seen_at.isoformat(),
    }
    if event == "resolved":
        about["resolution_note"] = incident.resolution_note
    if event == "action":
        about["action"] = _last_action(incident)
    if not for_tenant:  # ops see where; a tenant sees only their own slice
        about.update(tenant=incident.tenant_id, node=incident.node_id, gpu=incident.gpu_id)
    return {"event": f"incident.{event}", "incident": about}


def sign(secret: str, timestamp: str, body: bytes) -> str:
    """HMAC-SHA256 over "<timestamp>.<body>", hex: receivers check it and the age."""
    mac = hmac.new(secret.encode(), timestamp.encode() + b"." + body, hashlib.sha256)
    return "sha256=" + mac.hexdigest()


class HTTPStatusError(Exception):
    """The endpoint answered, but not with 2xx (a redirect included: never followed)."""

    def __init__(self, code: int):
        super().__init__(f"HTTP {code}")
        self.code = code


class _PinnedHTTPS(http.client.HTTPSConnection):
    """TLS to `ip`, with the certificate checked against the URL's host name."""

    def __init__(
        self, host: str, port: int, ip: str, *, timeout: float, context: ssl.SSLContext
    ) -> None:
        super().__init__(host, port, timeout=timeout, context=context)
        self._ip = ip

    def connect(self) -> None:
        sock = socket.create_connection((self._ip, self.port), self.timeout)
        self.sock = self._context.wrap_socket(sock, server_hostname=self.host)  # type: ignore[attr-defined]


def _post(url: str, body: bytes, headers: dict[str, str], *, public_only: bool) -> int:
    """POST to the address the name resolved to once, checked once: a name re-pointed
    between the check and the connection (DNS rebinding) cannot reach anything else."""
    parts = urllib.parse.urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError("the webhook URL must be http(s)")
    host = parts.hostname
    port = parts.port or (443 if parts.scheme == "https" else 80)
    try:
        infos = socket.getaddrinfo(host, port, proto=socket.IPPROTO_TCP)
    except socket.gaierror as exc:
        raise ValueError(f"cannot resolve {host}: {exc}") from exc
    addresses = [str(info[4][0]) for info in infos]  # IP addresses: TCP's families only
    if public_only:
        for address in addresses:
            if not ipaddress.ip_address(address).is_global:
                raise ValueError(f"{host} resolves to a non-public address ({address})")
    ip = addresses[0]
    if parts.scheme == "https":
        conn: http.client.HTTPConnection = _PinnedHTTPS(
            host, port, ip, timeout=WEBHOOK_TIMEOUT_S, context=ssl.create_default_context()
        )
    else:
        conn = http.client.HTTPConnection(ip, port, timeout=WEBHOOK_TIMEOUT_S)
    path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    try:
        conn.request(
            "POST", path, body=body, headers={**headers, "Host": parts.netloc.split("@")[-1]}
        )
        response = conn.getresponse()
        response.read(64 * 1024)
        status = response.status
    finally:
        conn.close()
    if not 200 <= status < 300:
        raise HTTPStatusError(status)
    return status


class DeliveryFailed(Exception):
    """The endpoint did not take the webhook; the task retries."""


def webhook_deliver(*, delivery_id: int, final_attempt: bool) -> str:
    delivery = WebhookDelivery.objects.select_related("endpoint").get(pk=delivery_id)
    if delivery.status == WebhookDelivery.Status.DELIVERED:
        return delivery.status
    body = json.dumps(delivery.payload, sort_keys=True).encode()
    timestamp = str(int(time.time()))
    headers = {
        "Content-Type": "application/json",
        "User-Agent": "gpuplatform-webhooks/1",
        TIMESTAMP_HEADER: timestamp,
        SIGNATURE_HEADER: sign(delivery.endpoint.secret, timestamp, body),
    }
    delivery.attempts += 1
    public_only = delivery.endpoint.tenant_id is not None and not settings.WEBHOOKS_ALLOW_PRIVATE
    try:
        delivery.response_status = _post(
            delivery.endpoint.url, body, headers, public_only=public_only
        )
        delivery.status = WebhookDelivery.Status.DELIVERED
        delivery.delivered_at = timezone.now()
        delivery.last_error = ""
    except (HTTPStatusError, OSError, ValueError, http.client.HTTPException) as exc:
        code = getattr(exc, "code", None)
        delivery.response_status = code if isinstance(code, int) else None
        delivery.last_error = str(exc)[:500]
        if final_attempt:
            delivery.status = WebhookDelivery.Status.FAILED
    delivery.save()
    if delivery.status == WebhookDelivery.Status.PENDING:
        raise DeliveryFailed(delivery.last_error)
    return delivery.status


# What each event is, in a mail's subject.
EVENT_SUBJECTS = {
    "opened": "{severity}: {title}",
    "escalated": "escalated to {severity}: {title}",
    "action": "action taken: {action}",
    "resolved": "resolved: {title}",
    "reopened": "reopened: {title}",
}
# Rules whose tenant mails the watchdog's own actions send (the idle warning carries the
# time left): the generic "opened" mail would only repeat them.
TOLD_BY_ACTION = frozenset({"idle_slice"})


def _last_action(incident: Incident) -> str:
    message = (
        incident.events.filter(kind=IncidentEvent.Kind.DISPOSED)
        .order_by("-at", "-pk")
        .values_list("message", flat=True)
        .first()
    )
    return message or incident.title


def _was_disposed(incident: Incident) -> bool:
    return incident.events.filter(kind=IncidentEvent.Kind.DISPOSED).exists()


def tenant_hears(incident: Incident, event: str) -> bool:
    """Whether the slice's tenant gets a mail for this event: the alarm (unless an
    action of the watchdog tells them itself), and the end when nothing had to be done to
    their slice (a stop already sent its own mail). Escalations, actions and reopenings
    are the watchdog's and ops' business; what it does to a slice is told as it does it."""
    if not (incident.tenant_id and incident.slice_id) or incident.rule in rules.OPS_ONLY:
        return False
    if event == "opened":
        return incident.rule not in TOLD_BY_ACTION
    if event == "resolved":
        return not _was_disposed(incident)
    return False


def email_send(*, incident_id: int, event: str) -> int:
    """Mail an incident event: to ops (every event; resolutions by setting) and to the
    slice's tenant where `tenant_hears`, each saying which event this is."""
    incident = Incident.objects.select_related("tenant", "slice").get(pk=incident_id)
    sent = 0
    ops = list(
        get_user_model()
        .objects.filter(is_staff=True, is_active=True)
        .exclude(email="")
        .values_list("email", flat=True)
    )
    if event == "resolved" and not settings.INCIDENTS_MAIL_OPS_RESOLVED:
        ops = []
    template = EVENT_SUBJECTS.get(event, "{severity}: {title}")
    action = _last_action(incident) if event == "action" else ""
    what = template.format(severity=incident.severity, title=incident.title, action=action)
    link = f"{settings.SITE_URL}/ops/incidents/{incident.pk}/"
    if ops:
        lines = [f"Incident {incident.pk}, {event}: {incident.title}", ""]
        if event == "action":
            lines.append(action)
        elif event == "resolved":
            lines.append(f"Resolved: {incident.resolution_note or 'the condition cleared'}")
        lines += [
            f"Rule: {incident.rule}",
            f"Class: {incident.get_root_cause_display()}",
            f"Status: {incident.get_status_display()}",
            "",
            link,
        ]
        send_mail(
            f"[gpuplatform] {what}"[:150],
            "\n".join(lines),
            settings.DEFAULT_FROM_EMAIL,
            ops,
        )
        sent += len(ops)
    if incident.tenant_id is not None and tenant_hears(incident, event):
        if event == "resolved":
            subject = f"Resolved for your slice {incident.slice_id}: {incident.title}"
        else:
            subject = f"About your slice {incident.slice_id}: {incident.title}"
        sent += members_notify_send(
            tenant_id=incident.tenant_id,
            subject=subject[:150],
            body=tenant_text(incident, event),
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
    "neighbour_harm": "Another job on the same GPU held more memory than its own quota, so "
    "for a moment the card had less free memory than your slice's unused quota: an "
    "allocation inside your quota could fail meanwhile. The platform stops such a job on "
    "its node within about a second; your slice kept running, and nothing is needed from you.",
    "slice_preempted": "Your interruptible slice was preempted: its GPU ran short of memory, "
    "or a full-price launch needed its room. It was stopped after its notice or grace period "
    "to checkpoint, billed to the stop. Its volumes and unused minutes are kept: resume it "
    "when you like, or use guaranteed hours for work that must not stop.",
}
# What the tenant is told when the alarm opens, where it differs from what happened in
# the end (a breach gets a sample of grace before the stop).
TENANT_OPENED = {
    "quota_breach": "Your job holds more GPU memory than your tier. If it is still over at "
    "the next sample it is stopped, so the other tenants on the card keep theirs. Lower the "
    "batch size or context length, load the model quantized, or buy a bigger tier.",
}


# Incidents a tenant sees because they touched its slice: the title names no node or GPU.
TENANT_TITLES = {
    "node_unreachable": "The machine your slice runs on stopped answering",
    "hardware_fault": "The GPU your slice runs on reported a hardware fault",
}


def tenant_title(incident: Incident) -> str:
    return TENANT_TITLES.get(incident.rule, incident.title)


def tenant_slices(incident: Incident, tenant_id: int) -> list[int]:
    """The tenant's slices the incident is about, or touched."""
    if incident.slice_id and incident.tenant_id == tenant_id:
        return [incident.slice_id]
    return sorted(t.slice_id for t in incident.touched.all() if t.tenant_id == tenant_id)


def tenant_text(incident: Incident, event: str = "opened") -> str:
    """What happened to the tenant's slice, in plain words, and what to change."""
    if event == "resolved":
        note = incident.resolution_note or "the condition cleared"
        return f"{incident.title}: resolved ({note}). Nothing was done to your slice."
    # the alarm's words while it is open; once resolved, what happened
    over = incident.status == Incident.Status.RESOLVED
    advice = (None if over else TENANT_OPENED.get(incident.rule)) or TENANT_ADVICE.get(
        incident.rule, ""
    )
    if incident.status == Incident.Status.RESOLVED and incident.rule in TENANT_TITLES:
        advice += " It is over now."
    return f"{tenant_title(incident)}.\n\n{advice}".strip()
