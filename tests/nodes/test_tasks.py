"""Fleet tasks: beat's fan-out samples every node in batches through the worker's pool."""

import pytest
from django.conf import settings as django_settings

from emulator import EmulatedFleet
from gpuplatform.celery import app
from nodes import services, ssh, tasks
from nodes.models import GpuSample, Node, NodeAgent
from tests.conftest import use_probe_image

pytestmark = pytest.mark.django_db


@pytest.fixture
def worker_pool(settings, tmp_path):
    """The per-process pool as a worker builds it: the platform key from settings."""
    settings.NODES_SSH_KEY_PATH = str(tmp_path / "ssh" / "id_ed25519")
    ssh.reset_pool()
    use_probe_image()
    pool = ssh.get_pool()
    yield pool
    ssh.reset_pool()


@pytest.fixture
def eager():
    app.conf.task_always_eager = True
    yield
    app.conf.task_always_eager = False


def test_beat_samples_the_fleet_every_interval():
    entry = django_settings.CELERY_BEAT_SCHEDULE["sample-fleet"]
    assert entry["task"] == "telemetry.fan_out"
    assert entry["schedule"] == float(django_settings.NODES_SAMPLE_INTERVAL) == 30.0
    route = app.amqp.router.route({}, "telemetry.sample_nodes")
    assert route["queue"].name == "telemetry"


def discovered_fleet(pool, tmp_path, capture, count: int = 3) -> EmulatedFleet:
    """`count` emulated nodes, registered with pinned keys and discovered."""
    public = ssh.public_key_line(pool.private_key)
    fleet = EmulatedFleet.start(count=count, authorized_keys=[public], state_dir=tmp_path / "emu")
    for emu in fleet.nodes:
        with capture(execute=False):
            node = services.node_register(
                name=emu.name, address="127.0.0.1", port=emu.port, host_key=emu.host_key_line()
            )
        services.node_discover(node_id=node.pk)
    return fleet


def test_fan_out_samples_every_node_in_batches(
    worker_pool, eager, tmp_path, monkeypatch, django_capture_on_commit_callbacks
):
    monkeypatch.setattr(tasks, "SAMPLE_BATCH_SIZE", 2)
    fleet = discovered_fleet(worker_pool, tmp_path, django_capture_on_commit_callbacks)
    try:
        pending = Node.objects.create(
            gate_status="passed", name="waiting", address="10.0.0.1"
        )  # no key yet
        dispatched = []
        original = tasks.sample_nodes.apply_async

        def record(*args, **kwargs):
            dispatched.append(kwargs["args"][0])
            return original(*args, **kwargs)

        monkeypatch.setattr(tasks.sample_nodes, "apply_async", record)
        assert tasks.fan_out.apply().get() == 3
        assert [len(batch) for batch in dispatched] == [2, 1]
        assert pending.pk not in sum(dispatched, [])
        for node in Node.objects.exclude(pk=pending.pk):
            assert GpuSample.objects.filter(gpu__node=node).count() == node.gpus.count()
        # a node there before the gate (never judged) is judged at the next fan-out
        first = Node.objects.get(name=fleet.nodes[0].name)
        Node.objects.filter(pk=first.pk).update(gate_status="unchecked")
        assert tasks.fan_out.apply().get() == 3
        first.refresh_from_db()
        assert first.gate_status == "passed" and first.gate_checked_at is not None
    finally:
        fleet.stop()


def test_beat_checks_every_nodes_agent_in_small_batches(
    worker_pool, eager, tmp_path, monkeypatch, django_capture_on_commit_callbacks
):
    """Every 5 s, every node's agent: its journal pulled and its health judged, in tasks
    of a few nodes that the telemetry workers take in parallel."""
    entry = django_settings.CELERY_BEAT_SCHEDULE["node-agents"]
    assert entry["task"] == "telemetry.agents_check" and entry["schedule"] == 5.0
    assert app.amqp.router.route({}, "telemetry.agent_check")["queue"].name == "telemetry"
    monkeypatch.setattr(tasks, "AGENT_BATCH_SIZE", 2)
    fleet = discovered_fleet(worker_pool, tmp_path, django_capture_on_commit_callbacks)
    try:
        fleet.nodes[0].state.agent.running = False  # its loop stopped
        dispatched = []
        original = tasks.agent_check.apply_async

        def record(*args, **kwargs):
            dispatched.append(kwargs["args"][0])
            return original(*args, **kwargs)

        monkeypatch.setattr(tasks.agent_check, "apply_async", record)
        assert tasks.agents_check.apply().get() == 3
        assert [len(batch) for batch in dispatched] == [2, 1]
        # the first node's agent was found silent and installed again
        first = NodeAgent.objects.get(node__name=fleet.nodes[0].name)
        assert first.installed_at is not None and fleet.nodes[0].state.agent.running
    finally:
        fleet.stop()
