"""Schemathesis hooks for tests/test_api_fuzz.py (loaded by the CLI through
SCHEMATHESIS_HOOKS): whatever the fuzzer generates, a node or webhook it creates or
updates points at loopback, on a port where nothing listens, so the platform it drives
(discovery over SSH, webhook deliveries) never reaches beyond this machine. What went on
the wire to those operations (the request's own bytes, with the answer's status) is logged
to FUZZ_TARGETS_LOG, so the test can prove it from what was sent."""

from __future__ import annotations

import json
import os

import schemathesis

PORT = int(os.environ.get("FUZZ_LOOPBACK_PORT", "9"))
LOG = os.environ.get("FUZZ_TARGETS_LOG")
TARGETS = ("/api/v1/nodes/", "/api/v1/webhooks/")
WRITES = ("POST", "PUT", "PATCH")


@schemathesis.hook
def before_call(context, case, kwargs):
    path = case.operation.path
    if not path.startswith(TARGETS) or case.method.upper() not in WRITES:
        return
    body = case.body
    if isinstance(body, dict):
        if isinstance(body.get("address"), str):
            body["address"] = "127.0.0.1"
        if "port" in body and isinstance(body["port"], int):
            body["port"] = PORT
        if isinstance(body.get("url"), str):
            body["url"] = f"http://127.0.0.1:{PORT}/hook"


@schemathesis.hook
def after_call(context, case, response):
    path = case.operation.path
    if not LOG or not path.startswith(TARGETS) or case.method.upper() not in WRITES:
        return
    sent = response.request.body or b""
    if isinstance(sent, str):
        sent = sent.encode()
    record = {"path": path, "status": response.status_code, "sent": sent.decode("latin-1")}
    with open(LOG, "a") as f:
        f.write(json.dumps(record) + "\n")
