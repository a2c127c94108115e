"""The demo's Jupyter template against the node lab: launched as a renter would, it runs
JupyterLab as the image's ordinary user with the slice's own token, and through the
platform's SSH gateway (`ssh -L`: nsenter into the container's network namespace on the
node, nothing published) a kernel made over Jupyter's REST API runs a cell over its
channels WebSocket. Without the token, or from another origin, Jupyter refuses."""

from __future__ import annotations

import asyncio
import io
import json
import socket
import subprocess
import time
import urllib.error
import urllib.request
import uuid

import aiohttp
import pytest
from django.core.management import call_command

from emulator.catalog import GpuSpec
from nodelab import JUPYTER_PORT, LabNodeSpec
from tenants import services
from tenants.launch_request import LaunchRequest
from tenants.models import Image, LaunchTemplate, Slice
from tests.gateway.support import client_key, ssh_argv
from tests.worker_harness import wait_for

pytestmark = [pytest.mark.lab, pytest.mark.django_db(transaction=True)]

JUPYTER_NODE = LabNodeSpec("lab-jupyter", (GpuSpec("NVIDIA A30"),), jupyter=True)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def http(url: str, *, token: str = "", method: str = "GET", body: bytes | None = None):
    """(status, body, the cookies it sets as a Cookie header) of one request; Jupyter's
    token, when given, in its header."""
    headers = {"Authorization": f"token {token}"} if token else {}
    request = urllib.request.Request(url, data=body, method=method, headers=headers)  # noqa: S310
    try:
        with urllib.request.urlopen(request, timeout=10) as answer:  # noqa: S310
            cookies = [c.split(";", 1)[0] for c in answer.headers.get_all("Set-Cookie") or []]
            return answer.status, answer.read().decode(), "; ".join(cookies)
    except urllib.error.HTTPError as refused:
        return refused.code, refused.read().decode(errors="replace"), ""
    except OSError as exc:  # not listening yet: the relay closes the stream
        return 0, str(exc), ""


async def run_cell(base: str, kernel: str, cookie: str, code: str, origin: str) -> str:
    """The cell's stdout, over the kernel's channels WebSocket (Jupyter's JSON messages),
    as a browser signed in with `cookie` sends it from a page of `origin`."""
    session = uuid.uuid4().hex
    msg_id = uuid.uuid4().hex
    url = f"ws{base[4:]}/api/kernels/{kernel}/channels?session_id={session}"
    headers = {"Cookie": cookie, "Origin": origin}
    request = {
        "header": {"msg_id": msg_id, "msg_type": "execute_request", "session": session,
                   "username": "test", "version": "5.3"},
        "parent_header": {}, "metadata": {}, "channel": "shell", "buffers": [],
        "content": {"code": code, "silent": False, "store_history": False,
                    "user_expressions": {}, "allow_stdin": False, "stop_on_error": True},
    }  # fmt: skip
    out = []
    async with (
        aiohttp.ClientSession() as client,
        client.ws_connect(url, headers=headers, timeout=aiohttp.ClientWSTimeout(60)) as ws,
    ):
        await ws.send_str(json.dumps(request))
        async with asyncio.timeout(60):
            async for frame in ws:
                msg = json.loads(frame.data)
                if msg.get("parent_header", {}).get("msg_id") != msg_id:
                    continue
                kind, content = msg["msg_type"], msg["content"]
                if kind == "stream":
                    out.append(content["text"])
                elif kind == "error":
                    raise AssertionError(content)
                elif kind == "status" and content["execution_state"] == "idle":
                    return "".join(out)
    raise AssertionError("the channel closed before the cell ended")


def test_the_demos_jupyter_template_runs_a_cell_through_the_gateway_with_the_slices_token(
    eager, lab_fleet, funded, owner_a, gateway, settings, tmp_path
):
    fleet = lab_fleet([JUPYTER_NODE])
    settings.VAR_DIR = tmp_path  # the demo's logins file goes there
    call_command("seed_demo", stdout=io.StringIO())
    template = LaunchTemplate.objects.get(name="Jupyter")
    assert template.image.connect == Image.Connect.JUPYTER
    launched = services.slice_launch_request(
        membership=owner_a,
        request=LaunchRequest(purchase=funded(owner_a, vram_gb=4), template=template),
    )
    s = launched.slice
    s.refresh_from_db()
    assert s.state == Slice.State.RUNNING, s.state_reason
    token = s.connection["token"]
    assert len(token) >= 32
    started = time.monotonic()

    key, line = client_key(tmp_path)
    services.ssh_key_add(user=owner_a.user, name="laptop", public_key=line)
    local = free_port()
    forward = subprocess.Popen(  # noqa: S603
        ssh_argv(
            gateway, key, tmp_path, "-N", "-L", f"127.0.0.1:{local}:slice-{s.pk}:{JUPYTER_PORT}"
        ),
        stderr=subprocess.PIPE,
    )
    base = f"http://127.0.0.1:{local}"
    try:
        assert wait_for(lambda: http(f"{base}/api/status", token=token)[0] == 200, timeout=30), (
            http(f"{base}/api/status", token=token),
            fleet.nodes[0].logs(s.container_id),
        )
        # the page the slice's Open Jupyter button hands the browser to: it signs the
        # browser in with a cookie of Jupyter's own, which the page's WebSockets then carry
        status, page, cookie = http(f"{base}/lab?token={token}")
        assert status == 200 and "JupyterLab" in page and cookie
        # no token, or another's: refused
        assert http(f"{base}/api/status")[0] in (401, 403)
        assert http(f"{base}/api/kernels", token="not-" + token)[0] in (401, 403)

        status, body, _ = http(f"{base}/api/kernels", token=token, method="POST", body=b"{}")
        assert status == 201, body
        kernel = json.loads(body)["id"]
        origin = base  # the page's, as the platform's proxy forwards it with its Host
        assert asyncio.run(run_cell(base, kernel, cookie, "print(6*7)", origin)) == "42\n"
        uid = "import os; print(os.getuid(), os.environ['HOME'])"
        assert asyncio.run(run_cell(base, kernel, cookie, uid, origin)) == "1000 /home/renter\n"
        # Jupyter's own same-origin check (no allow_origin): a page elsewhere that the
        # browser sends the cookie from cannot drive the kernel
        with pytest.raises(aiohttp.WSServerHandshakeError) as cross:
            asyncio.run(run_cell(base, kernel, cookie, "print(1)", "https://elsewhere.example"))
        assert cross.value.status == 403
    finally:
        forward.terminate()
        forward.wait(10)
    assert time.monotonic() - started < 60
    # the token is the slice's: never in the container's log, which viewers read
    assert token not in fleet.nodes[0].logs(s.container_id)
