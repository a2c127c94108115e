"""A slice's own SSH host key and the commands that reach a slice: the key is OpenSSH's own
(ssh-keygen reads it and prints the same fingerprint), the config snippet pins it in a form
the real OpenSSH client parses, forwards listen on 127.0.0.1 on a port clear of the
platform's own, and the private half reaches the node on stdin only and no API answer or
page."""

from __future__ import annotations

import json
import subprocess
from decimal import Decimal

import pytest

from nodes import host_keys, runtime
from tenants import services
from tenants.models import Image, Slice
from tenants.selectors import gateway_details
from tenants.selectors.slices import forward_local_ports
from tenants.ssh_host_keys import host_key_fingerprint, host_key_known_hosts_line, host_key_make
from tests.conftest import launch
from tests.worker_harness import wait_for


def _keygen(*args: str, stdin: str = "") -> str:
    done = subprocess.run(  # noqa: S603
        ["ssh-keygen", *args],  # noqa: S607
        input=stdin,
        capture_output=True,
        text=True,
        check=True,
    )
    return done.stdout


def test_a_made_host_key_is_openssh_own_and_its_fingerprint_is_ssh_keygens(tmp_path):
    private, public = host_key_make()
    assert private.startswith("-----BEGIN OPENSSH PRIVATE KEY-----")
    path = tmp_path / "key"
    path.write_text(private)
    path.chmod(0o600)
    # ssh-keygen derives the same public key from the private file: sshd can load it
    assert _keygen("-y", "-f", str(path)).split()[:2] == public.split()[:2]
    printed = _keygen("-l", "-f", "-", stdin=public + "\n").split()
    assert printed[1] == host_key_fingerprint(public)
    assert printed[1].startswith("SHA256:") and printed[-1] == "(ED25519)"
    assert host_key_make()[1] != public  # a new key each time


def test_no_key_or_a_damaged_one_has_no_fingerprint_or_known_hosts_line():
    for bad in ("", "ssh-ed25519", "ssh-ed25519 !!notbase64", "ssh-rsa AAAAB3NzaC1yc2E="):
        assert host_key_fingerprint(bad) == ""
        assert host_key_known_hosts_line("slice-7", bad) == ""


def test_forwards_listen_10000_above_the_remote_port_clear_of_the_platform_and_root():
    assert forward_local_ports([8000, 22, 8888]) == {22: 10022, 8000: 18000, 8888: 18888}
    # no room above 55535: 10000 below, moved down past a port another forward took
    assert forward_local_ports([60000, 65535, 55535]) == {55535: 65535, 60000: 50000, 65535: 55535}
    assert forward_local_ports([45534, 55534]) == {45534: 55534, 55534: 65534}
    assert forward_local_ports([45535, 65535]) == {45535: 55535, 65535: 55534}


def test_the_forward_command_binds_127_0_0_1_and_ends_when_the_port_is_taken(settings):
    settings.GATEWAY_ADDRESS = "127.0.0.1:2222"
    details = gateway_details(7, [8000], has_sshd=False)
    [forward] = details["forwards"]
    assert forward == {
        "port": 8000,
        "local_port": 18000,
        "command": "ssh -N -o ExitOnForwardFailure=yes -L 127.0.0.1:18000:slice-7:8000 "
        "-p 2222 gpp@127.0.0.1",
        "url": "http://127.0.0.1:18000/",
    }
    assert details["known_hosts"] == details["slice_host_key_fingerprint"] == ""
    assert "KnownHostsCommand" not in details["ssh_config"]


def test_the_config_snippet_pins_the_slices_host_key_as_openssh_reads_it(settings, tmp_path):
    settings.GATEWAY_ADDRESS = "127.0.0.1:2222"
    _, public = host_key_make()
    details = gateway_details(7, [22, 8888], has_sshd=True, ssh_user="renter",
                              host_key_public=public)  # fmt: skip
    line = host_key_known_hosts_line("slice-7", public)
    assert details["known_hosts"] == line == "slice-7 " + " ".join(public.split()[:2])
    assert details["slice_host_key"] == " ".join(public.split()[:2])
    assert details["slice_host_key_fingerprint"] == host_key_fingerprint(public)
    assert details["jump"] == "ssh -J gpp@127.0.0.1:2222 renter@slice-7"
    # the real client's reading of the snippet: what `ssh slice-7` would use
    config = tmp_path / "config"
    config.write_text(details["ssh_config"])
    shown = subprocess.run(  # noqa: S603
        ["ssh", "-F", str(config), "-G", "slice-7"],  # noqa: S607
        capture_output=True,
        text=True,
        check=True,
    ).stdout.splitlines()
    assert "hostkeyalias slice-7" in shown
    assert f"knownhostscommand /bin/echo {line}" in shown
    assert "proxyjump gpp-gateway" in shown and "user renter" in shown
    # what that command prints is a known_hosts line ssh-keygen finds the key in
    known = tmp_path / "known_hosts"
    known.write_text(subprocess.check_output(["/bin/echo", *line.split()], text=True))  # noqa: S603
    assert "slice-7" in _keygen("-F", "slice-7", "-f", str(known))


def test_run_argv_mounts_only_the_key_file_read_only_and_carries_no_key_text():
    path = host_keys.file_for("slice-7")
    spec = runtime.ContainerSpec(
        name="gpp-slice-7", image="nvidia/cuda:12.4.1-base-ubuntu22.04", owner_key="slice-7",
        device="GPU-0a1b2c3d", vram_mb=4096, gpu_total_mb=24576, cpus=Decimal("2"),
        memory_mb=8192, pids_limit=512, host_key_file=path,
    )  # fmt: skip
    argv = runtime.run_argv(spec)
    mount = argv[argv.index("--mount") + 1]
    assert mount == f"type=bind,source={path},target={host_keys.PATH_IN_CONTAINER},readonly"
    assert path.startswith(host_keys.DIRECTORY + "/slice-7-")
    assert host_keys.file_for("slice-7") != path  # each start its own file
    for bad in ("/etc/shadow", f"{host_keys.DIRECTORY}/../x-0123456789abcdef", "x"):
        with pytest.raises(ValueError):
            runtime.run_argv(runtime.ContainerSpec(**{**spec.__dict__, "host_key_file": bad}))


@pytest.mark.parametrize(
    ("user", "base", "owner"),
    [
        ("", (0, 0), (0, 0, "0600")),
        ("root", (0, 0), (0, 0, "0600")),
        ("1000:1000", (0, 0), (1000, 1000, "0600")),
        ("1000", (0, 0), (1000, 1000, "0600")),
        ("1000:1000", (165536, 165536), (166536, 166536, "0600")),
        ("renter", (165536, 165536), (165536, 165536, "0644")),
    ],
)
def test_the_key_file_belongs_to_the_user_the_image_runs_as(user, base, owner):
    assert host_keys.image_owner(user, base) == owner


def test_the_remap_base_is_read_from_dockerds_data_root_and_bad_input_is_refused():
    assert host_keys.remap_base("/var/lib/docker/165536.165536\n") == (165536, 165536)
    assert host_keys.remap_base("/var/lib/docker") == (0, 0)
    assert host_keys.remap_base("<no value>") == (0, 0)
    with pytest.raises(ValueError):
        host_keys.image_owner("70000")
    with pytest.raises(ValueError):
        host_keys.write_argv(host_keys.file_for("slice-7"), uid=0, gid=0, mode="0666")
    with pytest.raises(ValueError):
        host_keys.remove_argv("/root/.ssh/id_ed25519")
    path = host_keys.file_for("slice-7")
    inspected = json.dumps([{"Mounts": [
        {"Type": "bind", "Source": "/elsewhere", "Destination": "/data"},
        {"Type": "bind", "Source": path, "Destination": host_keys.PATH_IN_CONTAINER},
    ]}])  # fmt: skip
    assert host_keys.mounted_file(inspected) == path
    assert host_keys.mounted_file("[]") == host_keys.mounted_file("not json") == ""


# --- the API and the page, on an emulated node -------------------------------------------------


@pytest.fixture
def recorded(monkeypatch):
    """Every command the platform's pool runs on a node, with what it sent on stdin."""
    from nodes import ssh  # noqa: PLC0415 - the pool class, patched for this test only

    calls: list[tuple[list[str], bytes | None]] = []
    original = ssh.SSHPool.run

    def run(self, endpoint, argv, *, stdin=None, timeout=None):
        calls.append((list(argv), stdin))
        return original(self, endpoint, argv, stdin=stdin, timeout=timeout)

    monkeypatch.setattr(ssh.SSHPool, "run", run)
    return calls


def _key_writes(recorded):
    return [
        (a, i)
        for a, i in recorded
        if a[0] == "install" and a[-1].startswith(host_keys.DIRECTORY + "/")
    ]


@pytest.mark.django_db(transaction=True)
def test_the_api_and_page_show_the_fingerprint_and_never_the_private_key(
    eager, worker_fleet, funded, image_ssh, owner_a, api_a, client, recorded, settings
):
    settings.GATEWAY_ADDRESS = "127.0.0.1:2222"
    worker_fleet()
    s = launch(owner_a, funded(owner_a, vram_gb=4), image_ssh)
    assert s.state == Slice.State.RUNNING, s.state_reason
    private, public = s.ssh_host_key, s.ssh_host_key_public
    assert private.startswith("-----BEGIN OPENSSH PRIVATE KEY-----") and public
    body = "".join(private.splitlines()[1:-1])  # the base64, however a response wraps it

    shown = api_a.get(f"/api/v1/slices/{s.pk}/").json()
    assert shown["ssh_host_key_fingerprint"] == host_key_fingerprint(public)
    assert shown["ssh_host_key_public"] == public
    assert shown["connection"]["gateway"]["known_hosts"] == host_key_known_hosts_line(
        f"slice-{s.pk}", public
    )
    client.force_login(owner_a.user)
    page = client.get(f"/slices/{s.pk}/").content.decode()
    assert host_key_fingerprint(public) in page and "KnownHostsCommand" in page
    answers = [
        api_a.get(f"/api/v1/slices/{s.pk}/").content,
        api_a.get("/api/v1/slices/").content,
        client.get(f"/slices/{s.pk}/").content,
        client.get(f"/slices/{s.pk}/", HTTP_HX_REQUEST="true").content,
        client.get("/dashboard/").content,
    ]
    for answer in answers:
        text = answer.decode()
        assert "PRIVATE KEY" not in text and body[:40] not in text and body[-40:] not in text

    # on the node: written on stdin by install into the root-only directory, as the
    # image's user (the emulated image has none: root), never in any argv
    [(argv, stdin)] = _key_writes(recorded)
    assert argv[:7] == ["install", "-m", "0600", "-o", "0", "-g", "0"]
    assert stdin == private.encode()
    assert all(body[:40] not in " ".join(a) for a, _ in recorded)
    assert ["install", "-d", "-m", "0700", "-o", "0", "-g", "0", host_keys.DIRECTORY] in [
        a for a, _ in recorded
    ]
    key_file = argv[-1]
    run = next(a for a, _ in recorded if a[:2] == ["docker", "run"] and s.container_name in a)
    assert f"type=bind,source={key_file},target={host_keys.PATH_IN_CONTAINER},readonly" in run
    assert not any(private in item or body[:40] in item for item in run)

    # stopped: the container and its key file go; resumed: the same key, a new file
    recorded.clear()
    services.slice_stop(slice=s, actor=owner_a.user)
    assert wait_for(lambda: Slice.objects.get(pk=s.pk).state == Slice.State.STOPPED, timeout=20)
    assert ["rm", "-f", "--", key_file] in [a for a, _ in recorded]
    s.refresh_from_db()
    resumed = services.slice_resume(
        membership=owner_a, slice=s, purchase=funded(owner_a, vram_gb=4)
    )
    resumed.refresh_from_db()
    assert resumed.state == Slice.State.RUNNING, resumed.state_reason
    assert (resumed.ssh_host_key, resumed.ssh_host_key_public) == (private, public)
    [(argv, stdin)] = _key_writes(recorded)
    assert stdin == private.encode() and argv[-1] != key_file


@pytest.mark.django_db
def test_a_slice_from_before_host_keys_gets_one_when_it_is_resumed(funded, owner_a, image_ssh):
    s = launch(owner_a, funded(owner_a, vram_gb=4), image_ssh)
    assert s.ssh_host_key_public  # made at launch
    Slice.objects.filter(pk=s.pk).update(
        ssh_host_key="", ssh_host_key_public="", state=Slice.State.STOPPED
    )
    s.refresh_from_db()
    services.slice_resume(membership=owner_a, slice=s, purchase=funded(owner_a, vram_gb=4))
    s.refresh_from_db()
    assert s.ssh_host_key.startswith("-----BEGIN OPENSSH PRIVATE KEY-----")
    assert host_key_fingerprint(s.ssh_host_key_public).startswith("SHA256:")


@pytest.mark.django_db
def test_an_image_without_its_own_sshd_gets_no_host_key(funded, owner_a):
    image = Image.objects.create(
        name="svc", reference="a/svc:1", ports=[8000], connect=Image.Connect.SERVICE
    )
    s = launch(owner_a, funded(owner_a, vram_gb=4), image)
    assert s.ssh_host_key == s.ssh_host_key_public == ""
