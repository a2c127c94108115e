"""Each volume is a filesystem of its own size on its node, against the node emulator
(whose SSH user is not root: every such step goes through `sudo -n`, and the emulator's
mount, mkfs and chown refuse anyone else): made and mounted at create, mounted again and
given to the image's user before each start, unmounted and deleted with the volume; an
SSH image's login home may take a volume, another path under /home may not."""

from __future__ import annotations

import pytest

from emulator.node_disks import disks_of
from tenants import services
from tenants.models import Image, Slice, Volume
from tests.conftest import SMALL_MODEL, SSH_KEY

pytestmark = pytest.mark.django_db(transaction=True)

BASE = "/var/lib/gpuplatform-volumes"


def _launch(api, purchase, image, mounts) -> dict:
    body = {"purchase": purchase.pk, "image": image.pk, "model": SMALL_MODEL,
            "ssh_public_key": SSH_KEY, "volumes": mounts}  # fmt: skip
    answer = api.post("/api/v1/slices/", body, format="json")
    return {"status": answer.status_code, **answer.json()}


def test_a_volume_is_its_own_filesystem_mounted_before_every_start_and_gone_with_it(
    eager, worker_fleet, owner_a, funded, image_ssh, api_a
):
    fleet = worker_fleet()
    emu = fleet.nodes[0]
    volume, _ = services.volume_create(membership=owner_a, name="ckpt", size_gb=3)
    volume.refresh_from_db()
    assert volume.state == Volume.State.READY, volume.state_reason
    disks = disks_of(emu.state)
    image, where = f"{BASE}/{volume.docker_name}.ext4", f"{BASE}/{volume.docker_name}"
    assert disks.sizes[image] == 3 * 1000**3 and image in disks.formatted
    assert disks.mounts == {where: image} and where in disks.immutable
    assert disks.volume_options[volume.docker_name] == {
        "type": "none", "o": "bind", "device": where,
    }  # fmt: skip

    # a node rebooted: nothing mounted; the start mounts it again and gives it to root,
    # whom the image runs as
    disks.mounts.clear()
    launched = _launch(api_a, funded(owner_a, vram_gb=4, hours=1), image_ssh,
                       [{"volume": volume.pk, "path": "/data"}])  # fmt: skip
    assert launched["status"] == 201, launched
    s = Slice.objects.get(pk=launched["id"])
    assert s.state == Slice.State.RUNNING, s.state_reason
    assert disks.mounts == {where: image}
    assert (disks.owners[where], disks.modes[where]) == ("0:0", "0777")
    services.slice_stop(slice=s, actor=owner_a.user)

    # its filesystem gone from the node: the start is refused with the reason, not run
    # on a bare directory
    disks.mounts.clear()
    del emu.state.files[image]
    services.slice_resume(membership=owner_a, slice=s, purchase=funded(owner_a, vram_gb=4, hours=1))
    s.refresh_from_db()
    assert s.state == Slice.State.FAILED
    assert "has no filesystem on this node" in s.state_reason
    emu.state.files[image] = b""
    disks.mounts[where] = image

    services.volume_delete(membership=owner_a, volume=volume, confirm="ckpt")
    volume.refresh_from_db()
    assert volume.state == Volume.State.DELETED, volume.state_reason
    assert disks.mounts == {} and image not in emu.state.files
    assert volume.docker_name not in emu.volumes()


def test_an_ssh_images_login_home_takes_a_volume_and_nothing_else_under_home(
    eager, worker_fleet, owner_a, funded, image_ssh, api_a
):
    emu = worker_fleet().nodes[0]
    renter = Image.objects.create(name="SSH as renter", reference="lab/ssh:1", ports=[22],
                                  connect="ssh", ssh_user="renter")  # fmt: skip
    volume, _ = services.volume_create(membership=owner_a, name="home", size_gb=1)
    volume.refresh_from_db()
    wrong = [(renter, "/home/other"), (renter, "/home/renter/x"), (renter, "/home"),
             (image_ssh, "/home/renter"), (image_ssh, "/root")]  # fmt: skip
    for image, path in wrong:
        refused = _launch(api_a, funded(owner_a, vram_gb=4, hours=1), image,
                          [{"volume": volume.pk, "path": path}])  # fmt: skip
        assert refused["status"] == 400, (image.ssh_user, path, refused)
        said = refused["fields"]["volumes.0.path"]
        assert "/data or /workspace" in str(said), refused
    assert not Slice.objects.filter(state=Slice.State.RUNNING).exists()

    launched = _launch(api_a, funded(owner_a, vram_gb=4, hours=1), renter,
                       [{"volume": volume.pk, "path": "/home/renter"}])  # fmt: skip
    assert launched["status"] == 201, launched
    s = Slice.objects.get(pk=launched["id"])
    assert s.state == Slice.State.RUNNING, s.state_reason
    # a home sshd's StrictModes accepts: the image's user's, written by no one else
    assert disks_of(emu.state).modes[f"{BASE}/{volume.docker_name}"] == "0755"
