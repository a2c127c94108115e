"""The fleet end to end over real SSH to the node emulator: discovery, sampling through
both telemetry paths, pinned host keys, unreachable and recovery, quoting, retention."""

from datetime import timedelta

import pytest
from django.utils import timezone

from gpuplatform.errors import ServiceError
from nodes import hooks, services, ssh
from nodes.docker_messages import cli_error_line
from nodes.models import Gpu, GpuSample, GpuSampleRollup, Node, ProcessSample, RollupProgress

pytestmark = pytest.mark.django_db


def test_discovery_reads_gpus_driver_and_capabilities(fleet, pool, register):
    node = register(0)
    services.node_discover(node_id=node.pk, pool=pool)
    node.refresh_from_db()
    emu_gpus = fleet.nodes[0].gpus
    gpus = list(node.gpus.order_by("index"))
    assert [g.uuid for g in gpus] == [g.uuid for g in emu_gpus]
    assert all(g.vram_total_mb > 20000 and g.model.startswith("NVIDIA") for g in gpus)
    assert node.status == Node.Status.ACTIVE
    assert node.driver_version and node.cuda_version
    assert node.capabilities["docker"] and node.capabilities["nvidia_runtime"]
    assert node.sample_source == "nvml"
    # rediscovery after a GPU vanished flags it, never deletes it
    gone = gpus[-1]
    Gpu.objects.filter(pk=gone.pk).update(uuid="GPU-00000000-dead-beef-0000-000000000000")
    services.node_discover(node_id=node.pk, pool=pool)
    ghost = Gpu.objects.get(pk=gone.pk)
    assert ghost.present is False and ghost.accepting_placements is False
    assert node.gpus.filter(present=True).count() == len(emu_gpus)


def test_sampling_stores_gpu_and_process_rows(fleet, pool, register):
    node = register(0)
    services.node_discover(node_id=node.pk, pool=pool)
    emu = fleet.nodes[0]
    pid = emu.add_gpu_process(0, used_mb=3000, sm=55)
    seen = []
    hook = hooks.register_sample_hook(seen.append)
    try:
        result = services.nodes_sample(node_ids=[node.pk], pool=pool)
    finally:
        hooks.unregister_sample_hook(hook)
    gpu_count = node.gpus.count()
    assert result == {
        "nodes": 1,
        "sampled": 1,
        "failed": 0,
        "gpu_rows": gpu_count,
        "process_rows": result["process_rows"],
    }
    assert GpuSample.objects.filter(gpu__node=node).count() == gpu_count
    gpu0 = node.gpus.get(index=0)
    assert gpu0.last_memory_used_mb >= 3000 and gpu0.last_sample_at is not None
    proc = ProcessSample.objects.get(gpu=gpu0, pid=pid)
    assert proc.used_memory_mb == 3000
    assert len(seen) == 1 and seen[0].samples[node.pk].gpus


def test_container_started_with_docker_shows_up_with_its_id(fleet, pool, register):
    node = register(0)
    services.node_discover(node_id=node.pk, pool=pool)
    gpu = node.gpus.get(index=0)
    endpoint = ssh.endpoint_for(node)
    run = pool.run(
        endpoint,
        [
            "docker",
            "run",
            "-d",
            "--gpus",
            f"device={gpu.uuid}",
            "-e",
            "GPUPLATFORM_EMULATOR_PROFILE=steady",
            "-e",
            "GPUPLATFORM_EMULATOR_MB=2048",
            "--label",
            "gpuplatform.owner=slice-42",
            "pytorch/pytorch:2.4.0",
            "python",
            "train.py",
        ],
    )
    assert run.ok, run.stderr
    container_id = run.stdout.decode().strip()
    assert len(container_id) == 64
    fleet.advance(30)
    services.nodes_sample(node_ids=[node.pk], pool=pool)
    proc = ProcessSample.objects.filter(gpu=gpu, container_id=container_id).first()
    assert proc is not None and proc.used_memory_mb > 0


def test_nvidia_smi_fallback_when_node_has_no_nvml(fleet, pool, register):
    node = register(1)
    services.node_discover(node_id=node.pk, pool=pool)
    fleet.nodes[1].set_nvml_available(False)
    fleet.nodes[1].add_gpu_process(0, used_mb=1500)
    services.nodes_sample(node_ids=[node.pk], pool=pool)
    node.refresh_from_db()
    assert node.sample_source == "nvidia-smi"
    assert GpuSample.objects.filter(gpu__node=node).count() == node.gpus.count()
    assert ProcessSample.objects.filter(gpu__node=node, used_memory_mb=1500).exists()


def test_unknown_host_key_is_read_then_approved_by_fingerprint(fleet, pool, register):
    node = register(0, host_key="")
    assert node.status == Node.Status.PENDING and not node.host_key
    services.node_scan_host_key(node_id=node.pk)
    node.refresh_from_db()
    assert node.pending_host_key and not node.host_key  # read, not trusted
    assert fleet.nodes[0].audit_log == []  # nothing was run on the node
    with pytest.raises(ServiceError, match="does not match"):
        services.node_approve_host_key(node=node, fingerprint="SHA256:someone-else")
    services.node_approve_host_key(node=node, fingerprint=fleet.nodes[0].host_key_fingerprint())
    node.refresh_from_db()
    assert node.host_key_fingerprint == fleet.nodes[0].host_key_fingerprint()
    services.node_discover(node_id=node.pk, pool=pool)
    assert node.gpus.count() == len(fleet.nodes[0].gpus)


def test_changed_host_key_is_refused_and_nothing_is_sent(fleet, pool, register):
    node = register(0)
    services.node_discover(node_id=node.pk, pool=pool)
    emu = fleet.nodes[0]
    emu.rotate_host_key()
    pool.close()  # a fresh connection must handshake again
    emu.clear_audit()
    result = services.nodes_sample(node_ids=[node.pk], pool=pool)
    assert result["failed"] == 1
    node.refresh_from_db()
    assert node.status == Node.Status.UNREACHABLE  # at once, not after three tries
    assert "host key changed" in node.status_reason
    assert emu.audit_log == []
    with pytest.raises(ssh.HostKeyMismatch):
        pool.run(ssh.endpoint_for(node), ["true"])


def test_unanswered_node_goes_unreachable_and_recovers(fleet, pool, register, settings):
    node = register(0)
    services.node_discover(node_id=node.pk, pool=pool)
    emu = fleet.nodes[0]
    emu.set_down(True)
    pool.close()
    for attempt in range(1, 4):
        pool._backoff.clear()  # the test does not wait out the reconnect backoff
        services.nodes_sample(node_ids=[node.pk], pool=pool)
        node.refresh_from_db()
        assert node.consecutive_failures == attempt
        expected = Node.Status.UNREACHABLE if attempt >= 3 else Node.Status.ACTIVE
        assert node.status == expected, attempt
    assert node.last_error
    emu.set_down(False)
    pool._backoff.clear()
    assert services.nodes_sample(node_ids=[node.pk], pool=pool)["sampled"] == 1
    node.refresh_from_db()
    assert node.status == Node.Status.ACTIVE and node.consecutive_failures == 0


def test_reconnect_backs_off_after_a_failure(fleet, pool, register):
    node = register(0)
    fleet.nodes[0].set_down(True)
    endpoint = ssh.endpoint_for(node)
    with pytest.raises(ssh.SSHError, match="cannot connect|handshake"):
        pool.run(endpoint, ["true"])
    fleet.nodes[0].set_down(False)
    with pytest.raises(ssh.SSHError, match="retrying in"):
        pool.run(endpoint, ["true"])  # within the backoff: no new connection attempt


def test_slow_node_times_out_instead_of_hanging(fleet, platform_key, register):
    node = register(0)
    fleet.nodes[0].set_delay(3)
    quick = ssh.SSHPool(private_key=platform_key, connect_timeout=2, command_timeout=1)
    try:
        with pytest.raises(ssh.CommandTimeout):
            quick.run(ssh.endpoint_for(node), ["nvidia-smi", "-L"])
    finally:
        quick.close()


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("address", "127.0.0.1; touch /tmp/pwned"),
        ("address", "$(touch /tmp/pwned)"),
        ("name", "node`touch /tmp/pwned`"),
        ("ssh_user", "root;id"),
        ("address", "a b"),
    ],
)
def test_shell_metacharacters_in_registration_are_refused(fleet, field, value):
    data = {
        "name": "ok-node",
        "address": "127.0.0.1",
        "port": fleet.nodes[0].port,
        "ssh_user": "gpuplatform",
        field: value,
    }
    with pytest.raises(ServiceError) as info:
        services.node_register(**data)
    assert info.value.field == field
    assert not Node.objects.exists()


def test_crafted_arguments_reach_the_node_as_one_quoted_argument(fleet, pool, register):
    node = register(0)
    emu = fleet.nodes[0]
    emu.clear_audit()
    crafted = "x; touch /tmp/pwned && echo $(id) `id` | sh\nrm -rf /"
    result = pool.run(ssh.endpoint_for(node), ["echo", crafted])
    assert result.ok
    assert result.stdout.decode() == crafted + "\n"
    assert emu.audit_log == [["echo", crafted]]
    assert "/tmp/pwned" not in emu.files
    # the emulator is a real shell: the same text unquoted would have run every part
    emu.execute(f"echo {crafted}")
    assert ["touch", "/tmp/pwned"] in emu.audit_log
    assert ["rm", "-rf", "/"] in emu.audit_log


def test_retention_prunes_raw_samples_and_keeps_rollups(register, settings):
    node = register(0)
    gpu = Gpu.objects.create(
        node=node, uuid="GPU-r", index=0, model="NVIDIA L4", vram_total_mb=23034
    )
    now = timezone.now().replace(second=0, microsecond=0)
    old = now - timedelta(hours=settings.NODES_RAW_RETENTION_HOURS + 3)
    old = old - timedelta(minutes=old.minute % 5)  # start of a five-minute bucket
    rows = [
        GpuSample(
            gpu=gpu,
            taken_at=old + timedelta(seconds=30 * i),
            memory_used_mb=used,
            memory_total_mb=23034,
            utilization_gpu=util,
        )
        for i, (used, util) in enumerate([(1000, 10), (3000, 50), (2000, 30)])
    ]
    recent = GpuSample(
        gpu=gpu,
        taken_at=now - timedelta(minutes=1),
        memory_used_mb=500,
        memory_total_mb=23034,
        utilization_gpu=5,
    )
    ancient = GpuSampleRollup(
        gpu=gpu,
        bucket_start=now - timedelta(days=40),
        samples=1,
        memory_total_mb=23034,
        memory_used_max_mb=1,
        memory_used_mean_mb=1.0,
    )
    GpuSample.objects.bulk_create([*rows, recent])
    ancient.save()
    # the last run rolled up to just before the old rows
    RollupProgress.objects.create(series="gpu_5min", rolled_through=old - timedelta(minutes=5))
    result = services.samples_rollup_and_prune(now=now)
    rollup = GpuSampleRollup.objects.get(gpu=gpu, bucket_start=old)
    assert rollup.samples == 3
    assert rollup.memory_used_max_mb == 3000
    assert rollup.memory_used_mean_mb == pytest.approx(2000)
    assert rollup.utilization_gpu_max == 50
    assert not GpuSample.objects.filter(taken_at__lt=now - timedelta(hours=1)).exists()
    assert GpuSample.objects.filter(pk=recent.pk).exists()
    assert not GpuSampleRollup.objects.filter(pk=ancient.pk).exists()
    assert result["raw_deleted"] == 3
    # running it again changes nothing
    services.samples_rollup_and_prune(now=now)
    assert GpuSampleRollup.objects.get(gpu=gpu, bucket_start=old).samples == 3


def test_a_docker_cli_error_is_reported_by_its_error_line_not_its_usage_hint() -> None:
    # what Docker 20.10 and Docker 28 print when the daemon refuses a run
    old = b"docker: Error response from daemon: No such image: x:1.\nSee 'docker run --help'.\n"
    new = (
        b"docker: Error response from daemon: No such image: x:1\n\n"
        b"Run 'docker run --help' for more information\n"
    )
    assert cli_error_line(old) == "Error response from daemon: No such image: x:1."
    assert cli_error_line(new) == "Error response from daemon: No such image: x:1"
