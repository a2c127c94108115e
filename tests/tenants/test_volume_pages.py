"""The volume pages against the node emulator: create one from the form, see it with its
size and state, delete it only by typing its name; viewers read but cannot write."""

import pytest

from tenants.models import Role, Volume
from tests.factories import MembershipFactory

pytestmark = pytest.mark.django_db(transaction=True)


def test_create_list_and_delete_a_volume_from_the_pages(eager, worker_fleet, client, owner_a):  # type: ignore[no-untyped-def]
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
):  # type: ignore[no-untyped-def]
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
):  # type: ignore[no-untyped-def]
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
