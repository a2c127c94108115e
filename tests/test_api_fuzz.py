"""Schema-driven fuzz of the whole API: schemathesis (its CLI, fixed seed, a time budget)
against the live test server, once with a tenant owner's token and once with an ops
token. No answer may be a 5xx, every answer must match the published schema, and every
status answered must be one the schema documents for that operation. Nodes
and webhooks the fuzzer creates or updates only ever point at loopback (tests/fuzz_hooks.py
rewrites them; the database and the hook's log prove it), and Celery runs eagerly, so
discovery and deliveries happen here, against a closed loopback port."""

from __future__ import annotations

import ipaddress
import json
import os
import socket
import subprocess
import sys
from pathlib import Path
from urllib.parse import urlsplit

import pytest
from django.utils import timezone

from incidents import services as incident_services
from incidents.models import Incident, WebhookEndpoint
from nodes import services as node_services
from nodes import ssh
from nodes.models import Node
from tests.factories import make_token

pytestmark = pytest.mark.django_db(transaction=True)

ROOT = Path(__file__).resolve().parents[1]
SCHEMATHESIS = Path(sys.executable).with_name("schemathesis")
SEED = 20261201
BUDGET_S = int(os.environ.get("FUZZ_BUDGET_S", "30"))  # per token


def closed_loopback_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def is_loopback(host: str) -> bool:
    host = host.strip("[]").rstrip(".").lower()
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def fuzz(url: str, token: str, tmp_path: Path, port: int, name: str) -> tuple[int, str, Path]:
    log = tmp_path / f"{name}-targets.jsonl"
    env = {
        **os.environ,
        "SCHEMATHESIS_HOOKS": "tests.fuzz_hooks",
        "PYTHONPATH": str(ROOT),
        "FUZZ_LOOPBACK_PORT": str(port),
        "FUZZ_TARGETS_LOG": str(log),
        "NO_COLOR": "1",
    }
    result = subprocess.run(  # noqa: S603
        [
            str(SCHEMATHESIS),
            "run",
            f"{url}/api/v1/schema/",
            "--header",
            f"Authorization: Bearer {token}",
            "--checks",
            "not_a_server_error,response_schema_conformance,status_code_conformance",
            "--seed",
            str(SEED),
            "--max-time",
            str(BUDGET_S),
            "--workers",
            "1",
            "--request-timeout",
            "30",
            "--no-shrink",
            "--output-truncate",
            "false",
            "--report-dir",
            str(tmp_path / name),
        ],
        cwd=tmp_path,  # its crash cache stays out of the checkout and out of the next run
        env=env,
        capture_output=True,
        text=True,
        timeout=BUDGET_S * 4 + 120,
    )
    return result.returncode, result.stdout + result.stderr, log


def answers_of_every_shape(tenant, ops_user) -> None:
    """Rows whose answers hold what a fresh database has none of, so that the fuzz's first
    reads already meet them: nulls (an incident nobody acknowledged or resolved, one
    reopened, a fleet-wide policy change with no node) and the tenant's own shape of an
    incident."""
    now = timezone.now()
    for n, status in enumerate(("open", "resolved")):
        incident = Incident.objects.create(
            rule="quota_breach", target_key=f"fuzz:{n}", title="Slice over its VRAM quota",
            severity="critical", root_cause="app_parameters", tenant=tenant,
            first_seen_at=now, last_seen_at=now,
        )  # fmt: skip
        if status == "resolved":
            incident_services.incident_resolve(incident=incident, actor=ops_user, note="fixed")
            incident_services.incident_reopen(incident=incident, actor=ops_user, note="again")
    node_services.preflight_policy_update(
        actor=ops_user, reason="fleet-wide", require_userns_remap=True
    )


def test_the_api_survives_schema_driven_fuzzing(
    live_server, eager, settings, tmp_path, owner_a, ops_user
):
    settings.NODES_SSH_KEY_PATH = str(tmp_path / "ssh" / "id_ed25519")
    settings.NODES_SSH_CONNECT_TIMEOUT = 2
    # rate limits have their own tests; here they would only turn the fuzz into 429s
    # (and the counts live in Redis, from one run to the next)
    rates = settings.REST_FRAMEWORK["DEFAULT_THROTTLE_RATES"]
    settings.REST_FRAMEWORK = {
        **settings.REST_FRAMEWORK,
        "DEFAULT_THROTTLE_RATES": dict.fromkeys(rates, "100000/min"),
    }
    ssh.reset_pool()
    answers_of_every_shape(owner_a.tenant, ops_user)
    port = closed_loopback_port()
    _, tenant_token = make_token(owner_a.user)
    _, ops_token = make_token(ops_user)

    logs = []
    for name, token in (("tenant", tenant_token), ("ops", ops_token)):
        code, output, log = fuzz(live_server.url, token, tmp_path, port, name)
        assert code == 0, output[-20000:]
        assert "Server error" not in output, output[-20000:]
        logs.append(log)

    # what went on the wire to node and webhook writes: every address and URL in a JSON
    # body is loopback
    sent = [
        json.loads(line) for log in logs if log.exists() for line in log.read_text().splitlines()
    ]
    assert any(s["path"].startswith("/api/v1/nodes/") for s in sent)
    assert any(s["path"].startswith("/api/v1/webhooks/") for s in sent)
    for s in sent:
        try:
            body = json.loads(s["sent"])
        except ValueError:
            continue  # not JSON: the API refuses it before reading any field
        if isinstance(body, dict):
            if isinstance(body.get("address"), str):
                assert is_loopback(body["address"]), s
            if isinstance(body.get("url"), str):
                assert is_loopback(urlsplit(body["url"]).hostname or ""), s
    # Which random writes a time budget gets accepted varies from run to run (a node's or a
    # webhook's other fields must be valid too), so acceptance is not asserted; whatever was
    # stored is checked below.
    for node in Node.objects.all():
        assert is_loopback(node.address), node.address
    for endpoint in WebhookEndpoint.objects.all():
        assert is_loopback(urlsplit(endpoint.url).hostname or ""), endpoint.url
    ssh.reset_pool()
