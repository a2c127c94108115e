"""Incident notifications: signed webhooks to a real HTTP receiver on loopback, retries,
and email to ops and to the tenant whose slice it was, never to a neighbour.

Incidents are recorded the watchdog's way (services.findings_apply with a rules.Finding);
notifications are queued after commit and run here by Celery's eager mode, or by calling
the notify functions the tasks call."""

import hashlib
import hmac
import json
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from django.core import mail
from django.utils import timezone

from gpuplatform.celery import app
from incidents import notify, rules, services, tasks
from incidents.models import Incident, WebhookDelivery, WebhookEndpoint
from nodes.models import Gpu, Node
from tenants import services as tenant_services
from tests.incidents.support import running_slice

pytestmark = pytest.mark.django_db

CID_A = "a" * 64
CID_B = "b" * 64
ADVICE = "Lower the batch size or context length"


class Receiver:
    """A webhook receiver on 127.0.0.1 (random port): records each POST and answers
    with the status set for its path (200 unless told)."""

    def __init__(self) -> None:
        self.requests: list[dict] = []
        self.answers: dict[str, int] = {}
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - http.server's name
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                receiver.requests.append(
                    {"path": self.path, "headers": dict(self.headers), "body": body}
                )
                code = receiver.answers.get(self.path, 200)
                self.send_response(code)
                if code in (301, 302, 307, 308):  # would send the platform elsewhere
                    self.send_header("Location", "http://169.254.169.254/latest/meta-data/")
                self.send_header("Content-Length", "2")
                self.end_headers()
                self.wfile.write(b"ok")

            def log_message(self, *args) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.server.server_port}{path}"

    def paths(self) -> list[str]:
        return sorted(r["path"] for r in self.requests)

    def to(self, path: str) -> list[dict]:
        return [r for r in self.requests if r["path"] == path]

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def receiver(monkeypatch, settings):
    settings.WEBHOOKS_ALLOW_PRIVATE = True  # the receiver is on loopback
    monkeypatch.setenv("NO_PROXY", "127.0.0.1")  # urllib must not go through a proxy
    monkeypatch.setenv("no_proxy", "127.0.0.1")
    server = Receiver()
    yield server
    server.stop()


@pytest.fixture
def eager():
    app.conf.task_always_eager = True
    yield
    app.conf.task_always_eager = False


@pytest.fixture
def gpu():
    node = Node.objects.create(
        gate_status="passed", name="w1", address="10.8.0.1", status="active", host_key="k"
    )
    return Gpu.objects.create(
        node=node, uuid="GPU-w1-0-where", index=0, model="A30", vram_total_mb=24576
    )


def breach(s, gpu) -> rules.Finding:
    """The first sample over quota: recorded, no action yet (one sample of grace)."""
    return rules.Finding(
        rule="quota_breach",
        target=f"slice:{s.pk}",
        severity=rules.CRITICAL,
        root_cause=rules.APP_PARAMETERS,
        title=f"Slice {s.pk} over its VRAM quota",
        gpu_id=gpu.pk,
        node_id=gpu.node_id,
        slice_id=s.pk,
        tenant_id=s.tenant_id,
        evidence={"pid": 4242, "used_mb": 9000, "quota_mb": 8192},
    )


@pytest.fixture
def endpoints(receiver, owner_a, owner_b):
    def make(tenant, path, *, active=True):
        return WebhookEndpoint.objects.create(
            tenant=tenant, url=receiver.url(path), secret=f"secret-{path}", is_active=active
        )

    return {
        "ops": make(None, "/ops"),
        "a": make(owner_a.tenant, "/a"),
        "a-off": make(owner_a.tenant, "/a-off", active=False),
        "b": make(owner_b.tenant, "/b"),
    }


def expected_signature(secret: str, timestamp: str, body: bytes) -> str:
    # computed here, not with notify.sign: this is what a receiver does
    return (
        "sha256="
        + hmac.new(secret.encode(), f"{timestamp}.".encode() + body, hashlib.sha256).hexdigest()
    )


def verify(request: dict, secret: str) -> dict:
    """Check a received webhook as a receiver would; return its JSON body."""
    headers = request["headers"]
    timestamp = headers["X-Gpuplatform-Timestamp"]
    assert abs(int(timestamp) - time.time()) < 60
    assert hmac.compare_digest(
        headers["X-Gpuplatform-Signature"], expected_signature(secret, timestamp, request["body"])
    )
    assert headers["Content-Type"] == "application/json"
    # a signature made with another secret does not pass
    assert headers["X-Gpuplatform-Signature"] != expected_signature(
        "someone-else", timestamp, request["body"]
    )
    return json.loads(request["body"])


# --- who is told -------------------------------------------------------------------------------


def test_an_incident_about_a_slice_reaches_ops_and_that_tenant_only(
    gpu, owner_a, owner_b, ops_user, endpoints, receiver, eager, django_capture_on_commit_callbacks
):
    slice_a = running_slice(owner_a, gpu, CID_A)
    running_slice(owner_b, gpu, CID_B)  # the neighbour on the same card
    with django_capture_on_commit_callbacks(execute=True):
        services.findings_apply(
            findings=[breach(slice_a, gpu)], now=timezone.now(), gpus={gpu.pk: gpu}
        )
    incident = Incident.objects.get(rule="quota_breach")

    assert receiver.paths() == ["/a", "/ops"]  # not B's, not A's inactive one
    ops_body = verify(receiver.to("/ops")[0], "secret-/ops")
    tenant_body = verify(receiver.to("/a")[0], "secret-/a")
    for body in (ops_body, tenant_body):
        assert body["event"] == "incident.opened"
        assert body["incident"]["id"] == incident.pk
        assert body["incident"]["slice"] == slice_a.pk
        assert body["incident"]["severity"] == "critical"
    assert ops_body["incident"]["tenant"] == owner_a.tenant_id
    assert ops_body["incident"]["node"] == gpu.node_id and ops_body["incident"]["gpu"] == gpu.pk
    assert not {"tenant", "node", "gpu"} & set(tenant_body["incident"])
    assert "GPU-w1-0-where" not in receiver.to("/a")[0]["body"].decode()

    deliveries = WebhookDelivery.objects.filter(incident=incident)
    assert {d.endpoint_id for d in deliveries} == {endpoints["ops"].pk, endpoints["a"].pk}
    for d in deliveries:
        assert (d.status, d.attempts, d.response_status) == ("delivered", 1, 200)
        assert d.delivered_at is not None and d.last_error == ""

    # email: ops get the incident, tenant A's owner gets it in plain words, B nobody
    recipients = [address for message in mail.outbox for address in message.to]
    assert sorted(recipients) == sorted([ops_user.email, owner_a.user.email])
    assert owner_b.user.email not in recipients
    to_ops = next(m for m in mail.outbox if ops_user.email in m.to)
    assert f"/ops/incidents/{incident.pk}/" in to_ops.body and "quota_breach" in to_ops.body
    to_tenant = next(m for m in mail.outbox if owner_a.user.email in m.to)
    assert to_tenant.body == notify.tenant_text(incident)
    assert ADVICE in to_tenant.body and f"slice {slice_a.pk}" in to_tenant.subject
    assert "w1" not in to_tenant.body and "GPU-w1-0-where" not in to_tenant.body


def test_an_incident_about_no_tenant_reaches_ops_only(
    gpu, owner_a, ops_user, endpoints, receiver, eager, django_capture_on_commit_callbacks
):
    running_slice(owner_a, gpu, CID_A)  # a tenant on the card is not about this incident
    card = rules.Finding(
        rule="vram_high",
        target=f"gpu:{gpu.uuid}",
        severity=rules.WARNING,
        root_cause=rules.NO_ISOLATION,
        title="GPU VRAM at 88%",
        gpu_id=gpu.pk,
        node_id=gpu.node_id,
    )
    with django_capture_on_commit_callbacks(execute=True):
        services.findings_apply(findings=[card], now=timezone.now(), gpus={gpu.pk: gpu})
    assert receiver.paths() == ["/ops"]
    assert verify(receiver.requests[0], "secret-/ops")["incident"]["gpu"] == gpu.pk
    assert [m.to for m in mail.outbox] == [[ops_user.email]]


def test_email_send_directly_tells_ops_and_the_tenant_owner_only(
    gpu, owner_a, owner_b, ops_user, django_capture_on_commit_callbacks
):
    slice_a = running_slice(owner_a, gpu, CID_A)
    with django_capture_on_commit_callbacks(execute=False) as queued:
        services.findings_apply(
            findings=[breach(slice_a, gpu)], now=timezone.now(), gpus={gpu.pk: gpu}
        )
    assert queued and mail.outbox == []  # nothing sent before commit
    incident = Incident.objects.get(rule="quota_breach")
    sent = notify.email_send(incident_id=incident.pk, event="opened")
    assert sent == 2 and len(mail.outbox) == 2
    assert owner_b.user.email not in str([m.to for m in mail.outbox])
    plain = next(m for m in mail.outbox if m.to == [owner_a.user.email]).body
    assert plain.startswith(f"Slice {slice_a.pk} over its VRAM quota.") and ADVICE in plain


# --- failures and retries -------------------------------------------------------------------


def _one_delivery(gpu, owner_a, endpoints, capture) -> WebhookDelivery:
    slice_a = running_slice(owner_a, gpu, CID_A)
    with capture(execute=False):  # queued, not run: the test runs the deliveries
        services.findings_apply(
            findings=[breach(slice_a, gpu)], now=timezone.now(), gpus={gpu.pk: gpu}
        )
    return WebhookDelivery.objects.get(endpoint=endpoints["a"])


def test_a_receiver_error_keeps_the_delivery_pending_then_fails_it_on_the_last_attempt(
    gpu, owner_a, endpoints, receiver, django_capture_on_commit_callbacks
):
    receiver.answers["/a"] = 500
    delivery = _one_delivery(gpu, owner_a, endpoints, django_capture_on_commit_callbacks)
    assert (delivery.status, delivery.attempts) == ("pending", 0)

    with pytest.raises(notify.DeliveryFailed):
        notify.webhook_deliver(delivery_id=delivery.pk, final_attempt=False)
    delivery.refresh_from_db()
    assert (delivery.status, delivery.attempts, delivery.response_status) == ("pending", 1, 500)
    assert "500" in delivery.last_error and delivery.delivered_at is None

    assert notify.webhook_deliver(delivery_id=delivery.pk, final_attempt=True) == "failed"
    delivery.refresh_from_db()
    assert (delivery.status, delivery.attempts, delivery.response_status) == ("failed", 2, 500)
    assert len(receiver.to("/a")) == 2
    # each attempt was signed afresh and correctly
    for request in receiver.to("/a"):
        verify(request, "secret-/a")


def test_an_unreachable_receiver_is_recorded_as_an_error(
    gpu, owner_a, endpoints, receiver, django_capture_on_commit_callbacks
):
    delivery = _one_delivery(gpu, owner_a, endpoints, django_capture_on_commit_callbacks)
    receiver.stop()  # nobody listens on that port any more
    with pytest.raises(notify.DeliveryFailed):
        notify.webhook_deliver(delivery_id=delivery.pk, final_attempt=False)
    delivery.refresh_from_db()
    assert delivery.status == "pending" and delivery.attempts == 1
    assert delivery.response_status is None and delivery.last_error


def test_a_delivered_webhook_is_not_sent_twice(
    gpu, owner_a, endpoints, receiver, django_capture_on_commit_callbacks
):
    receiver.answers["/a"] = 503
    delivery = _one_delivery(gpu, owner_a, endpoints, django_capture_on_commit_callbacks)
    with pytest.raises(notify.DeliveryFailed):
        notify.webhook_deliver(delivery_id=delivery.pk, final_attempt=False)
    receiver.answers["/a"] = 204  # the receiver is back
    assert notify.webhook_deliver(delivery_id=delivery.pk, final_attempt=False) == "delivered"
    # at-least-once delivery of the task: running it again sends nothing
    assert notify.webhook_deliver(delivery_id=delivery.pk, final_attempt=False) == "delivered"
    delivery.refresh_from_db()
    assert (delivery.status, delivery.attempts, delivery.response_status) == ("delivered", 2, 204)
    assert delivery.last_error == "" and len(receiver.to("/a")) == 2


def test_the_webhook_task_retries_until_its_last_attempt(
    gpu, owner_a, endpoints, receiver, django_capture_on_commit_callbacks
):
    receiver.answers["/a"] = 500
    delivery = _one_delivery(gpu, owner_a, endpoints, django_capture_on_commit_callbacks)
    tasks.deliver_webhook.apply(args=[delivery.pk])  # eager: retries run at once
    delivery.refresh_from_db()
    attempts = tasks.WEBHOOK_RETRIES + 1
    assert (delivery.status, delivery.attempts) == ("failed", attempts)
    assert len(receiver.to("/a")) == attempts


def test_a_tenant_webhook_to_a_private_address_is_refused_when_sent(
    gpu, owner_a, endpoints, receiver, settings, django_capture_on_commit_callbacks
):
    settings.WEBHOOKS_ALLOW_PRIVATE = False  # production: the tenant's URL is on loopback
    delivery = _one_delivery(gpu, owner_a, endpoints, django_capture_on_commit_callbacks)
    assert notify.webhook_deliver(delivery_id=delivery.pk, final_attempt=True) == "failed"
    delivery.refresh_from_db()
    assert "non-public address" in delivery.last_error
    assert receiver.to("/a") == []  # nothing was sent


def test_a_redirect_is_a_failed_delivery_not_followed(
    gpu, owner_a, endpoints, receiver, django_capture_on_commit_callbacks
):
    receiver.answers["/a"] = 302
    delivery = _one_delivery(gpu, owner_a, endpoints, django_capture_on_commit_callbacks)
    with pytest.raises(notify.DeliveryFailed):
        notify.webhook_deliver(delivery_id=delivery.pk, final_attempt=False)
    delivery.refresh_from_db()
    assert delivery.status == "pending" and delivery.response_status == 302
    assert len(receiver.to("/a")) == 1


def test_the_name_is_resolved_once_and_the_checked_address_is_the_one_used(
    gpu, owner_a, endpoints, receiver, settings, monkeypatch, django_capture_on_commit_callbacks
):
    """DNS rebinding: the address checked is the address connected to. The tenant's
    host name resolves once (here to loopback, allowed in this test) and the request
    carries the name in its Host header."""
    port = receiver.server.server_port
    WebhookEndpoint.objects.filter(pk=endpoints["a"].pk).update(
        url=f"http://hooks.alpha.test:{port}/a"
    )
    real = socket.getaddrinfo
    lookups = []

    def resolve(host, *args, **kwargs):
        lookups.append(host)
        if host == "hooks.alpha.test":
            return real("127.0.0.1", *args, **kwargs)
        return real(host, *args, **kwargs)

    monkeypatch.setattr(socket, "getaddrinfo", resolve)
    delivery = _one_delivery(gpu, owner_a, endpoints, django_capture_on_commit_callbacks)
    assert notify.webhook_deliver(delivery_id=delivery.pk, final_attempt=True) == "delivered"
    assert lookups.count("hooks.alpha.test") == 1
    (request,) = receiver.to("/a")
    assert request["headers"]["Host"] == f"hooks.alpha.test:{port}"
    verify(request, "secret-/a")

    settings.WEBHOOKS_ALLOW_PRIVATE = False  # production: the same name is refused
    WebhookDelivery.objects.filter(pk=delivery.pk).update(status="pending")
    assert notify.webhook_deliver(delivery_id=delivery.pk, final_attempt=True) == "failed"
    assert len(receiver.to("/a")) == 1


# --- what each mail says ---------------------------------------------------------------------


def test_each_mail_says_which_event_it_is_and_the_end_of_an_alarm_is_no_second_alarm(
    gpu, owner_a, ops_user, endpoints, receiver, eager, django_capture_on_commit_callbacks
):
    card = rules.Finding(
        rule="vram_critical",
        target=f"gpu:{gpu.uuid}",
        severity=rules.CRITICAL,
        root_cause=rules.NO_ISOLATION,
        title="GPU VRAM at 96%: placements stopped",
        gpu_id=gpu.pk,
        node_id=gpu.node_id,
    )
    cleared = rules.Finding(
        rule="vram_critical",
        target=f"gpu:{gpu.uuid}",
        severity=rules.INFO,
        root_cause=rules.NO_ISOLATION,
        title="GPU VRAM back under 85%: placements resume",
        gpu_id=gpu.pk,
        node_id=gpu.node_id,
        resolves=True,
    )
    with django_capture_on_commit_callbacks(execute=True):
        services.findings_apply(findings=[card], now=timezone.now(), gpus={gpu.pk: gpu})
    with django_capture_on_commit_callbacks(execute=True):
        services.findings_apply(findings=[cleared], now=timezone.now(), gpus={gpu.pk: gpu})
    incident = Incident.objects.get(rule="vram_critical")
    with django_capture_on_commit_callbacks(execute=True):
        services.incident_reopen(incident=incident, actor=ops_user, note="still hot")
    subjects = [m.subject for m in mail.outbox]
    assert subjects == [
        "[gpuplatform] critical: GPU VRAM at 96%: placements stopped",
        "[gpuplatform] resolved: GPU VRAM at 96%: placements stopped",
        "[gpuplatform] reopened: GPU VRAM at 96%: placements stopped",
    ]
    assert "Resolved: Condition cleared: GPU VRAM back under 85%" in mail.outbox[1].body
    events = [verify(r, "secret-/ops")["event"] for r in receiver.to("/ops")]
    assert events == ["incident.opened", "incident.resolved", "incident.reopened"]
    resolved = verify(receiver.to("/ops")[1], "secret-/ops")
    assert "back under 85%" in resolved["incident"]["resolution_note"]


def test_a_quota_stop_tells_the_tenant_twice_the_warning_then_the_stop(
    gpu, owner_a, ops_user, eager, django_capture_on_commit_callbacks, monkeypatch
):
    s = running_slice(owner_a, gpu, CID_A)
    # the node part of the stop succeeds (the container goes); the ledger part is real
    monkeypatch.setattr(tenant_services, "slice_finish_stop", lambda **kw: "stopped")
    with django_capture_on_commit_callbacks(execute=True):
        services.findings_apply(findings=[breach(s, gpu)], now=timezone.now(), gpus={gpu.pk: gpu})
    incident = Incident.objects.get(rule="quota_breach")
    with django_capture_on_commit_callbacks(execute=True):
        services.incident_dispose(
            incident_id=incident.pk, action=rules.STOP_SLICE, evidence=incident.evidence
        )
    to_tenant = [m for m in mail.outbox if m.to == [owner_a.user.email]]
    assert [m.subject for m in to_tenant] == [
        f"[gpuplatform] About your slice {s.pk}: Slice {s.pk} over its VRAM quota",
        f"[gpuplatform] Slice {s.pk} was stopped",
    ]
    assert "stopped" in to_tenant[0].body and "next sample" in to_tenant[0].body
    assert "9000 MiB of a 8192 MiB quota" in to_tenant[1].body
    to_ops = [m.subject for m in mail.outbox if m.to == [ops_user.email]]
    assert to_ops[0].startswith("[gpuplatform] critical: Slice")
    assert f"[gpuplatform] action taken: Stopped slice {s.pk}'s container alone" in to_ops[1]
    assert to_ops[2].startswith("[gpuplatform] resolved: Slice")
