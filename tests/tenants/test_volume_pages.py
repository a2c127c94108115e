"""The volume pages against the node emulator: create one from the form, see it with its
size and state, delete it only by typing its name; viewers read but cannot write."""

import re

import pytest

from tenants.models import Role, Volume
from tests.factories import MembershipFactory

pytestmark = pytest.mark.django_db(transaction=True)


def test_create_list_and_delete_a_volume_from_the_pages(eager, worker_fleet, client, owner_a):
    fleet = worker_fleet()
    client.force_login(owner_a.user)
    bad = client.post("/volumes/", {"name": "no spaces please", "size_gb": "5"})
    assert bad.status_code == 400 and "a-z, 0-9" in bad.content.decode()
    assert not Volume.objects.exists()
    made = client.post("/volumes/", {"name": "ckpt", "size_gb": "5"})
    assert made.status_code == 302
    volume = Volume.objects.get()
    assert volume.state == "ready" and volume.docker_name in fleet.nodes[0].volumes()
    page = client.get("/volumes/").content.decode()
    assert "ckpt" in page and "5 GB" in page and "credits per GB-hour" in page

    confirm = client.get(f"/volumes/{volume.pk}/delete/").content.decode()
    assert "deleted for good" in confirm
    wrong = client.post(f"/volumes/{volume.pk}/delete/", {"confirm": "ckp"})
    assert wrong.status_code == 400 and "name (ckpt) to confirm" in wrong.content.decode()
    assert Volume.objects.get().state == "ready"
    gone = client.post(f"/volumes/{volume.pk}/delete/", {"confirm": "ckpt"})
    assert gone.status_code == 302
    assert Volume.objects.get().state == "deleted"
    assert volume.docker_name not in fleet.nodes[0].volumes()
    assert 'id="volume-' not in client.get("/volumes/").content.decode()  # not listed


def test_a_viewer_sees_the_volumes_but_cannot_create_or_delete(
    eager, worker_fleet, client, owner_a
):
    worker_fleet()
    client.force_login(owner_a.user)
    client.post("/volumes/", {"name": "ckpt", "size_gb": "5"})
    viewer = MembershipFactory(tenant=owner_a.tenant, role=Role.VIEWER, user__email="v@a.test")
    client.force_login(viewer.user)
    page = client.get("/volumes/").content.decode()
    assert "ckpt" in page and "create-volume" not in page and "Delete…" not in page
    refused = client.post("/volumes/", {"name": "mine", "size_gb": "1"})
    assert refused.status_code == 403 and Volume.objects.count() == 1
    volume = Volume.objects.get()
    kept = client.post(f"/volumes/{volume.pk}/delete/", {"confirm": "ckpt"})
    assert kept.status_code == 403 and Volume.objects.get().state == "ready"


def test_a_stopped_slice_resumes_from_its_page_and_terminates_for_good(
    eager, worker_fleet, client, owner_a, funded, image_ssh
):
    from tests.conftest import launch  # noqa: PLC0415 - the shared launch helper

    worker_fleet()
    first = funded(owner_a, vram_gb=4, hours=1)
    s = launch(owner_a, first, image_ssh)
    client.force_login(owner_a.user)
    page = client.get(f"/slices/{s.pk}/").content.decode()
    assert 'id="terminate-link"' in page and 'id="resume-link"' not in page
    client.post(f"/slices/{s.pk}/stop/", {"confirm": "1"})
    s.refresh_from_db()
    assert s.state == "stopped"
    page = client.get(f"/slices/{s.pk}/").content.decode()
    assert 'id="resume-link"' in page

    other_tier = funded(owner_a, vram_gb=8, hours=1)
    form = client.get(f"/slices/{s.pk}/resume/").content.decode()
    assert f"#{first.pk}:" in form and f"#{other_tier.pk}:" not in form  # its tier only
    resumed = client.post(f"/slices/{s.pk}/resume/", {"purchase": first.pk})
    assert resumed.status_code == 302
    s.refresh_from_db()
    assert s.state == "running" and s.runs == 2

    confirm = client.get(f"/slices/{s.pk}/terminate/").content.decode()
    assert "can never be resumed" in confirm
    ended = client.post(f"/slices/{s.pk}/terminate/", {"confirm": "True"})
    assert ended.status_code == 302
    s.refresh_from_db()
    assert s.state == "stopped" and s.terminated_at is not None
    page = client.get(f"/slices/{s.pk}/").content.decode()
    assert 'id="slice-terminated"' in page and 'id="resume-link"' not in page


def test_the_launch_form_mounts_a_chosen_volume_and_names_the_row_it_refuses(
    eager, worker_fleet, client, owner_a, owner_b, funded, image_ssh
):
    from tenants.models import Slice  # noqa: PLC0415 - beside the models this file reads
    from tests.tenants.test_lifecycle_pages import launch_data  # noqa: PLC0415 - its form data

    worker_fleet()
    purchase = funded(owner_a, vram_gb=4, hours=1)
    client.force_login(owner_b.user)
    client.post("/volumes/", {"name": "theirs", "size_gb": "1"})
    theirs = Volume.objects.get(name="theirs")
    client.force_login(owner_a.user)
    page = client.get("/launch/").content.decode()
    assert 'id="no-volumes"' in page and 'name="volume_0"' not in page  # none yet: a link
    client.post("/volumes/", {"name": "ckpt", "size_gb": "2"})
    mine = Volume.objects.get(name="ckpt")
    page = client.get("/launch/").content.decode()
    offered = re.search(r'<select name="volume_0".*?</select>', page, re.S).group(0)
    assert f'<option value="{mine.pk}">ckpt · 2 GB · on {mine.node.name}</option>' in offered
    assert f'value="{theirs.pk}"' not in offered and "theirs" not in page

    data = launch_data(purchase, image_ssh, volume_0=mine.pk)
    bad = client.post("/launch/", {**data, "volume_path_0": "/data/../etc"})
    assert bad.status_code == 400
    errors = re.search(r'id="id_volume_path_0-error"[^>]*>([^<]*)<', bad.content.decode())
    assert errors and "mount path" in errors.group(1)
    stolen = client.post("/launch/", {**data, "volume_0": theirs.pk, "idempotency_token": "t2"})
    assert stolen.status_code == 400 and "valid choice" in stolen.content.decode()
    no_path = client.post("/launch/", {**data, "volume_path_0": "", "idempotency_token": "t3"})
    assert no_path.status_code == 400 and "under /data or /workspace" in no_path.content.decode()
    assert not Slice.objects.exists()  # nothing launched, nothing charged

    done = client.post(
        "/launch/", {**data, "volume_path_0": "/data/ckpt", "idempotency_token": "t4"}
    )
    assert done.status_code == 302
    s = Slice.objects.get()
    assert [(m.volume_id, m.path) for m in s.mounts.all()] == [(mine.pk, "/data/ckpt")]
    assert s.state == "running" and s.allocation.gpu.node_id == mine.node_id
