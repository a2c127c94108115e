"""Volumes and resume against the node emulator (its `docker volume` and `du`): create,
mount into a slice at a checked path, stop and resume on the volume's node, delete with
confirmation, bill per GB-hour with an unpaid grace period, stop a slice whose volume is
full, terminate; and every bad input a 4xx naming the field, with nothing created."""

from datetime import timedelta
from decimal import Decimal

import pytest
from django.core import mail
from rest_framework.test import APIClient

from emulator.catalog import GpuSpec, NodeSpec
from tenants import services
from tenants.models import AuditEvent, LedgerEntry, Role, Slice, SliceMount, Volume
from tests.conftest import SMALL_MODEL, SSH_KEY
from tests.factories import MembershipFactory, make_token

pytestmark = pytest.mark.django_db(transaction=True)

TWO_NODES = [
    NodeSpec("gpu-a", (GpuSpec("NVIDIA GeForce RTX 4090"),)),
    NodeSpec("gpu-b", (GpuSpec("NVIDIA GeForce RTX 4090"),)),
]


def _volume(api, name="ckpt", size_gb=10) -> dict:
    made = api.post("/api/v1/volumes/", {"name": name, "size_gb": size_gb}, format="json")
    assert made.status_code == 201, made.content
    return api.get(f"/api/v1/volumes/{made.json()['id']}/").json()


def _launch_body(purchase, image, **extra) -> dict:
    return {
        "purchase": purchase.pk,
        "image": image.pk,
        "model": SMALL_MODEL,
        "ssh_public_key": SSH_KEY,
        **extra,
    }


def _emu_of(fleet, volume: Volume):
    return next(e for e in fleet.nodes if e.name == volume.node.name)


def test_a_volume_is_made_on_a_node_mounted_kept_across_stop_and_resume(
    eager, worker_fleet, owner_a, funded, image_ssh, api_a
):
    fleet = worker_fleet(TWO_NODES)
    shown = _volume(api_a)
    assert shown["state"] == "ready" and shown["used_gb"] == 0
    volume = Volume.objects.get(pk=shown["id"])
    emu = _emu_of(fleet, volume)
    assert emu.volumes()[volume.docker_name]["gpuplatform.owner"] == f"volume-{volume.pk}"

    first = funded(owner_a, vram_gb=4, hours=1)
    mounts = [{"volume": volume.pk, "path": "/data/ckpt"}]
    launched = api_a.post("/api/v1/slices/", _launch_body(first, image_ssh, volumes=mounts),
                          format="json")  # fmt: skip
    assert launched.status_code == 201, launched.content
    s = Slice.objects.get(pk=launched.json()["id"])
    assert s.state == Slice.State.RUNNING, s.state_reason
    assert s.allocation.gpu.node_id == volume.node_id  # placed where the volume is
    container = emu.container(s.container_id)
    volumes = [m for m in container.host_config["Mounts"] if m["Type"] == "volume"]
    assert volumes == [{"Type": "volume", "Source": volume.docker_name, "Target": "/data/ckpt"}]

    # deleting it while the slice runs is refused, and changes nothing
    busy = api_a.post(f"/api/v1/volumes/{volume.pk}/delete/", {"confirm": "ckpt"}, format="json")
    assert busy.status_code == 409 and busy.json()["code"] == "volume_in_use"

    assert api_a.post(f"/api/v1/slices/{s.pk}/stop/", {}, format="json").status_code == 202
    s.refresh_from_db()
    assert s.state == Slice.State.STOPPED
    assert volume.docker_name in emu.volumes()  # the files stay

    second = funded(owner_a, vram_gb=4, hours=1)
    resumed = api_a.post(f"/api/v1/slices/{s.pk}/resume/", {"purchase": second.pk},
                         format="json")  # fmt: skip
    assert resumed.status_code == 202, resumed.content
    s.refresh_from_db()
    assert s.state == Slice.State.RUNNING and s.runs == 2 and s.purchase_id == second.pk
    assert s.allocation.gpu.node_id == volume.node_id
    again = emu.container(s.container_id)
    assert again.host_config["Mounts"][0]["Source"] == volume.docker_name
    timeline = [t.to_state for t in s.transitions.all()]
    assert timeline == ["requested", "provisioning", "running", "stopping", "stopped",
                        "requested", "provisioning", "running"]  # fmt: skip

    # a running slice cannot be resumed; a terminated one never again
    twice = api_a.post(f"/api/v1/slices/{s.pk}/resume/", {"purchase": first.pk}, format="json")
    assert twice.status_code == 409
    ended = api_a.post(f"/api/v1/slices/{s.pk}/terminate/", {"delete_volumes": True},
                       format="json")  # fmt: skip
    assert ended.status_code == 202, ended.content
    s.refresh_from_db()
    volume.refresh_from_db()
    assert s.state == Slice.State.STOPPED and s.terminated_at is not None
    shown = api_a.get(f"/api/v1/slices/{s.pk}/").json()  # told apart from a stopped slice
    assert shown["terminated_at"] is not None and shown["runs"] == s.runs
    assert volume.state == Volume.State.DELETED and volume.docker_name not in emu.volumes()
    third = funded(owner_a, vram_gb=4, hours=1)
    never = api_a.post(f"/api/v1/slices/{s.pk}/resume/", {"purchase": third.pk}, format="json")
    assert never.status_code == 409 and never.json()["code"] == "slice_terminated"
    assert AuditEvent.objects.filter(action="slice.terminate", tenant=owner_a.tenant).exists()


def test_delete_needs_the_name_typed_and_removes_it_from_its_node(eager, worker_fleet, api_a):
    fleet = worker_fleet()
    volume = Volume.objects.get(pk=_volume(api_a, "scratch")["id"])
    wrong = api_a.post(f"/api/v1/volumes/{volume.pk}/delete/", {"confirm": "scratc"}, format="json")
    assert wrong.status_code == 400 and list(wrong.json()["fields"]) == ["confirm"]
    assert volume.docker_name in fleet.nodes[0].volumes()
    done = api_a.post(f"/api/v1/volumes/{volume.pk}/delete/", {"confirm": "scratch"}, format="json")
    assert done.status_code == 202 and done.json()["state"] == "deleted"
    assert volume.docker_name not in fleet.nodes[0].volumes()
    # the name is free again
    assert _volume(api_a, "scratch")["state"] == "ready"


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"name": "x", "size_gb": 0}, "size_gb"),
        ({"name": "x", "size_gb": 10**6}, "size_gb"),
        ({"name": "x", "size_gb": "10"}, "size_gb"),
        ({"name": "x; rm -rf /", "size_gb": 1}, "name"),
        ({"name": "$(id)", "size_gb": 1}, "name"),
        ({"name": "../etc", "size_gb": 1}, "name"),
        ({"name": "n" * 10_000, "size_gb": 1}, "name"),
        ({"name": 5, "size_gb": 1}, "name"),
        ({"size_gb": 1}, "name"),
    ],
)
def test_bad_volume_input_is_a_400_naming_the_field_and_makes_nothing(
    eager, worker_fleet, api_a, body, field
):
    fleet = worker_fleet()
    answer = api_a.post("/api/v1/volumes/", body, format="json")
    assert answer.status_code == 400, answer.content
    assert field in answer.json()["fields"]
    assert not Volume.objects.exists() and fleet.nodes[0].volumes() == {}


@pytest.mark.parametrize(
    ("mount", "field"),
    [
        ({"volume": "mine", "path": "../etc"}, "volumes.0.path"),
        ({"volume": "mine", "path": "/etc"}, "volumes.0.path"),
        ({"volume": "mine", "path": "/data/../etc"}, "volumes.0.path"),
        ({"volume": "mine", "path": "/data/a,b=c"}, "volumes.0.path"),
        ({"volume": "mine", "path": "/"}, "volumes.0.path"),
        ({"volume": "theirs", "path": "/data"}, "volumes.0.volume"),
        ({"volume": 999999, "path": "/data"}, "volumes.0.volume"),
    ],
)
def test_a_launch_with_a_bad_mount_is_a_400_naming_it_and_reserves_nothing(
    eager, worker_fleet, owner_a, owner_b, funded, image_ssh, api_a, api_b, mount, field
):
    fleet = worker_fleet()
    ids = {"mine": _volume(api_a)["id"], "theirs": _volume(api_b, "other")["id"]}
    mount = {**mount, "volume": ids.get(mount["volume"], mount["volume"])}
    purchase = funded(owner_a, vram_gb=4, hours=1)
    answer = api_a.post("/api/v1/slices/", _launch_body(purchase, image_ssh, volumes=[mount]),
                        format="json")  # fmt: skip
    assert answer.status_code == 400, answer.content
    assert field in answer.json()["fields"], answer.json()
    assert "other" not in str(answer.json())  # another tenant's volume is not named
    assert not Slice.objects.exists() and not SliceMount.objects.exists()
    assert fleet.nodes[0].containers == []


def test_viewers_cannot_create_or_delete_volumes(eager, worker_fleet, owner_a, api_a):
    worker_fleet()
    volume = _volume(api_a)
    viewer = MembershipFactory(tenant=owner_a.tenant, role=Role.VIEWER, user__email="v@a.test")
    api_v = APIClient()
    api_v.credentials(HTTP_AUTHORIZATION=f"Bearer {make_token(viewer.user)[1]}")
    assert api_v.get("/api/v1/volumes/").json()["count"] == 1
    made = api_v.post("/api/v1/volumes/", {"name": "x", "size_gb": 1}, format="json")
    assert made.status_code == 403
    gone = api_v.post(f"/api/v1/volumes/{volume['id']}/delete/", {"confirm": "ckpt"},
                      format="json")  # fmt: skip
    assert gone.status_code == 403 and Volume.objects.filter(state="ready").count() == 1


def test_another_tenants_volume_is_a_404(eager, worker_fleet, api_a, api_b):
    worker_fleet()
    theirs = _volume(api_b, "other")
    assert api_a.get(f"/api/v1/volumes/{theirs['id']}/").status_code == 404
    gone = api_a.post(f"/api/v1/volumes/{theirs['id']}/delete/", {"confirm": "other"},
                      format="json")  # fmt: skip
    assert gone.status_code == 404 and Volume.objects.get(pk=theirs["id"]).state == "ready"


def test_storage_is_billed_per_gb_hour_and_an_unpaid_volume_is_deleted_after_grace(
    eager, worker_fleet, owner_a, ops_user, api_a, settings
):
    fleet = worker_fleet()
    services.credit_grant(tenant=owner_a.tenant, amount="1.00", actor=ops_user, memo="t")
    services.storage_price_set(actor=ops_user, credits_per_gb_hour="0.01", reason="test")
    volume = Volume.objects.get(pk=_volume(api_a, size_gb=10)["id"])
    start = volume.last_metered_at
    # 5 hours of 10 GB at 0.01 per GB-hour: 0.50
    services.volume_meter(volume_id=volume.pk, now=start + timedelta(hours=5))
    entry = LedgerEntry.objects.get(kind=LedgerEntry.Kind.STORAGE)
    assert entry.amount == Decimal("-0.50") and entry.balance_after == Decimal("0.50")
    volume.refresh_from_db()
    assert volume.last_metered_at == start + timedelta(hours=5) and volume.unpaid_since is None

    # 10 more hours cost 1.00; only 0.50 is left: taken, and the volume is unpaid from now
    later = start + timedelta(hours=15)
    mail.outbox.clear()
    services.volume_meter(volume_id=volume.pk, now=later)
    owner_a.tenant.refresh_from_db()
    volume.refresh_from_db()
    assert owner_a.tenant.credit_balance == Decimal("0.00")
    assert volume.unpaid_since == later and volume.warned_at == later
    assert any("will be deleted" in m.subject for m in mail.outbox)
    assert volume.last_metered_at == start + timedelta(hours=10)  # what was paid for

    # within the grace period it is kept; past it, deleted on its node
    services.volumes_meter(now=later + timedelta(days=settings.VOLUME_UNPAID_GRACE_DAYS - 1))
    assert Volume.objects.get(pk=volume.pk).state == Volume.State.READY
    services.volumes_meter(now=later + timedelta(days=settings.VOLUME_UNPAID_GRACE_DAYS, hours=1))
    volume.refresh_from_db()
    assert volume.state == Volume.State.DELETED
    assert volume.docker_name not in fleet.nodes[0].volumes()
    assert AuditEvent.objects.filter(action="volume.delete", summary__contains="unpaid").exists()


def test_a_full_volume_stops_the_slices_that_mount_it_and_keeps_its_files(
    eager, worker_fleet, owner_a, funded, image_ssh, api_a
):
    fleet = worker_fleet()
    volume = Volume.objects.get(pk=_volume(api_a, size_gb=2)["id"])
    purchase = funded(owner_a, vram_gb=4, hours=1)
    mounts = [{"volume": volume.pk, "path": "/workspace"}]
    made = api_a.post("/api/v1/slices/", _launch_body(purchase, image_ssh, volumes=mounts),
                      format="json")  # fmt: skip
    s = Slice.objects.get(pk=made.json()["id"])
    assert s.state == Slice.State.RUNNING
    emu = fleet.nodes[0]
    emu.set_volume_bytes(volume.docker_name, 10**9)  # half full: nothing happens
    services.volumes_measure(node_id=volume.node_id)
    s.refresh_from_db()
    assert s.state == Slice.State.RUNNING
    assert api_a.get(f"/api/v1/volumes/{volume.pk}/").json()["used_gb"] == 1.0
    emu.set_volume_bytes(volume.docker_name, 2 * 10**9)
    services.volumes_measure(node_id=volume.node_id)
    s.refresh_from_db()
    assert s.state == Slice.State.STOPPED and "Volume ckpt is full" in s.state_reason
    assert volume.docker_name in emu.volumes()


def test_resume_goes_through_the_same_checks(
    eager, worker_fleet, owner_a, funded, image_ssh, api_a
):
    worker_fleet()
    purchase = funded(owner_a, vram_gb=4, hours=1)
    made = api_a.post("/api/v1/slices/", _launch_body(purchase, image_ssh), format="json")
    s = Slice.objects.get(pk=made.json()["id"])
    api_a.post(f"/api/v1/slices/{s.pk}/stop/", {}, format="json")
    other_tier = funded(owner_a, vram_gb=8, hours=1)
    wrong = api_a.post(f"/api/v1/slices/{s.pk}/resume/", {"purchase": other_tier.pk},
                       format="json")  # fmt: skip
    assert wrong.status_code == 400 and list(wrong.json()["fields"]) == ["purchase"]
    missing = api_a.post(f"/api/v1/slices/{s.pk}/resume/", {"purchase": 999999}, format="json")
    assert missing.status_code == 400 and list(missing.json()["fields"]) == ["purchase"]
    s.refresh_from_db()
    assert s.state == Slice.State.STOPPED and s.runs == 1
    # the same purchase, while minutes remain, resumes it
    same = api_a.post(f"/api/v1/slices/{s.pk}/resume/", {"purchase": purchase.pk}, format="json")
    assert same.status_code == 202, same.content
    assert Slice.objects.get(pk=s.pk).state == Slice.State.RUNNING
