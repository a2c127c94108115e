"""Failure paths found in review: each of these once lost data or answered 500."""

from datetime import timedelta

import pytest
from django.utils import timezone

from nodes import services
from nodes.models import Gpu, GpuSample, GpuSampleRollup, Node

pytestmark = pytest.mark.django_db


def test_a_long_dead_node_does_not_cost_its_neighbours_their_samples(fleet, pool, register):
    healthy = register(0)
    services.node_discover(node_id=healthy.pk, pool=pool)
    dead = register(1)
    services.node_discover(node_id=dead.pk, pool=pool)
    Node.objects.filter(pk=dead.pk).update(consecutive_failures=32767)
    fleet.nodes[1].set_down(True)
    pool.close()
    result = services.nodes_sample(node_ids=[healthy.pk, dead.pk], pool=pool)
    assert result["sampled"] == 1 and result["failed"] == 1
    assert GpuSample.objects.filter(gpu__node=healthy).count() == healthy.gpus.count()
    dead.refresh_from_db()
    assert dead.consecutive_failures == 32767 and dead.status == Node.Status.UNREACHABLE


def test_a_malformed_pinned_key_fails_that_node_only(fleet, pool, register):
    good = register(0)
    services.node_discover(node_id=good.pk, pool=pool)
    bad = register(1)
    Node.objects.filter(pk=bad.pk).update(host_key="ssh-ed25519 !!!not-base64")
    pool.close()
    result = services.nodes_sample(node_ids=[good.pk, bad.pk], pool=pool)
    assert result["sampled"] == 1 and result["failed"] == 1
    bad.refresh_from_db()
    assert "pinned host key is unusable" in bad.last_error


def test_a_gpu_moved_to_another_node_follows_it(fleet, pool, register):
    node = register(0)
    other = Node.objects.create(gate_status="passed", name="old-home", address="10.0.0.50")
    uuid = fleet.nodes[0].gpus[0].uuid
    moved = Gpu.objects.create(node=other, uuid=uuid, index=7, model="x", vram_total_mb=1)
    services.node_discover(node_id=node.pk, pool=pool)
    moved.refresh_from_db()
    assert moved.node_id == node.pk and moved.present and moved.vram_total_mb > 1


def test_first_rollup_run_summarises_old_samples_before_pruning(register, settings):
    node = register(0)
    gpu = Gpu.objects.create(node=node, uuid="GPU-first", index=0, model="L4", vram_total_mb=23034)
    old = timezone.now() - timedelta(hours=settings.NODES_RAW_RETENTION_HOURS + 6)
    GpuSample.objects.create(
        gpu=gpu, taken_at=old, memory_used_mb=4321, memory_total_mb=23034, utilization_gpu=9
    )
    result = services.samples_rollup_and_prune()
    assert result["raw_deleted"] == 1
    assert GpuSampleRollup.objects.get(gpu=gpu).memory_used_max_mb == 4321


def test_odd_inputs_are_4xx_not_500(client, api_ops, settings):
    node = Node.objects.create(gate_status="passed", name="n", address="10.0.0.9")
    gpu = Gpu.objects.create(node=node, uuid="GPU-x", index=0, model="L4", vram_total_mb=1)
    url = f"/api/v1/gpus/{gpu.pk}/samples/"
    assert api_ops.get(url, {"end": "0001-01-01T00:00:00Z"}).status_code == 400
    assert api_ops.get(url, {"start": "9999-12-31T23:59:59Z"}).status_code == 400
    settings.METRICS_TOKEN = "tok"
    assert client.get("/metrics", HTTP_AUTHORIZATION="Bearer t\u00f6k").status_code == 401
