"""Fleet API, ops pages and /metrics: ops only, validated input, downsampled series."""

from datetime import timedelta

import pytest
from django.utils import timezone

from nodes import services
from nodes.models import Gpu, GpuSample, Node
from tests.api_contract import OpsResourceContract

pytestmark = pytest.mark.django_db


@pytest.fixture
def node(db):
    node = Node.objects.create(
        gate_status="passed",
        name="n1",
        address="10.0.0.1",
        host_key="ssh-ed25519 AAAA",
        status="active",
    )
    Gpu.objects.create(
        node=node,
        uuid="GPU-1",
        index=0,
        model="NVIDIA L4",
        vram_total_mb=23034,
        last_memory_used_mb=2000,
        last_sample_at=timezone.now(),
    )
    return node


class TestNodesApi(OpsResourceContract):
    list_url = "/api/v1/nodes/"
    filters = {"status": ("active", "unreachable")}

    def make(self, membership):
        n = Node.objects.count()
        node = Node.objects.create(
            gate_status="passed",
            name=f"node-{n}",
            address=f"10.9.0.{n + 1}",
            host_key="ssh-ed25519 AAAA",
            status="active",
        )
        Gpu.objects.create(
            node=node, uuid=f"GPU-n{n}", index=0, model="NVIDIA A30", vram_total_mb=24576
        )
        return node


class TestGpusApi(OpsResourceContract):
    list_url = "/api/v1/gpus/"
    filters = {"model": ("NVIDIA H100 80GB HBM3", "NVIDIA L4")}

    def make(self, membership):
        n = Node.objects.count()
        node = Node.objects.create(
            gate_status="passed", name=f"gnode-{n}", address=f"10.8.0.{n + 1}"
        )
        return Gpu.objects.create(
            node=node, uuid=f"GPU-g{n}", index=0, model="NVIDIA H100 80GB HBM3", vram_total_mb=81559
        )


def test_register_node_through_api_validates_and_pins(api_ops, django_capture_on_commit_callbacks):
    bad = api_ops.post(
        "/api/v1/nodes/", {"name": "x", "address": "10.0.0.9; reboot"}, format="json"
    )
    assert bad.status_code == 400
    assert bad.json()["fields"]["address"][0]["code"] == "invalid_address"
    bad_key = api_ops.post(
        "/api/v1/nodes/",
        {"name": "x", "address": "10.0.0.9", "host_key": "ssh-ed25519 !!!"},
        format="json",
    )
    assert bad_key.status_code == 400 and "host_key" in bad_key.json()["fields"]
    unknown = api_ops.post(
        "/api/v1/nodes/", {"name": "x", "address": "10.0.0.9", "privileged": True}, format="json"
    )
    assert unknown.status_code == 400 and "privileged" in unknown.json()["fields"]
    with django_capture_on_commit_callbacks() as callbacks:
        ok = api_ops.post("/api/v1/nodes/", {"name": "gpu-7", "address": "10.0.0.9"}, format="json")
    assert ok.status_code == 201, ok.content
    assert ok.json()["status"] == "pending" and ok.json()["host_key_fingerprint"] == ""
    assert len(callbacks) == 1  # the host-key scan, dispatched after commit
    dup = api_ops.post("/api/v1/nodes/", {"name": "gpu-7", "address": "10.0.0.10"}, format="json")
    assert dup.status_code == 409 and dup.json()["code"] == "duplicate_name"


@pytest.mark.parametrize("network", ["host", "container:db", "--privileged", "", "a b"])
def test_a_node_network_that_would_not_isolate_slices_is_refused(api_ops, network):
    bad = api_ops.post(
        "/api/v1/nodes/",
        {"name": "gpu-8", "address": "10.0.0.8", "container_network": network},
        format="json",
    )
    assert bad.status_code == 400, bad.content
    assert "container_network" in bad.json()["fields"]
    assert not Node.objects.filter(name="gpu-8").exists()


def test_a_node_keeps_its_container_network_and_slices_use_it(
    api_ops, django_capture_on_commit_callbacks
):
    with django_capture_on_commit_callbacks():
        made = api_ops.post(
            "/api/v1/nodes/",
            {"name": "gpu-8", "address": "10.0.0.8", "container_network": "none"},
            format="json",
        )
    assert made.status_code == 201 and made.json()["container_network"] == "none"
    node = Node.objects.get(name="gpu-8")
    changed = api_ops.patch(
        f"/api/v1/nodes/{node.pk}/", {"container_network": "gpu-net"}, format="json"
    )
    assert changed.status_code == 200 and changed.json()["container_network"] == "gpu-net"


def test_drain_and_undrain_through_api(api_ops, node):
    response = api_ops.post(
        f"/api/v1/nodes/{node.pk}/drain/", {"reason": "maintenance"}, format="json"
    )
    assert response.status_code == 200 and response.json()["status"] == "draining"
    assert response.json()["drain_reason"] == "maintenance"
    response = api_ops.post(f"/api/v1/nodes/{node.pk}/undrain/", {}, format="json")
    assert response.json()["status"] == "active"


def test_approve_without_pending_key_is_409(api_ops, node):
    response = api_ops.post(
        f"/api/v1/nodes/{node.pk}/approve-host-key/", {"fingerprint": "SHA256:x"}, format="json"
    )
    assert response.status_code == 409 and response.json()["code"] == "nothing_pending"


def test_gpu_samples_are_downsampled_to_max_points(api_ops, node):
    gpu = node.gpus.get()
    end = timezone.now()
    start = end - timedelta(hours=2)
    GpuSample.objects.bulk_create(
        [
            GpuSample(
                gpu=gpu,
                taken_at=start + timedelta(seconds=5 * i),
                memory_used_mb=i % 1000,
                memory_total_mb=23034,
                utilization_gpu=i % 100,
            )
            for i in range(1440)
        ]
    )
    url = f"/api/v1/gpus/{gpu.pk}/samples/"
    body = api_ops.get(url, {"start": start.isoformat(), "end": end.isoformat()}).json()
    assert 100 < len(body["points"]) <= 500
    assert max(p["used_max_mb"] for p in body["points"]) == 999
    few = api_ops.get(
        url, {"start": start.isoformat(), "end": end.isoformat(), "max_points": 50}
    ).json()
    assert len(few["points"]) <= 50
    assert api_ops.get(url, {"start": "yesterday"}).status_code == 400
    reversed_range = api_ops.get(url, {"start": end.isoformat(), "end": start.isoformat()})
    assert reversed_range.status_code == 400
    assert api_ops.get(url, {"max_points": 5000}).status_code == 400


def test_metrics_needs_the_token_and_speaks_dcgm(client, node, settings):
    settings.METRICS_TOKEN = ""
    assert client.get("/metrics").status_code == 404
    settings.METRICS_TOKEN = "s3cret-metrics-token"
    assert client.get("/metrics").status_code == 401
    assert client.get("/metrics", HTTP_AUTHORIZATION="Bearer wrong").status_code == 401
    response = client.get("/metrics", HTTP_AUTHORIZATION="Bearer s3cret-metrics-token")
    assert response.status_code == 200
    text = response.content.decode()
    assert "# TYPE DCGM_FI_DEV_FB_USED gauge" in text
    assert (
        'DCGM_FI_DEV_FB_USED{gpu="0",UUID="GPU-1",modelName="NVIDIA L4",Hostname="n1"} 2000' in text
    )
    assert (
        'DCGM_FI_DEV_FB_TOTAL{gpu="0",UUID="GPU-1",modelName="NVIDIA L4",Hostname="n1"} 23034'
        in text
    )
    assert 'gpuplatform_node_status{Hostname="n1",status="active"} 1' in text
    assert "gpuplatform_gpu_sample_age_seconds" in text


def test_fleet_pages_are_ops_only_and_live(client, owner_a, ops_user, node):
    client.force_login(owner_a.user)
    assert client.get("/ops/fleet/").status_code == 302
    assert client.get(f"/ops/nodes/{node.pk}/").status_code == 302
    client.force_login(ops_user)
    page = client.get("/ops/fleet/").content.decode()
    assert "n1" in page and 'data-heat="9"' in page and "every 10s" in page
    # the refresh answers with out-of-band swaps only: a version the page did not hold
    # gets the whole heatmap, with the version to hold from now on
    partial = client.get("/ops/fleet/", HTTP_HX_REQUEST="true").content.decode()
    assert partial.lstrip().startswith('<input type="hidden" id="fleet-version"')
    assert "<html" not in partial and '<div id="heatmap"' in partial
    assert 'data-heat="9"' in partial
    detail = client.get(f"/ops/nodes/{node.pk}/").content.decode()
    assert f"/api/v1/gpus/{node.gpus.get().pk}/samples/" in detail


def test_node_pages_drain_and_register(client, ops_user, node, django_capture_on_commit_callbacks):
    client.force_login(ops_user)
    client.post(f"/ops/nodes/{node.pk}/drain/", {"reason": "swap PSU"})
    node.refresh_from_db()
    assert node.status == "draining" and node.drain_reason == "swap PSU"
    client.post(f"/ops/nodes/{node.pk}/undrain/")
    node.refresh_from_db()
    assert node.status == "active"
    response = client.post(
        "/ops/nodes/new/",
        {"name": "bad name", "address": "10.0.0.5", "port": 22, "ssh_user": "gpuplatform"},
    )
    assert response.status_code == 200 and "lower-case letters" in response.content.decode()
    with django_capture_on_commit_callbacks():
        response = client.post(
            "/ops/nodes/new/",
            {"name": "gpu-9", "address": "10.0.0.5", "port": 22, "ssh_user": "gpuplatform"},
        )
    assert response.status_code == 302
    assert Node.objects.get(name="gpu-9").status == "pending"


def test_update_to_a_new_address_drops_the_pinned_key(node, django_capture_on_commit_callbacks):
    node.host_key = (
        "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIOMqqnkVzrm0SdG6UOoqKLsabgH5C9okWi0dh2l9GKJl"
    )
    node.save()
    with django_capture_on_commit_callbacks():
        services.node_update(node=node, address="10.0.0.77")
    node.refresh_from_db()
    assert node.host_key == "" and node.status == "pending"
