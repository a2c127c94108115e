"""Schemathesis hooks for tests/test_api_fuzz.py (loaded by the CLI through
SCHEMATHESIS_HOOKS): whatever the fuzzer generates, a node or webhook it creates or
updates points at loopback, on a port where nothing listens, so the platform it drives
(discovery over SSH, webhook deliveries) never reaches beyond this machine. Every body
sent to those operations is logged to FUZZ_TARGETS_LOG, so the test can prove it."""

from __future__ import annotations

import json
import os

import schemathesis

PORT = int(os.environ.get("FUZZ_LOOPBACK_PORT", "9"))
LOG = os.environ.get("FUZZ_TARGETS_LOG")
TARGETS = ("/api/v1/nodes/", "/api/v1/webhooks/")


@schemathesis.hook
def before_call(context, case, kwargs):  # type: ignore[no-untyped-def]
    path = case.operation.path
    if not path.startswith(TARGETS) or case.method.upper() not in ("POST", "PUT", "PATCH"):
        return
    body = case.body
    if isinstance(body, dict):
        if isinstance(body.get("address"), str):
            body["address"] = "127.0.0.1"
        if "port" in body and isinstance(body["port"], int):
            body["port"] = PORT
        if isinstance(body.get("url"), str):
            body["url"] = f"http://127.0.0.1:{PORT}/hook"
    if LOG:
        with open(LOG, "a") as f:
            f.write(json.dumps({"path": path, "body": body}, default=repr) + "\n")
