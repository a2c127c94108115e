"""A slice keeps its SSH host key across runs, against the node lab (real sshd and Docker
Engine) with the real OpenSSH client through the gateway: a known_hosts made only from what
the API gives logs in with StrictHostKeyChecking=yes, and again after a stop and a resume,
with no prompt; the key file on the node is root's directory's, the image user's, and goes
with the container. And the page's forward command, on its own port (remote + 10000),
fetches the lab HTTP image's page."""

from __future__ import annotations

import os
import shlex
import stat
import subprocess
import urllib.request
from pathlib import Path

import pytest
from django.conf import settings

from nodelab import HTTP_IMAGE, HTTP_PORT, SSH_USER_IN_IMAGE
from nodes import host_keys, ssh
from tenants import services
from tenants.models import Image, Slice
from tests.gateway.support import client_key, running_slice
from tests.worker_harness import wait_for

pytestmark = [pytest.mark.lab, pytest.mark.django_db(transaction=True)]


def _keyed_slice(tmp_path: Path, funded, owner, image) -> tuple[Path, Slice]:
    """A fresh key pair added to the owner's account, and a running slice of `image` that
    takes its public line; (private key path, slice)."""
    key, line = client_key(tmp_path)
    services.ssh_key_add(user=owner.user, name="laptop", public_key=line)
    return key, running_slice(funded, owner, image, public_key=line)


def _known_hosts(tmp_path: Path, gateway, shown: dict) -> Path:
    """The renter's known_hosts, from nothing but the API: the gateway's key (as the account
    page gives it) and the slice's own line."""
    known = tmp_path / "known_hosts_from_api"
    gw_key = ssh.public_key_line(
        ssh.load_or_create_platform_key(Path(settings.GATEWAY_HOST_KEY_PATH))
    )
    known.write_text(
        f"[127.0.0.1]:{gateway.port} {gw_key}\n{shown['connection']['gateway']['known_hosts']}\n"
    )
    return known


def _login(known: Path, key: Path, jump: str, *inside: str) -> subprocess.CompletedProcess:
    """The page's `ssh -J` command with this key and `known` as the only known hosts, no
    prompts (-F reaches the jump hop too)."""
    config = known.with_name(known.name + ".config")
    config.write_text(
        "Host *\n"
        f"  IdentityFile {key}\n  IdentitiesOnly yes\n  BatchMode yes\n"
        f"  UserKnownHostsFile {known}\n  GlobalKnownHostsFile /dev/null\n"
        "  StrictHostKeyChecking yes\n  ConnectTimeout 10\n"
    )
    argv = shlex.split(jump)
    return subprocess.run(  # noqa: S603
        [argv[0], "-F", str(config), *argv[1:], *inside],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def _key_file(s: Slice) -> Path:
    """The key file the slice's container mounts (this slice's: its content is the key)."""
    [path] = [
        p
        for p in Path(host_keys.DIRECTORY).glob(f"{s.owner_key}-*")
        if p.read_text() == s.ssh_host_key
    ]
    return path


def test_a_resumed_slice_answers_with_the_host_key_the_api_gave(
    eager, lab_fleet, funded, lab_ssh_image, owner_a, api_a, gateway, tmp_path
):
    lab_fleet()
    key, s = _keyed_slice(tmp_path, funded, owner_a, lab_ssh_image)
    shown = api_a.get(f"/api/v1/slices/{s.pk}/").json()
    fingerprint = shown["ssh_host_key_fingerprint"]
    assert fingerprint.startswith("SHA256:")
    known = _known_hosts(tmp_path, gateway, shown)
    jump = shown["connection"]["gateway"]["jump"]

    first = _login(known, key, jump, "id -un")
    assert first.returncode == 0, first.stderr
    assert first.stdout.strip() == SSH_USER_IN_IMAGE
    assert "Permanently added" not in first.stderr  # nothing learned: the key was pinned

    services.slice_stop(slice=s, actor=owner_a.user)
    assert wait_for(lambda: Slice.objects.get(pk=s.pk).state == Slice.State.STOPPED, timeout=60)
    s.refresh_from_db()
    resumed = services.slice_resume(
        membership=owner_a, slice=s, purchase=funded(owner_a, vram_gb=4, hours=2)
    )
    resumed.refresh_from_db()
    assert resumed.state == Slice.State.RUNNING, resumed.state_reason
    again = api_a.get(f"/api/v1/slices/{s.pk}/").json()
    assert again["ssh_host_key_fingerprint"] == fingerprint
    assert (
        again["connection"]["gateway"]["known_hosts"]
        == shown["connection"]["gateway"]["known_hosts"]
    )
    # the same known_hosts, no prompt: the new container answers with the same key
    second = _login(known, key, jump, "echo", "resumed")
    assert second.returncode == 0, second.stderr
    assert second.stdout.strip() == "resumed"

    # a key the API did not give is refused: the pin is real
    wrong = tmp_path / "known_hosts_wrong"
    _, other = client_key(tmp_path, "other-host")
    gw_line = known.read_text().splitlines()[0]
    wrong.write_text(f"{gw_line}\nslice-{s.pk} {' '.join(other.split()[:2])}\n")
    refused = _login(wrong, key, jump, "true")
    assert refused.returncode == 255
    assert "REMOTE HOST IDENTIFICATION HAS CHANGED" in refused.stderr, refused.stderr


def test_the_config_snippet_alone_pins_the_slice_and_the_key_file_is_kept_as_promised(
    eager, lab_fleet, funded, lab_ssh_image, owner_a, api_a, gateway, tmp_path
):
    lab_fleet()
    key, s = _keyed_slice(tmp_path, funded, owner_a, lab_ssh_image)
    given = api_a.get(f"/api/v1/slices/{s.pk}/").json()["connection"]["gateway"]
    known = tmp_path / "known_hosts_gateway_only"  # nothing of the slice: the snippet pins it
    gw_key = ssh.public_key_line(
        ssh.load_or_create_platform_key(Path(settings.GATEWAY_HOST_KEY_PATH))
    )
    known.write_text(f"[127.0.0.1]:{gateway.port} {gw_key}\n")
    config = tmp_path / "config"
    config.write_text(
        given["ssh_config"] + "\nHost *\n"
        f"  IdentityFile {key}\n  IdentitiesOnly yes\n  BatchMode yes\n"
        f"  UserKnownHostsFile {known}\n  GlobalKnownHostsFile /dev/null\n"
        "  StrictHostKeyChecking yes\n  ConnectTimeout 10\n"
    )
    done = subprocess.run(  # noqa: S603
        ["ssh", "-F", str(config), f"slice-{s.pk}", "id -un"],  # noqa: S607
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == SSH_USER_IN_IMAGE
    assert known.read_text().count("\n") == 1  # nothing learned: the key was pinned

    s.refresh_from_db()
    path = _key_file(s)
    assert path.parent == Path(host_keys.DIRECTORY)
    directory = os.stat(path.parent)
    assert (directory.st_uid, stat.S_IMODE(directory.st_mode)) == (0, 0o700)
    held = os.stat(path)
    assert (held.st_uid, held.st_gid, stat.S_IMODE(held.st_mode)) == (1000, 1000, 0o600)
    services.slice_stop(slice=s, actor=owner_a.user)
    assert wait_for(lambda: Slice.objects.get(pk=s.pk).state == Slice.State.STOPPED, timeout=60)
    assert not path.exists()


def test_the_pages_forward_command_uses_a_port_clear_of_the_platform(
    eager, lab_fleet, funded, owner_a, api_a, gateway, tmp_path
):
    lab_fleet()
    image = Image.objects.create(
        name="HTTP (lab)", reference=HTTP_IMAGE, ports=[HTTP_PORT], connect="service"
    )
    key, s = _keyed_slice(tmp_path, funded, owner_a, image)
    [forward] = api_a.get(f"/api/v1/slices/{s.pk}/").json()["connection"]["gateway"]["forwards"]
    local = HTTP_PORT + 10000
    assert forward["local_port"] == local and forward["url"] == f"http://127.0.0.1:{local}/"
    assert f" -L 127.0.0.1:{local}:slice-{s.pk}:{HTTP_PORT} " in forward["command"]
    known = tmp_path / "known_hosts_gateway"
    gw_key = ssh.public_key_line(
        ssh.load_or_create_platform_key(Path(settings.GATEWAY_HOST_KEY_PATH))
    )
    known.write_text(f"[127.0.0.1]:{gateway.port} {gw_key}\n")
    argv = shlex.split(forward["command"])
    pinned = ["-i", str(key), "-o", "IdentitiesOnly=yes", "-o", "BatchMode=yes",
              "-o", f"UserKnownHostsFile={known}", "-o", "StrictHostKeyChecking=yes"]  # fmt: skip
    running = subprocess.Popen(  # noqa: S603
        [argv[0], *pinned, *argv[1:]], stderr=subprocess.PIPE
    )
    try:

        def page() -> str:
            try:
                with urllib.request.urlopen(forward["url"], timeout=5) as answer:  # noqa: S310
                    return answer.read().decode()
            except OSError:
                return ""

        assert wait_for(lambda: "gpuplatform lab service" in page(), timeout=30), (
            running.poll(),
            (running.stderr.read() if running.poll() is not None else b"").decode(),  # type: ignore[union-attr]
        )
    finally:
        running.terminate()
        running.wait(10)
