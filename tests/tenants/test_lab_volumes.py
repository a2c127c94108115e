"""Volumes against the node lab's real Docker Engine: a volume made with `docker volume
create` over SSH, written by a slice, kept across stop and resume (the resumed slice sees
the first run's file), measured by `du` on the node; another tenant cannot mount it, and
nothing is made on the node when the launch is refused."""

from __future__ import annotations

import pytest

from gpuplatform.errors import Conflict, ServiceError
from nodelab import IMAGE
from tenants import services
from tenants.models import Image, Slice, Volume
from tests.incidents.test_chaos import MODEL
from tests.worker_harness import wait_for

pytestmark = [pytest.mark.lab, pytest.mark.django_db(transaction=True)]

# each run appends a line to the volume, then holds a little VRAM as a job would
RECORD = ["sh", "-c", "echo run >> /data/work/runs && exec gpu-workload"]


def on_node(node, volume: Volume, *argv: str) -> str:
    """Read the volume on the node with a throwaway container of the lab's image."""
    out = node.docker(
        "run", "--rm", "--network", "none",
        "--mount", f"type=volume,source={volume.docker_name},target=/v",
        IMAGE, *argv,
    )  # fmt: skip
    return out.stdout.strip()


def test_a_volume_keeps_what_a_slice_wrote_across_stop_and_resume(
    eager, lab_fleet, funded, owner_a, owner_b
):
    fleet = lab_fleet()
    node = fleet.lab.nodes[0]
    image = Image.objects.create(name="Lab", reference=IMAGE, connect=Image.Connect.SERVICE)
    volume, _ = services.volume_create(membership=owner_a, name="work", size_gb=1)
    volume.refresh_from_db()
    assert volume.state == Volume.State.READY, volume.state_reason
    listed = node.docker("volume", "ls", "--format", "{{.Name}} {{.Labels}}").stdout
    assert volume.docker_name in listed and f"gpuplatform.owner=volume-{volume.pk}" in listed

    mounts = [{"volume": volume.pk, "path": "/data/work"}]
    s, _ = services.slice_launch(
        membership=owner_a, purchase=funded(owner_a, vram_gb=4, hours=1), image=image,
        model_request=MODEL, command=RECORD, environment={"WORKLOAD_MB": "200"},
        volumes=mounts,
    )  # fmt: skip
    s.refresh_from_db()
    assert s.state == Slice.State.RUNNING, s.state_reason
    services.slice_stop(slice=s, actor=owner_a.user)
    s.refresh_from_db()
    assert s.state == Slice.State.STOPPED
    assert on_node(node, volume, "cat", "/v/runs") == "run"

    services.slice_resume(membership=owner_a, slice=s, purchase=funded(owner_a, vram_gb=4, hours=1))
    s.refresh_from_db()
    assert s.state == Slice.State.RUNNING and s.runs == 2, s.state_reason
    assert wait_for(lambda: on_node(node, volume, "cat", "/v/runs") == "run\nrun", timeout=10)

    # du on the node measures it; the volume is far from full, so the slice runs on
    assert services.volumes_measure(node_id=volume.node_id) == 1
    volume.refresh_from_db()
    assert volume.used_mb is not None and volume.used_mb < 1
    s.refresh_from_db()
    assert s.state == Slice.State.RUNNING

    # another tenant's launch naming it is refused, and nothing is made on the node
    before = node.docker("ps", "--all", "--quiet").stdout.split()
    with pytest.raises(ServiceError) as refused:
        services.slice_launch(
            membership=owner_b, purchase=funded(owner_b, vram_gb=4, hours=1), image=image,
            model_request=MODEL, volumes=[{"volume": volume.pk, "path": "/data"}],
        )  # fmt: skip
    assert refused.value.field == "volumes.0.volume"
    assert node.docker("ps", "--all", "--quiet").stdout.split() == before
    assert not Slice.objects.filter(tenant=owner_b.tenant).exists()

    # deleting it: refused while mounted; once stopped, gone from the node
    with pytest.raises(Conflict):
        services.volume_delete(membership=owner_a, volume=volume, confirm="work")
    services.slice_stop(slice=s, actor=owner_a.user)
    services.volume_delete(membership=owner_a, volume=volume, confirm="work")
    volume.refresh_from_db()
    assert volume.state == Volume.State.DELETED
    assert volume.docker_name not in node.docker("volume", "ls", "--quiet").stdout
