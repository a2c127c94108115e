"""Volumes in a real browser against the node lab's real Docker Engine: a tenant creates a
volume on its page, launches a slice that mounts it from the launch form, stops it and
resumes it from the slice page; what the first run wrote to the volume is there for the
second (read on the node with a throwaway container)."""

from __future__ import annotations

import re

import pytest

from nodelab import IMAGE
from tenants.models import Image, Slice, Volume
from tests.e2e.test_lifecycle_browser import PASSWORD, SLOW, expect_path, log_in
from tests.tenants.test_lab_volumes import on_node
from tests.worker_harness import wait_for

pytestmark = [pytest.mark.browser, pytest.mark.lab, pytest.mark.django_db(transaction=True)]

# each run appends a line to the volume, then holds a little VRAM as a job would
RECORD = "sh\n-c\necho run >> /data/work/runs && exec gpu-workload"


def test_create_a_volume_launch_with_it_stop_and_resume_and_the_data_is_kept(
    eager, lab_fleet, funded, owner_a, page
):
    fleet = lab_fleet()
    node = fleet.lab.nodes[0]
    Image.objects.create(name="Lab workload", reference=IMAGE, connect=Image.Connect.SERVICE)
    purchase = funded(owner_a, vram_gb=4, hours=2)
    user = owner_a.user
    user.set_password(PASSWORD)
    user.save()

    # 1. a volume from its page
    log_in(page, user.email, PASSWORD, "/volumes/")
    page.fill("#id_name", "work")
    page.fill("#id_size_gb", "1")
    page.click("#create-volume")
    expect_path(page, "/volumes/")
    volume = Volume.objects.get(tenant=owner_a.tenant)
    assert volume.state == Volume.State.READY, volume.state_reason
    assert "work" in page.inner_text(f"#volume-{volume.pk}")

    # 2. the launch form mounts it
    page.goto(f"/launch/?purchase={purchase.pk}")
    page.select_option("#id_image", label="Lab workload")
    page.fill("#id_command", RECORD)
    page.fill("#id_environment", "WORKLOAD_MB=200")
    page.select_option("#id_volume_0", value=str(volume.pk))
    page.fill("#id_volume_path_0", "/data/work")
    page.click("#launch-submit", timeout=SLOW)
    page.wait_for_url(re.compile(r".*/slices/\d+/$"), timeout=SLOW)
    s = Slice.objects.get(tenant=owner_a.tenant)
    assert s.state == Slice.State.RUNNING, s.state_reason
    assert s.allocation.gpu.node_id == volume.node_id
    page.wait_for_selector("text=at /data/work")  # the slice page names its volume
    assert "work" in page.inner_text("main")

    # 3. stop it from its page (asked to confirm); the data is on the node
    page.click("#stop-link")
    page.click("#confirm-stop-button", timeout=SLOW)
    expect_path(page, f"/slices/{s.pk}/", timeout=SLOW)
    s.refresh_from_db()
    assert s.state == Slice.State.STOPPED
    assert on_node(node, volume, "cat", "/v/runs") == "run"

    # 4. resume it: a new container on the volume's node sees the first run's file
    page.click("#resume-link")
    page.click("#resume-slice-button", timeout=SLOW)
    expect_path(page, f"/slices/{s.pk}/", timeout=SLOW)
    s.refresh_from_db()
    assert s.state == Slice.State.RUNNING and s.runs == 2, s.state_reason
    assert page.inner_text("#slice-state") == "running"
    assert wait_for(lambda: on_node(node, volume, "cat", "/v/runs") == "run\nrun", timeout=10)
