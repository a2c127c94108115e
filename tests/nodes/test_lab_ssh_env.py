"""An SSH login into a lab slice, through the gateway with the real OpenSSH client, gets the
platform's variables its first process got (a command and a login shell alike, from the
read-only /etc/profile.d/gpuplatform.sh the node wrote); the slice's nvidia-smi shows the
slice's own device and quota, not the card; and rsync copies both ways through the gateway
with the real rsync over `ssh -J`."""

from __future__ import annotations

import shlex
import subprocess

import pytest

from emulator.catalog import GpuSpec
from nodelab import LabNodeSpec
from nodes import isolation
from tenants import services
from tenants.models import Slice
from tests.conftest import SMALL_MODEL
from tests.gateway.support import client_config, client_key, running_slice, ssh_run

pytestmark = [pytest.mark.lab, pytest.mark.django_db(transaction=True)]


def _env(text: str) -> dict[str, str]:
    return dict(line.split("=", 1) for line in text.splitlines() if "=" in line)


def _platform(env: dict[str, str]) -> dict[str, str]:
    return {k: v for k, v in env.items() if isolation.reserved_reason(k)}


def _login(tmp_path, gateway, owner, s: Slice, key) -> tuple:
    snippet = client_config(tmp_path, gateway, key, s.connection["gateway"]["ssh_config"])
    return snippet, f"slice-{s.pk}"


def _key(tmp_path, owner) -> tuple:
    key, line = client_key(tmp_path)
    services.ssh_key_add(user=owner.user, name="laptop", public_key=line)
    return key, line


def _smi(snippet, name: str) -> list[str]:
    query = (
        "nvidia-smi --query-gpu=name,uuid,memory.total,memory.used --format=csv,noheader,nounits"
    )
    run = ssh_run(snippet, "ssh", name, query)
    assert run.returncode == 0, (run.stdout, run.stderr)
    return [cell.strip() for cell in run.stdout.strip().split(",")]


def test_a_login_gets_the_first_processs_caps_and_nvidia_smi_shows_the_slice(
    eager, lab_fleet, funded, lab_ssh_image, owner_a, gateway, tmp_path
):
    fleet = lab_fleet()  # one A30 with the quota library: 4 GB slices share the card
    node = fleet.lab.nodes[0]
    key, line = _key(tmp_path, owner_a)
    s = running_slice(funded, owner_a, lab_ssh_image, public_key=line)
    snippet, name = _login(tmp_path, gateway, owner_a, s, key)
    # the first process's own environment (docker-init's, under --init), as the kernel keeps it
    first = _env(node.exec(s.container_id, "cat", "/proc/1/environ").replace("\0", "\n"))

    # a command, no login shell (sshd starts it afresh): the same platform variables
    command = ssh_run(snippet, "ssh", name, "env")
    assert command.returncode == 0, command.stderr
    got = _env(command.stdout)
    assert got["XLA_PYTHON_CLIENT_MEM_FRACTION"] == "1.00"  # of the 4 GB slice, not 0.16
    assert got["GPUPLATFORM_VRAM_LIMIT_MB"] == "4096"
    assert got["NVIDIA_VISIBLE_DEVICES"] == s.allocation.gpu.uuid
    assert _platform(got) == _platform(first)
    assert "WORKLOAD_MB" in first and "WORKLOAD_MB" not in got  # the tenant's stays theirs

    # a clean login shell reads them from the node's file through /etc/profile
    clean = ssh_run(snippet, "ssh", name, "env -i /bin/sh -l -c env")
    assert clean.returncode == 0, clean.stderr
    assert _platform(_env(clean.stdout)) == _platform(first)
    # and the file is the node's: root's, mounted read-only
    write = ssh_run(snippet, "ssh", name, "echo export X=1 >> /etc/profile.d/gpuplatform.sh")
    assert write.returncode != 0, write.stderr
    mount = ssh_run(snippet, "ssh", name, "grep ' /etc/profile.d/gpuplatform.sh ' /proc/mounts")
    assert mount.stdout.split()[3].split(",")[0] == "ro", mount.stdout

    # nvidia-smi inside: the slice's quota as the total (not the card's), its own use
    gpu_name, uuid, total, used = _smi(snippet, name)
    assert (gpu_name, uuid, int(total)) == ("NVIDIA A30", s.allocation.gpu.uuid, 4096)
    assert 300 <= int(used) < 4096  # the job holds its 300 MiB
    table = ssh_run(snippet, "ssh", name, "nvidia-smi")
    assert table.returncode == 0 and f"{used}MiB / 4096MiB" in table.stdout, table.stdout
    card_mb = node.gpu("state")["gpus"][0]["total"] // (1024 * 1024)
    assert card_mb > 4096 * 5  # the card is the A30's 24 GB


def test_rsync_copies_to_and_from_the_slice_through_the_gateway(
    eager, lab_fleet, funded, lab_ssh_image, owner_a, gateway, tmp_path
):
    lab_fleet()
    key, line = _key(tmp_path, owner_a)
    s = running_slice(funded, owner_a, lab_ssh_image, public_key=line)
    config = client_config(tmp_path, gateway, key)
    jump = shlex.split(s.connection["gateway"]["jump"])  # ssh -J gpp@host:port user@slice-N
    assert jump[:2] == ["ssh", "-J"]
    shell = shlex.join(["ssh", "-F", str(config), "-J", jump[2]])
    out = tmp_path / "out"
    (out / "sub").mkdir(parents=True)
    (out / "weights.bin").write_bytes(bytes(range(256)) * 4000)
    (out / "sub" / "notes.txt").write_text("checkpoint 7\n")

    up = _rsync(["-a", "-e", shell, f"{out}/", f"{jump[3]}:data/"])
    assert up.returncode == 0, up.stderr
    size = ssh_run(config, "ssh", "-J", jump[2], jump[3], "wc -c < data/weights.bin")
    assert size.stdout.strip() == "1024000", size.stderr

    back = tmp_path / "back"
    down = _rsync(["-a", "-e", shell, f"{jump[3]}:data/", f"{back}/"])
    assert down.returncode == 0, down.stderr
    assert (back / "weights.bin").read_bytes() == (out / "weights.bin").read_bytes()
    assert (back / "sub" / "notes.txt").read_text() == "checkpoint 7\n"


def _rsync(args: list[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(  # noqa: S603
        ["rsync", *args],  # noqa: S607
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


MIG_NODE = (LabNodeSpec("lab-mig-env", (GpuSpec("NVIDIA A100-SXM4-80GB", mig=("1g.10gb",)),)),)


def test_on_a_mig_instance_the_caps_and_nvidia_smi_are_the_instances(
    eager, lab_fleet, funded, lab_ssh_image, owner_a, gateway, tmp_path
):
    lab_fleet(MIG_NODE)
    key, line = _key(tmp_path, owner_a)
    s = running_slice(
        funded, owner_a, lab_ssh_image, public_key=line, vram_gb=8, model_request=SMALL_MODEL
    )
    assert s.allocation.mig_device_uuid
    snippet, name = _login(tmp_path, gateway, owner_a, s, key)
    got = _env(ssh_run(snippet, "ssh", name, "env").stdout)
    _, uuid, total, _ = _smi(snippet, name)
    instance = int(total)
    assert 8192 <= instance < 80 * 1024 and uuid == s.allocation.mig_device_uuid
    share = 8192 * 100 // instance
    assert got["XLA_PYTHON_CLIENT_MEM_FRACTION"] == f"0.{share:02d}"
    assert got["GPUPLATFORM_MEMORY_FRACTION"] == got["XLA_PYTHON_CLIENT_MEM_FRACTION"]
