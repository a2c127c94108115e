"""A volume's size is enforced on a real node: each volume is an ext4 filesystem of its
size in a file, loop-mounted in a root-only directory beside the lab node's docker data
root. Writing past the size inside the slice fails with "No space left on device", the
node's disk holds no more than the file, a bare (unmounted) mount point takes no write
even from the node's root, and the next start mounts it again. Removal unmounts and
deletes the file."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from nodelab import IMAGE
from tenants import services
from tenants.models import Image, Slice, Volume
from tests.conftest import ready_volume
from tests.incidents.test_chaos import MODEL

pytestmark = [pytest.mark.lab, pytest.mark.django_db(transaction=True)]

GB = 1000**3


def mounted(path: Path) -> bool:
    return subprocess.run(["mountpoint", "-q", str(path)], check=False).returncode == 0  # noqa: S603,S607


def test_writing_past_a_volumes_size_fails_inside_and_the_node_keeps_only_its_file(
    eager, lab_fleet, funded, owner_a
):
    fleet = lab_fleet()
    node = fleet.lab.nodes[0]
    image = Image.objects.create(name="Lab", reference=IMAGE, connect=Image.Connect.SERVICE)
    volume = ready_volume(owner_a, "small")
    disks = node.dir / "gpuplatform-volumes"
    backing, where = disks / f"{volume.docker_name}.ext4", disks / volume.docker_name
    assert os.stat(disks).st_mode & 0o777 == 0o700
    assert backing.stat().st_size == GB and mounted(where)
    assert "nosuid" in _mount_options(where) and "nodev" in _mount_options(where)

    s, _ = services.slice_launch(
        membership=owner_a, purchase=funded(owner_a, vram_gb=4, hours=1), image=image,
        model_request=MODEL, environment={"WORKLOAD_MB": "200"},
        volumes=[{"volume": volume.pk, "path": "/data/small"}],
    )  # fmt: skip
    s.refresh_from_db()
    assert s.state == Slice.State.RUNNING, s.state_reason

    # 1.2 GB into a 1 GB volume: the filesystem says no, inside the container
    fill = node.docker(
        "exec", s.container_name, "dd", "if=/dev/zero", "of=/data/small/fill", "bs=1M",
        "count=1200", check=False, timeout=120,
    )  # fmt: skip
    assert fill.returncode != 0
    assert "No space left on device" in fill.stderr, fill.stderr
    written = int(node.exec(s.container_name, "wc", "-c", "/data/small/fill").split()[0])
    assert 0.9 * GB < written < GB
    # the node's disk holds the file and nothing beyond it: docker's own directory for
    # the volume (where the bind shows it) holds nothing once the container is gone
    assert backing.stat().st_blocks * 512 <= GB + 64 * 2**20
    services.slice_stop(slice=s, actor=owner_a.user)
    docker_dir = node.dir / "docker" / "volumes" / volume.docker_name / "_data"
    assert not docker_dir.exists() or list(docker_dir.iterdir()) == []

    # unmounted (a node's reboot), the bare mount point takes no write, not even root's
    subprocess.run(["umount", str(where)], check=True)  # noqa: S603,S607
    stray = subprocess.run(  # noqa: S603
        ["touch", str(where / "stray")],
        capture_output=True,
        text=True,
        check=False,  # noqa: S607
    )
    assert stray.returncode != 0 and "Operation not permitted" in stray.stderr
    # the next start mounts it again, with what the first run wrote
    services.slice_resume(membership=owner_a, slice=s, purchase=funded(owner_a, vram_gb=4, hours=1))
    s.refresh_from_db()
    assert s.state == Slice.State.RUNNING, s.state_reason
    assert mounted(where)
    listed = node.exec(s.container_name, "ls", "/data/small").split()
    assert "fill" in listed and "stray" not in listed

    services.slice_stop(slice=s, actor=owner_a.user)
    services.volume_delete(membership=owner_a, volume=volume, confirm="small")
    volume.refresh_from_db()
    assert volume.state == Volume.State.DELETED, volume.state_reason
    assert not mounted(where) and not backing.exists() and not where.exists()
    assert volume.docker_name not in node.docker("volume", "ls", "--quiet").stdout


def _mount_options(where: Path) -> list[str]:
    for line in Path("/proc/self/mounts").read_text().splitlines():
        fields = line.split()
        if fields[1] == str(where):
            return fields[3].split(",")
    return []
