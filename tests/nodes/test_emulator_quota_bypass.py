"""The two quota bypasses, in the node emulator: a process inside a slice that changes
its own environment (CUDA_DISABLE_CONTROL=true, its own higher limit, no LD_PRELOAD),
obeyed only where the node's quota library takes its settings from each process
(HAMi-core upstream) and refused inside the container where the node gives them
(/overrideEnv and /etc/ld.so.preload, read-only); and a statically linked job, which no
library sees, so the library's books (the sampler's quota_usage) miss what NVML counts."""

from __future__ import annotations

import json
import shlex
from collections.abc import Iterator

import pytest

from emulator import EmulatedFleet, EmulatedNode, GpuSpec, NodeSpec
from emulator.catalog import DEFAULT_QUOTA_LIBRARY, QUOTA_FROM_ENVIRONMENT, QUOTA_FROM_NODE
from emulator.containers import process_environment
from emulator.control import ControlClient, ControlError
from emulator.gpu_tools import SAMPLER_MARKER
from nodes import telemetry

SAMPLER = f"{SAMPLER_MARKER}\nimport json, pynvml\n".encode()
LIB = DEFAULT_QUOTA_LIBRARY
QUOTA_MB = 4096
# what the platform's `docker run` gives a slice on a node with the library (nodes.runtime)
SLICE_ENV = (
    f"GPUPLATFORM_VRAM_LIMIT_MB={QUOTA_MB}",
    f"CUDA_DEVICE_MEMORY_LIMIT={QUOTA_MB}m",
    f"CUDA_DEVICE_MEMORY_LIMIT_0={QUOTA_MB}m",
    f"LD_PRELOAD={LIB}",
)
# a job that takes 6000 MiB at once: past its 4096 MiB quota, well within the 24 GB card
GREEDY = ("EMULATOR_MB=6000", "EMULATOR_COOPERATIVE=0")
JOB = ("python3", "/app/train.py")
# Each a process that changes its own environment so that HAMi-core's settings say "off",
# "80 GB", or "not loaded": in its command, in a shell script, or by its own setenv (the
# workload knobs): (command, the job's own knobs beside the platform's environment).
BYPASSES: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "env disables control": (("env", "CUDA_DISABLE_CONTROL=true", *JOB), GREEDY),
    "env raises its limit": (
        ("env", "CUDA_DEVICE_MEMORY_LIMIT=80g", "CUDA_DEVICE_MEMORY_LIMIT_0=80g", *JOB),
        GREEDY,
    ),
    "env -u LD_PRELOAD": (("env", "-u", "LD_PRELOAD", *JOB), GREEDY),
    "env -i": (("env", "-i", *GREEDY, *JOB), ()),
    "shell session": (
        (
            "sh",
            "-c",
            "export CUDA_DISABLE_CONTROL=true CUDA_DEVICE_MEMORY_LIMIT_0=80g; "
            "unset LD_PRELOAD; exec python3 /app/train.py",
        ),
        GREEDY,
    ),
    "its own setenv": (JOB, (*GREEDY, "EMULATOR_PROCESS_ENV=CUDA_DISABLE_CONTROL=true")),
    "its own unsetenv": (JOB, (*GREEDY, "EMULATOR_PROCESS_UNSET=LD_PRELOAD")),
}


@pytest.fixture(scope="module")
def fleet() -> Iterator[EmulatedFleet]:
    specs = [
        NodeSpec("emu-node", (GpuSpec("NVIDIA A30"), GpuSpec("NVIDIA A30"))),
        NodeSpec(
            "emu-envonly",
            (GpuSpec("NVIDIA A30"),),
            quota_library_config=QUOTA_FROM_ENVIRONMENT,
        ),
        NodeSpec("emu-nolib", (GpuSpec("NVIDIA A30"),), quota_library=None),
    ]
    with EmulatedFleet.start(nodes=specs, control_port=0) as f:
        yield f


@pytest.fixture
def nodes(fleet: EmulatedFleet) -> Iterator[dict[str, EmulatedNode]]:
    for n in fleet.nodes:
        n.reset()
    yield {n.name: n for n in fleet.nodes}
    for n in fleet.nodes:
        n.reset()


def run(node: EmulatedNode, *env: str, cmd: tuple[str, ...] = JOB, gpu: int = 0):
    """`docker run` as the platform runs a slice (the tenant's knobs in `env`)."""
    argv = ["docker", "run", "-d", "--gpus", f"device={node.gpus[gpu].uuid}"]
    for e in env:
        argv += ["-e", e]
    argv += ["registry.local/ml/torch:2.3", *cmd]
    result = node.execute(shlex.join(argv))
    assert result.status == 0, result.stderr
    info = node.container(result.stdout.decode().strip())
    assert info is not None
    return info


def attempt(node: EmulatedNode, how: str):
    cmd, knobs = BYPASSES[how]
    return run(node, *SLICE_ENV, *knobs, cmd=cmd)


def sample(node: EmulatedNode) -> dict:
    result = node.execute("python3 -", SAMPLER)
    assert result.status == 0, result.stderr
    doc = json.loads(result.stdout)
    telemetry.parse_sampler_output(json.dumps(doc))  # the platform's own parser takes it
    return doc


def books(doc: dict) -> dict[str, int]:
    return {b["container_id"]: b["used_mb"] for b in doc["quota_usage"]}


def nvml(doc: dict, cid: str) -> int | None:
    return next((p["used_memory_mb"] for p in doc["processes"] if p["container_id"] == cid), None)


# --- reading the program's environment


@pytest.mark.parametrize(
    ("cmd", "expected"),
    [
        (["python3", "x.py"], {"A": "1", "LD_PRELOAD": LIB}),
        (["env", "CUDA_DISABLE_CONTROL=true", "x"], {"A": "1", "LD_PRELOAD": LIB,
                                                      "CUDA_DISABLE_CONTROL": "true"}),
        (["/usr/bin/env", "-u", "LD_PRELOAD", "x"], {"A": "1"}),
        (["env", "--unset=LD_PRELOAD", "env", "B=2", "x"], {"A": "1", "B": "2"}),
        (["env", "-i", "B=2", "x"], {"B": "2"}),
        (["sh", "-c", "export B=2; unset A\nexec x"], {"B": "2", "LD_PRELOAD": LIB}),
        (["bash", "-c", "LD_PRELOAD= ./x"], {"A": "1", "LD_PRELOAD": ""}),
        (["sh", "-c", 'A=9; "$@"', "sh", "env", "-u", "LD_PRELOAD", "x"], {"A": "9"}),
        (["sh", "-c", "echo 'unbalanced"], {"A": "1", "LD_PRELOAD": LIB}),
    ],
)  # fmt: skip
def test_the_programs_environment_is_its_configured_one_as_its_command_changes_it(cmd, expected):
    assert process_environment(cmd, {"A": "1", "LD_PRELOAD": LIB}) == expected


# --- a process that changes its own environment


@pytest.mark.parametrize("how", list(BYPASSES))
def test_where_the_node_gives_the_limits_no_process_lifts_its_own_quota(nodes, fleet, how):
    node = nodes["emu-node"]
    neighbour = run(node, *SLICE_ENV, "EMULATOR_MB=3000")
    job = attempt(node, how)
    fleet.advance(30)
    info = node.container(job.id)
    assert info is not None and info.hard_limit_mb == QUOTA_MB and info.library == "enforcing"
    # refused inside the container, within the tier: the job ends on CUDA's OOM
    assert info.status == "exited" and info.exit_code == 1
    logs = "\n".join(info.logs)
    assert "[vramquota] refused" in logs and "torch.OutOfMemoryError: CUDA out of memory" in logs
    doc = sample(node)
    assert nvml(doc, job.id) is None
    assert nvml(doc, neighbour.id) == 3000 and books(doc)[neighbour.id] == 3000
    after = node.container(neighbour.id)
    assert after is not None and after.pid == neighbour.pid and after.status == "running"


@pytest.mark.parametrize(
    ("how", "library", "counted"),
    [
        ("env disables control", "switched off", False),
        ("env raises its limit", "enforcing", True),  # enforcing 80 GB: the card is the cap
        ("env -u LD_PRELOAD", "not loaded", False),
        ("env -i", "not loaded", False),
        ("shell session", "not loaded", False),  # it also unsets LD_PRELOAD
        ("its own setenv", "switched off", False),
        ("its own unsetenv", "not loaded", False),
    ],
)
def test_a_library_that_obeys_the_process_lets_it_past_its_quota(
    nodes, fleet, how, library, counted
):
    node = nodes["emu-envonly"]
    neighbour = run(node, *SLICE_ENV, "EMULATOR_MB=3000")
    job = attempt(node, how)
    fleet.advance(30)
    info = node.container(job.id)
    assert info is not None and info.status == "running" and info.library == library
    assert info.hard_limit_mb in (None, 80 * 1024)
    doc = sample(node)
    assert nvml(doc, job.id) == 6000  # past its 4096 MiB: only the watchdog sees it now
    # the library's books: what it counted, or nothing where it is not in the process
    assert books(doc)[job.id] == (6000 if counted else 0)
    assert nvml(doc, neighbour.id) == 3000 == books(doc)[neighbour.id]


def test_a_process_that_changes_nothing_is_held_to_its_quota_on_either_kind_of_node(nodes, fleet):
    for name in ("emu-node", "emu-envonly"):
        job = run(nodes[name], *SLICE_ENV, *GREEDY)
        fleet.advance(30)
        info = nodes[name].container(job.id)
        assert info is not None and info.exit_code == 1 and info.hard_limit_mb == QUOTA_MB


def test_the_node_default_is_the_nodes_limits_and_the_config_can_change(nodes, fleet):
    node = nodes["emu-node"]
    assert node.describe()["quota_library_config"] == QUOTA_FROM_NODE
    client = ControlClient(f"http://127.0.0.1:{fleet.control_port}")
    answer = client.post(f"/nodes/{node.name}/quota-library", config=QUOTA_FROM_ENVIRONMENT)
    assert answer == {"ok": True, "config": QUOTA_FROM_ENVIRONMENT}
    job = attempt(node, "env disables control")
    assert job.library == "switched off" and job.hard_limit_mb is None
    with pytest.raises(ControlError) as refused:
        client.post(f"/nodes/{node.name}/quota-library", config="tenant")
    assert refused.value.status == 400
    node.reset()  # back to the node's own
    assert node.describe()["quota_library_config"] == QUOTA_FROM_NODE
    with pytest.raises(ValueError):
        NodeSpec("x", (GpuSpec("NVIDIA A30"),), quota_library_config="tenant")


# --- a job the library never sees


@pytest.mark.parametrize("name", ["emu-node", "emu-envonly"])
def test_a_static_job_is_counted_by_nvml_and_missed_by_the_librarys_books(nodes, fleet, name):
    node = nodes[name]
    neighbour = run(node, *SLICE_ENV, "EMULATOR_MB=3000")
    static = run(node, *SLICE_ENV, *GREEDY, "EMULATOR_LINKAGE=static")
    fleet.advance(30)
    info = node.container(static.id)
    assert info is not None and info.status == "running"
    assert info.library == "bypassed" and info.hard_limit_mb is None and info.library_mb == 0
    doc = sample(node)
    assert nvml(doc, static.id) == 6000 and books(doc)[static.id] == 0
    assert nvml(doc, neighbour.id) == 3000 == books(doc)[neighbour.id]
    assert node.quota_books() == doc["quota_usage"]


def test_the_books_cover_only_containers_the_library_was_given(nodes, fleet):
    node = nodes["emu-node"]
    given = run(node, *SLICE_ENV, "EMULATOR_MB=2000")
    # the platform's variables without LD_PRELOAD: the hook gives this one no library
    ungiven = run(node, *SLICE_ENV[:3], "EMULATOR_MB=2000", gpu=1)
    assert ungiven.library == "none" or ungiven.library == "not loaded"
    assert ungiven.hard_limit_mb is None and ungiven.library_mb is None
    fleet.advance(30)
    assert books(sample(node)) == {given.id: 2000}
    # no library, no books: the sampler reports none
    bare = nodes["emu-nolib"]
    run(bare, f"GPUPLATFORM_VRAM_LIMIT_MB={QUOTA_MB}", "EMULATOR_MB=2000")
    assert "quota_usage" not in sample(bare) and bare.quota_books() is None
    # installed but not put in containers by the hook: nothing is given, nothing booked
    node.state.quota_library_enforces = False
    try:
        off = run(node, *SLICE_ENV, "EMULATOR_MB=2000")
        assert off.library == "none" and off.library_mb is None
        assert off.id not in books(sample(node))
    finally:
        node.state.quota_library_enforces = True


def test_books_moved_by_the_process_are_missed_only_where_it_obeys_the_process(nodes, fleet):
    own_books = ("env", "CUDA_DEVICE_MEMORY_SHARED_CACHE=/tmp/mine.cache", *JOB)
    for name, counted in (("emu-node", True), ("emu-envonly", False)):
        job = run(nodes[name], *SLICE_ENV, "EMULATOR_MB=3000", cmd=own_books)
        fleet.advance(30)
        assert job.hard_limit_mb == QUOTA_MB  # its limit is still the slice's
        assert books(sample(nodes[name]))[job.id] == (3000 if counted else 0)
