"""A slice on a MIG instance is told what its instance gives: the slice page, the dashboard's
gauge and the API weigh its VRAM against the instance's memory (what the watchdog holds
it to, nodes.devices.vram_quota), not against the smaller tier, and say both."""

from __future__ import annotations

import json
import re
from datetime import timedelta

import pytest
from django.utils import timezone

from nodes.models import Gpu, Node, ProcessSample
from tenants.models import Slice
from tests.incidents.support import running_slice

pytestmark = pytest.mark.django_db

CID = "e" * 64
LINE = "MIG instance 1g.10gb: 9,728 MiB (your tier: 8 GB)"


def node() -> Node:
    return Node.objects.create(
        gate_status="passed", name="gpu-mig-1", address="10.0.0.19", status=Node.Status.ACTIVE
    )


def mig_gpu() -> Gpu:
    return Gpu.objects.create(
        node=node(),
        uuid="GPU-a100-p",
        index=0,
        model="NVIDIA A100-SXM4-80GB",
        vram_total_mb=81920,
        mig_capable=True,
        mig_enabled=True,
        mig_devices=[
            {"uuid": "MIG-a100-p-1", "memory_total_mb": 9728, "profile": "1g.10gb", "gi_id": 9},
        ],
    )


def holding(s: Slice, gpu: Gpu, mb: int) -> Slice:
    ProcessSample.objects.create(
        gpu=gpu, taken_at=timezone.now() - timedelta(seconds=20), pid=77, used_memory_mb=mb,
        container_id=s.container_id,
    )  # fmt: skip
    return s


def test_the_slice_page_says_what_its_mig_instance_gives_and_gauges_against_it(client, owner_a):
    gpu = mig_gpu()
    s = holding(running_slice(owner_a, gpu, cid=CID), gpu, 9728)
    assert s.allocation.mig_device_uuid == "MIG-a100-p-1"
    client.force_login(owner_a.user)
    page = client.get(f"/slices/{s.pk}/").content.decode()
    shown = re.search(r'id="mig-instance">([^<]*)<', page)
    assert shown and shown.group(1).startswith(LINE), page
    # the whole instance in use is 100% of what it may hold, not 119% of its tier
    assert 'data-used-mb="9728" data-quota-mb="9728"' in page and "(100%)" in page
    assert "· quota 9728 MiB" in page
    chart = json.loads(re.search(r'id="slice-chart-data"[^>]*>(.*?)</script>', page).group(1))
    assert chart["quota_mb"] == 9728
    dashboard = client.get("/dashboard/").content.decode()
    assert 'data-used-mb="9728" data-quota-mb="9728"' in dashboard


def test_the_api_gives_the_instance_and_the_tier(api_a, owner_a):
    gpu = mig_gpu()
    s = running_slice(owner_a, gpu, cid=CID)
    body = api_a.get(f"/api/v1/slices/{s.pk}/").json()
    assert body["vram_mb"] == 8192
    assert body["vram_quota"] == {
        "quota_mb": 9728,
        "tier_mb": 8192,
        "mig_profile": "1g.10gb",
        "mig_instance_mb": 9728,
    }
    assert api_a.get(f"/api/v1/slices/{s.pk}/vram/").json()["quota_mb"] == 9728


def test_a_slice_off_mig_shows_its_tier_and_no_instance(client, api_a, owner_a):
    gpu = Gpu.objects.create(
        node=node(), uuid="GPU-l4-p", index=0, model="NVIDIA L4", vram_total_mb=24576
    )
    s = holding(running_slice(owner_a, gpu, cid=CID), gpu, 3000)
    client.force_login(owner_a.user)
    page = client.get(f"/slices/{s.pk}/").content.decode()
    assert 'id="mig-instance"' not in page and "MIG instance" not in page
    assert 'data-used-mb="3000" data-quota-mb="8192"' in page
    assert api_a.get(f"/api/v1/slices/{s.pk}/").json()["vram_quota"] == {
        "quota_mb": 8192,
        "tier_mb": 8192,
        "mig_profile": None,
        "mig_instance_mb": None,
    }
