"""Volumes against the node lab's real Docker Engine: a volume made with `docker volume
create` over SSH, written by a slice, kept across stop and resume (the resumed slice sees
the first run's file), measured by `du` on the node; another tenant cannot mount it, and
nothing is made on the node when the launch is refused. A launch raced against the delete
of the volume it mounts leaves no volume on the node that the platform did not make."""

from __future__ import annotations

import time

import pytest

from gpuplatform.errors import Conflict, ServiceError
from nodelab import IMAGE
from tenants import services
from tenants.models import Image, Slice, Volume
from tests.conftest import ready_volume
from tests.incidents.test_chaos import MODEL
from tests.tenants.test_concurrency import race
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
    volume = ready_volume(owner_a, "work")
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


# how much later the delete sets off, by round: released together, the delete (one lock,
# at once) nearly always wins; a few ms later, the launch takes the volume's lock first
DELETE_LATER_S = (0.0, 0.002, 0.005)


def volume_names(node) -> set[str]:
    """Every Docker volume on the lab node, as its own dockerd lists them."""
    return set(node.docker("volume", "ls", "--format", "{{.Name}}").stdout.split())


def test_a_launch_racing_its_volumes_delete_leaves_no_volume_the_platform_did_not_make(
    eager, lab_fleet, funded, owner_a
):
    """Issue 33, S11 on a real Docker Engine: a launch that mounts a volume and that
    volume's delete, on two threads released together, round after round. Exactly one
    goes through each round, and what it dispatched then runs on the node (eager: on its
    thread, after its commit): the slice's `docker run --mount`, or the volume's `docker
    volume rm`. At the end the node's dockerd holds no volume the platform did not make
    or has let go. Without the launch's lock and provisioning's guard both went through
    in every round, and `--mount` of the removed name made an empty, unlabelled volume
    on the node, billed to nobody. Each round's verdict is kept until the node has been
    looked at, so a failure shows both."""
    fleet = lab_fleet()
    node = fleet.lab.nodes[0]
    before = volume_names(node)  # left by earlier tests on this session's lab (rows flushed)
    image = Image.objects.create(name="Lab", reference=IMAGE, connect=Image.Connect.SERVICE)
    refused = {"volume_in_use", "volume_not_ready", "does_not_exist"}
    rounds, wrong = [], []
    for round_ in range(6):
        volume = ready_volume(owner_a, f"race-{round_}")
        assert volume.docker_name in volume_names(node)
        purchase = funded(owner_a, vram_gb=4, hours=1)

        def act(i: int, volume=volume, purchase=purchase, round_=round_):
            if i == 0:
                time.sleep(DELETE_LATER_S[round_ % len(DELETE_LATER_S)])
                return services.volume_delete(
                    membership=owner_a, volume=volume, confirm=volume.name
                )
            return services.slice_launch(
                membership=owner_a, purchase=purchase, image=image, model_request=MODEL,
                environment={"WORKLOAD_MB": "200"},
                volumes=[{"volume": volume.pk, "path": "/data"}],
            )  # fmt: skip

        # eager: each call's tasks ran on its own thread once it committed
        (deleted, gone), (launched, made) = race(2, act)
        odd = [v for ok, v in ((deleted, gone), (launched, made)) if not ok]
        odd = [repr(v) for v in odd if getattr(v, "code", None) not in refused]
        rounds.append("both" if deleted and launched else "deleted" if deleted else "launched")
        if deleted == launched or odd:
            wrong.append(f"round {round_}: delete {gone!r}, launch {made!r}")
        started = Slice.objects.filter(mounts__volume=volume)
        if launched and not deleted:  # its container ran on the node, mounting the volume
            s = started.get()
            assert s.state == Slice.State.RUNNING, s.state_reason
            assert node.container(s.container_name).running
        if deleted and not launched:  # removed on the node; nothing was started
            volume.refresh_from_db()
            assert volume.state == Volume.State.DELETED, volume.state_reason
            assert not started.exists()
        for s in started.exclude(state__in=Slice.FINAL_STATES):
            services.slice_stop(slice=s, actor=owner_a.user)

    mine = Volume.objects.filter(tenant=owner_a.tenant)
    live = (Volume.State.READY, Volume.State.CREATING)
    kept = set(mine.filter(state__in=live).values_list("docker_name", flat=True))
    let_go = set(mine.exclude(docker_name__in=kept).values_list("docker_name", flat=True))
    on_node_now = volume_names(node) - before
    strays = {
        "let go by the platform": sorted(on_node_now & let_go),
        "never made by the platform": sorted(on_node_now - kept - let_go),
    }
    assert strays == {k: [] for k in strays} and wrong == [], (strays, wrong, rounds)
    assert on_node_now == kept  # and every volume the platform keeps is there
    assert len(kept) == rounds.count("launched")

    for volume in mine.filter(docker_name__in=kept):  # nothing left for later tests
        services.volume_delete(membership=owner_a, volume=volume, confirm=volume.name)
    assert volume_names(node) - before == set()
