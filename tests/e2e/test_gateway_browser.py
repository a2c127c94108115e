"""The slice page's connection commands, copied with their Copy buttons in a real browser
and run with the real OpenSSH client, reach the slice: `ssh -J` and the `~/.ssh/config`
snippet log into the container's own sshd, a forward fetches the image's web service.
Against the node lab (real sshd and Docker Engine, container network `none`)."""

from __future__ import annotations

import shlex
import socket
import subprocess
import urllib.request

import pytest

from nodelab import HTTP_IMAGE, HTTP_PORT, SSH_IMAGE, SSH_PORT, SSH_USER_IN_IMAGE
from tenants import services
from tenants.models import Image
from tenants.selectors import gateway_host_key_fingerprint
from tenants.views.slices import LIVE_SECONDS
from tests.e2e.test_lifecycle_browser import PASSWORD, log_in
from tests.gateway.support import client_config, client_key, running_slice, ssh_run
from tests.worker_harness import wait_for

pytestmark = [
    pytest.mark.browser,
    pytest.mark.lab,
    pytest.mark.django_db(transaction=True),
]


def _copied(page, button: str) -> str:
    """Click a Copy button and read what it put on the clipboard."""
    page.click(button)
    page.wait_for_selector(f"{button}:has-text('Copied')")
    return page.evaluate("navigator.clipboard.readText()")


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _fetch(port: int) -> str:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=5) as answer:  # noqa: S310
            return answer.read().decode()
    except OSError:
        return ""


def test_the_commands_copied_from_the_slice_page_reach_the_slice(
    eager, lab_fleet, funded, owner_a, gateway, page, tmp_path
):
    lab_fleet()
    user = owner_a.user
    user.set_password(PASSWORD)
    user.save()
    key, line = client_key(tmp_path)
    services.ssh_key_add(user=user, name="laptop", public_key=line)
    ssh_image = Image.objects.create(
        name="SSH (lab)",
        reference=SSH_IMAGE,
        ports=[SSH_PORT],
        connect=Image.Connect.SSH,
        ssh_user=SSH_USER_IN_IMAGE,
    )
    http_image = Image.objects.create(
        name="HTTP (lab)", reference=HTTP_IMAGE, ports=[HTTP_PORT], connect="service"
    )
    with_sshd = running_slice(funded, owner_a, ssh_image, public_key=line)
    with_http = running_slice(funded, owner_a, http_image, public_key=line)

    page.context.grant_permissions(["clipboard-read", "clipboard-write"])
    log_in(page, user.email, PASSWORD, f"/slices/{with_sshd.pk}/")
    jump = _copied(page, "button[data-copy='#gateway-jump']")
    page.click("details:has(#gateway-ssh-config) summary")
    # the page polls its live part every LIVE_SECONDS: the open block stays open across it
    page.wait_for_timeout((LIVE_SECONDS * 2 + 1) * 1000)
    assert page.evaluate("document.querySelector('#gateway-ssh-config-details').open")
    snippet = _copied(page, "button[data-copy='#gateway-ssh-config']")
    assert f"KnownHostsCommand /bin/echo slice-{with_sshd.pk} ssh-ed25519 " in snippet
    # the fingerprint the page shows is the gateway's: a renter can check the first login
    shown = page.text_content("main") or ""
    assert gateway_host_key_fingerprint() in shown

    config = client_config(tmp_path, gateway, key)
    run = ssh_run(config, *shlex.split(jump), "id -un")
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip() == SSH_USER_IN_IMAGE
    configured = client_config(tmp_path, gateway, key, snippet)
    run = ssh_run(configured, "ssh", f"slice-{with_sshd.pk}", "cat /etc/hostname")
    assert run.returncode == 0, run.stderr
    assert with_sshd.container_id.startswith(run.stdout.strip())

    page.goto(f"/slices/{with_http.pk}/")
    shown = page.text_content(f"#gateway-forward-{HTTP_PORT}") or ""
    assert f"-L 127.0.0.1:{HTTP_PORT + 10000}:slice-{with_http.pk}:{HTTP_PORT} " in shown
    # a port of the renter's own, typed on the page, rewrites the command and the address
    local = _free_port()
    page.fill(f"#gateway-forward-local-{HTTP_PORT}", str(local))
    assert page.text_content(f"#gateway-forward-url-{HTTP_PORT}") == f"http://127.0.0.1:{local}/"
    forward = _copied(page, f"button[data-copy='#gateway-forward-{HTTP_PORT}']")
    assert f"-L 127.0.0.1:{local}:slice-{with_http.pk}:{HTTP_PORT} " in forward
    argv = shlex.split(forward)
    proc = subprocess.Popen(  # noqa: S603
        [argv[0], "-F", str(config), *argv[1:]], stderr=subprocess.PIPE
    )
    try:
        served = wait_for(lambda: "gpuplatform lab service" in _fetch(local), timeout=20)
        if not served:
            proc.terminate()
            raise AssertionError((proc.communicate(timeout=10)[1] or b"").decode())
    finally:
        proc.terminate()
        proc.wait(10)
