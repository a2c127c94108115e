"""The VRAM quota is the node's, not the process's: against the node lab (real sshd and
Docker Engine, the quota library a HAMi-core stand-in that obeys its environment as
HAMi-core does), no process inside a slice lifts its own limit, whatever it sets or
unsets, and what escapes the library altogether (a statically linked job) is stopped by
the watchdog's second count within two samples, its neighbours untouched."""

from __future__ import annotations

import pytest

from emulator.catalog import GpuSpec
from incidents.models import Incident
from nodelab import IMAGE, LabNodeSpec
from nodelab.labnode import REMAP_RANGE
from nodes import services as node_services
from nodes.models import Allocation
from tenants import services
from tenants.models import Slice
from tests.conftest import SSH_KEY
from tests.incidents.test_chaos import MODEL, launcher
from tests.worker_harness import wait_for

pytestmark = [pytest.mark.lab, pytest.mark.django_db(transaction=True)]

TIER_GB = 8
QUOTA_MB = TIER_GB * 1024
HOLD_MB = 2000  # what the slice's own job holds while the attempts run beside it
PAST_MB = 12000  # past the 8 GB tier, well within the 24 GB card
WORKLOAD = "gpu-workload"
# A job that takes PAST_MB at once and dies with PyTorch's message if refused.
GREEDY = (
    "WORKLOAD_PROFILE=steady",
    f"WORKLOAD_MB={PAST_MB}",
    f"WORKLOAD_STEP_MB={PAST_MB}",
    "WORKLOAD_COOPERATIVE=0",
    "WORKLOAD_EXIT_AFTER_S=3",  # it stops by itself if it ever got its memory
)
# Each a process a tenant could start inside a running slice (a shell session, a
# script): its own environment set or unset so that HAMi-core's own settings say "no
# limit", "80 GB", "not loaded" or "books elsewhere".
ATTEMPTS = {
    "disable-control": ["env", "CUDA_DISABLE_CONTROL=true", *GREEDY, WORKLOAD],
    "own-80gb-limit": [
        "env",
        "CUDA_DEVICE_MEMORY_LIMIT=80g",
        "CUDA_DEVICE_MEMORY_LIMIT_0=80g",
        *GREEDY,
        WORKLOAD,
    ],
    "without-ld-preload": ["env", "-u", "LD_PRELOAD", *GREEDY, WORKLOAD],
    "own-books": ["env", "CUDA_DEVICE_MEMORY_SHARED_CACHE=/tmp/mine.cache", *GREEDY, WORKLOAD],
    "shell-session": [
        "sh",
        "-c",
        "export CUDA_DISABLE_CONTROL=true CUDA_DEVICE_MEMORY_LIMIT=80g; unset LD_PRELOAD; "
        f"exec env {' '.join(GREEDY)} {WORKLOAD}",
    ],
}


def held_mb(lab, s: Slice) -> int:
    return sum(p["used"] for p in lab.gpu_processes(s.container_id)) >> 20


def running(s: Slice) -> Slice:
    s.refresh_from_db()
    assert s.state == Slice.State.RUNNING, s.state_reason
    return s


def test_no_process_inside_a_slice_lifts_its_quota_whatever_its_environment_says(
    eager, lab_fleet, funded, lab_image, owner_a
):
    fleet = lab_fleet()
    lab = fleet.nodes[0]
    s = running(
        launcher(funded, lab_image)(
            owner_a, TIER_GB, WORKLOAD_MB=str(HOLD_MB), WORKLOAD_STEP_MB="500"
        )
    )
    assert wait_for(lambda: held_mb(lab, s) == HOLD_MB)
    # what the node put in: the settings read-only, the library named by ld.so.preload
    assert lab.docker("exec", s.container_id, "cat", "/etc/ld.so.preload").stdout.strip() == (
        lab.quota_library
    )
    override = lab.docker("exec", s.container_id, "cat", "/overrideEnv").stdout
    assert f"CUDA_DEVICE_MEMORY_LIMIT={QUOTA_MB}m" in override.splitlines()
    assert "CUDA_DISABLE_CONTROL=false" in override.splitlines()
    tamper = lab.docker("exec", s.container_id, "sh", "-c", "echo x >> /overrideEnv", check=False)
    assert tamper.returncode != 0 and "Read-only" in tamper.stderr
    for name, argv in ATTEMPTS.items():
        run = lab.docker("exec", s.container_id, *argv, check=False)
        out = run.stdout + run.stderr
        assert run.returncode != 0, (name, out)
        assert "[vramquota] refused" in out and "CUDA out of memory" in out, (name, out)
        # the attempt is gone and never held more than the tier left; the job is untouched
        assert held_mb(lab, s) == HOLD_MB, name
    assert running(s).state == Slice.State.RUNNING


def test_a_first_process_that_sets_its_own_limit_is_held_to_the_nodes(
    eager, lab_fleet, funded, lab_image, owner_a
):
    """The slice's own command is the first process: in HAMi-core it writes the limit
    into the container's books for every later process. The launch's courtesy check
    cannot see a variable spelled at run time (`eval` of a value), the node still holds."""
    fleet = lab_fleet()
    lab = fleet.nodes[0]
    payload = (
        "env -u GPUPLATFORM_VRAM_LIMIT_MB CUDA_DISABLE_CONTROL=true "
        f"CUDA_DEVICE_MEMORY_LIMIT=80g {WORKLOAD}"
    )
    s, _ = launcher_with_command(funded, lab_image, owner_a, ["sh", "-c", 'eval "$JOB"'], payload)
    s = running(s)
    assert wait_for(lambda: "allocation refused" in lab.logs(s.container_id))
    log = lab.logs(s.container_id)
    assert f"device memory limit {QUOTA_MB} MiB" in log
    assert held_mb(lab, s) <= QUOTA_MB


def launcher_with_command(funded, image, member, command, job):
    return services.slice_launch(
        membership=member,
        purchase=funded(member, vram_gb=TIER_GB, hours=2),
        image=image,
        model_request=MODEL,
        command=command,
        # cooperative (its framework cap unset by the payload): it holds at the refusal
        # instead of dying, so it can be looked at
        environment={
            "JOB": job,
            "WORKLOAD_PROFILE": "ramp",
            "WORKLOAD_MB": "4000",
            "WORKLOAD_PEAK_MB": str(PAST_MB),
            "WORKLOAD_RATE_MB_PER_MIN": "600000",
            "WORKLOAD_STEP_MB": "1000",
            "WORKLOAD_COOPERATIVE": "1",
        },
        ssh_public_key=SSH_KEY,
    )


def test_a_static_job_is_stopped_by_accounting_drift_within_two_samples_neighbours_untouched(
    eager, lab_fleet, funded, lab_image, owner_a, owner_b
):
    fleet = lab_fleet()
    lab, node = fleet.nodes[0], fleet.registered[0]
    launch = launcher(funded, lab_image)
    neighbour = running(launch(owner_a, TIER_GB, WORKLOAD_MB="3000", WORKLOAD_STEP_MB="500"))
    static, _ = services.slice_launch(
        membership=owner_b,
        purchase=funded(owner_b, vram_gb=TIER_GB, hours=2),
        image=lab_image,
        model_request=MODEL,
        command=["gpu-workload-static"],
        environment={"WORKLOAD_MB": "3000", "WORKLOAD_STEP_MB": "500"},
        ssh_public_key=SSH_KEY,
    )
    static = running(static)
    assert wait_for(lambda: held_mb(lab, neighbour) == 3000 and held_mb(lab, static) == 3000)
    before = sorted(p["pid"] for p in lab.gpu_processes(neighbour.container_id))

    node_services.nodes_sample(node_ids=[node.pk])
    counts = Allocation.objects.get(pk=static.allocation_id)
    assert (counts.nvml_mb, counts.library_mb) == (3000, 0)  # ld.so.preload cannot reach it
    honest = Allocation.objects.get(pk=neighbour.allocation_id)
    assert (honest.nvml_mb, honest.library_mb) == (3000, 3000)
    assert not Incident.objects.filter(rule="accounting_drift").exists()
    node_services.nodes_sample(node_ids=[node.pk])

    [incident] = Incident.objects.filter(rule="accounting_drift")
    assert incident.slice_id == static.pk and incident.severity == "critical"
    static.refresh_from_db()
    assert static.state in (Slice.State.STOPPED, Slice.State.FAILED), static.state
    assert "quota library counted only 0 MiB" in static.state_reason
    assert lab.gpu_processes(static.container_id) == []
    # the neighbour: same processes, same memory, still running
    assert sorted(p["pid"] for p in lab.gpu_processes(neighbour.container_id)) == before
    assert held_mb(lab, neighbour) == 3000
    assert running(neighbour).state == Slice.State.RUNNING


ENV_ONLY = (LabNodeSpec("lab-envonly", (GpuSpec("NVIDIA A30"),), quota_env_only=True),)
HARDENED = (LabNodeSpec("lab-a", (GpuSpec("NVIDIA A30"),)),)


@pytest.mark.parametrize(
    ("specs", "held"), [(HARDENED, True), (ENV_ONLY, False)], ids=["node-settings", "env-only"]
)
def test_the_labs_library_obeys_its_environment_unless_the_node_gives_its_settings(
    lab_pool, specs, held
):
    """The stand-in is as weak as HAMi-core where the platform's defence is proven: with
    the env-only build (upstream's CUDA path) a process's own CUDA_DISABLE_CONTROL wins
    over the node's /overrideEnv; with the node's settings it does not."""
    lab = lab_pool.get(specs, [])
    node = lab.nodes[0]
    uuid = node.gpu("state")["gpus"][0]["uuid"]
    run = node.docker(
        "run", "--rm", "--gpus", f"device={uuid}",
        "-e", f"LD_PRELOAD={node.quota_library}", "-e", "CUDA_DEVICE_MEMORY_LIMIT=1024m",
        IMAGE, "env", "CUDA_DISABLE_CONTROL=true", "WORKLOAD_MB=2000", "WORKLOAD_STEP_MB=2000",
        "WORKLOAD_COOPERATIVE=0", "WORKLOAD_EXIT_AFTER_S=3", WORKLOAD,
        check=False, timeout=60,
    )  # fmt: skip
    out = run.stdout + run.stderr
    if held:
        assert run.returncode != 0 and "[vramquota] refused" in out, out
    else:
        assert run.returncode == 0 and "not enforcing" in out, out


USERNS = (LabNodeSpec("lab-userns", (GpuSpec("NVIDIA A30"),), userns_remap=True),)


def test_a_slice_on_a_node_that_remaps_user_namespaces_works_with_its_quota_and_books(
    eager, lab_fleet, funded, lab_image, owner_a
):
    """Root in the container is an unprivileged user on the node, and the slice still has
    its device, its quota library (books the container's root may write, settings it may
    not) and its sampling by host PID."""
    fleet = lab_fleet(USERNS)
    lab, node = fleet.nodes[0], fleet.registered[0]
    node.refresh_from_db()
    assert node.gate_status == "passed", (node.gate_reason, node.preflight)
    s = running(launcher(funded, lab_image)(owner_a, TIER_GB, WORKLOAD_MB="3000"))
    uid_map = lab.docker("exec", s.container_id, "cat", "/proc/self/uid_map").stdout.split()
    assert uid_map[:2] == ["0", str(REMAP_RANGE[0])]
    assert wait_for(lambda: held_mb(lab, s) == 3000)
    node_services.nodes_sample(node_ids=[node.pk])
    a = Allocation.objects.get(pk=s.allocation_id)
    assert (a.nvml_mb, a.library_mb) == (3000, 3000)
    run = lab.docker("exec", s.container_id, *ATTEMPTS["disable-control"], check=False)
    assert run.returncode != 0 and "[vramquota] refused" in run.stdout + run.stderr
    assert held_mb(lab, s) == 3000
