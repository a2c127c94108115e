"""The node emulator answers like a GPU host, over real SSH (paramiko client, pinned host key)."""

from __future__ import annotations

import io
import json
import re
import shlex
import threading
import time
from collections.abc import Iterator

import paramiko
import pytest

from emulator import EmulatedFleet, EmulatedNode, GpuSpec, NodeSpec, cli
from emulator.control import ControlClient
from emulator.gpu_tools import SAMPLER_MARKER
from emulator.keys import generate_ed25519, public_line
from emulator.shell import Shell, StdinSource
from emulator.workload import Workload
from nodes import smi, telemetry

SAMPLER = f"{SAMPLER_MARKER}\nimport json, pynvml  # the real sampler's source goes here\n".encode()
HEX64 = re.compile(r"^[0-9a-f]{64}$")
UUID_RE = re.compile(r"^GPU-[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$")
PWNED = "/tmp/pwned"  # noqa: S108 - a path inside the emulated node's fake filesystem


# --- fixtures


@pytest.fixture(scope="module")
def client_key() -> paramiko.PKey:
    return generate_ed25519()


@pytest.fixture(scope="module")
def fleet(client_key, tmp_path_factory) -> Iterator[EmulatedFleet]:
    # emu-01: 2x A30 (quota library) / emu-02: L4 / emu-03: A100-80GB with MIG on + A100-80GB
    f = EmulatedFleet.start(
        count=3,
        authorized_keys=[public_line(client_key, "platform@test")],
        state_dir=tmp_path_factory.mktemp("emulator"),
        control_port=0,
    )
    yield f
    f.stop()


@pytest.fixture
def node(fleet: EmulatedFleet) -> Iterator[EmulatedNode]:
    n = fleet.nodes[0]
    n.reset()
    yield n
    n.reset()


def connect(node: EmulatedNode, key: paramiko.PKey, **kw) -> paramiko.SSHClient:
    """Connect the way the platform does: the host key pinned, unknown keys rejected."""
    client = paramiko.SSHClient()
    entry = paramiko.hostkeys.HostKeyEntry.from_line(node.host_key_line())
    assert entry is not None
    for host in entry.hostnames:
        client.get_host_keys().add(host, entry.key.get_name(), entry.key)
    client.set_missing_host_key_policy(paramiko.RejectPolicy())
    client.connect(
        node.address,
        port=node.port,
        username="gpuplatform",
        pkey=key,
        look_for_keys=False,
        allow_agent=False,
        timeout=5,
        **kw,
    )
    return client


def run(
    client: paramiko.SSHClient, command: str, stdin: bytes | None = None
) -> tuple[int, str, str]:
    chan = client.get_transport().open_session(timeout=5)
    chan.settimeout(10)
    chan.exec_command(command)
    if stdin is not None:
        chan.sendall(stdin)
        chan.shutdown_write()
    out, err = bytearray(), bytearray()
    while data := chan.recv(65536):
        out += data
    while data := chan.recv_stderr(65536):  # the channel's EOF came after all of stderr
        err += data
    status = chan.recv_exit_status()
    chan.close()
    return status, out.decode(), err.decode()


@pytest.fixture
def ssh(node: EmulatedNode, client_key) -> Iterator[paramiko.SSHClient]:
    client = connect(node, client_key)
    yield client
    client.close()


def sample(client: paramiko.SSHClient, discover: bool = False) -> dict:
    status, out, err = run(client, "python3 - --discover" if discover else "python3 -", SAMPLER)
    assert status == 0, err
    return json.loads(out)


def docker_run(client: paramiko.SSHClient, gpu: str, *env: str, name: str | None = None) -> str:
    argv = ["docker", "run", "-d", "--gpus", f"device={gpu}", "--label", "gpuplatform.owner=t1"]
    if name:
        argv += ["--name", name]
    for e in env:
        argv += ["-e", e]
    argv += ["registry.local/ml/torch:2.3", "python3", "/app/serve.py"]
    status, out, err = run(client, shlex.join(argv))
    assert status == 0, err
    return out.strip()


def proc_mb(doc: dict, container_id: str) -> int:
    return next(p["used_memory_mb"] for p in doc["processes"] if p["container_id"] == container_id)


# --- the sampler


def test_sampler_document_follows_schema_1(ssh, node) -> None:
    gpu = node.gpus[0].uuid
    cid = docker_run(
        ssh, gpu, "GPUPLATFORM_EMULATOR_PROFILE=steady", "GPUPLATFORM_EMULATOR_MB=3000"
    )
    doc = sample(ssh, discover=True)

    assert doc["schema"] == telemetry.SAMPLER_SCHEMA_VERSION == 1
    assert doc["source"] == "nvml" and doc["hostname"] == node.name
    assert doc["driver_version"] == "550.54.15" and doc["cuda_version"] == "12.4"
    assert doc["taken_at"].endswith("+00:00")
    assert isinstance(doc["errors"], list)
    caps = doc["capabilities"]
    facts = caps.pop("preflight")
    assert caps == {
        "docker": True,
        "nvidia_runtime": True,
        "mig": True,
        "vram_quota_library": "/usr/lib/gpuplatform/libvramquota.so",
    }
    assert facts["toolkit_version"] == "1.19.1" and facts["runc_version"] == "1.1.12"
    assert [g["name"] for g in doc["gpus"]] == ["NVIDIA A30", "NVIDIA A30"]
    for g in doc["gpus"]:
        assert UUID_RE.match(g["uuid"])
        assert re.match(r"^00000000:[0-9A-F]{2}:00\.0$", g["pci_bus_id"])
        assert g["memory_total_mb"] == 24576
        assert g["memory_used_mb"] + g["memory_free_mb"] == g["memory_total_mb"]
        for key in ("utilization_gpu", "utilization_memory", "temperature_c"):
            assert isinstance(g[key], int)
        assert isinstance(g["power_w"], float)
        assert g["mig_capable"] is True and g["mig_enabled"] is False and g["mig_devices"] == []
        assert g["ecc_uncorrected_volatile"] == 0
        for key in ("retired_pages_pending", "remapped_rows_pending", "remapped_rows_failure"):
            assert g[key] is False
    (proc,) = doc["processes"]
    assert proc == {
        "gpu_uuid": gpu,
        "pid": proc["pid"],
        "used_memory_mb": 3000,
        "name": "python3",
        "container_id": cid,
        "sm_utilization": 60,
        "memory_utilization": 25,
    }
    assert doc["gpus"][0]["memory_used_mb"] == 3000
    assert doc["xid_events"] == []
    # the pid maps to the container through /proc/<pid>/cgroup, as on a real host
    status, out, _ = run(ssh, f"cat /proc/{proc['pid']}/cgroup")
    assert status == 0 and cid in out

    assert "capabilities" not in sample(ssh)  # only with --discover
    parse = getattr(telemetry, "parse_sampler_output", None)
    if parse is not None:  # the platform's parser, once it exists, accepts it too
        parsed = parse(json.dumps(doc))
        assert len(parsed.gpus) == 2 and parsed.processes[0].container_id == cid


def test_sampler_on_mig_node_reports_mig_devices(fleet, client_key) -> None:
    mig_node = fleet.nodes[2]
    mig_node.reset()
    client = connect(mig_node, client_key)
    try:
        mig = mig_node.gpus[0].mig_devices[2]  # a 1g.10gb slice
        cid = docker_run(client, mig["uuid"], "GPUPLATFORM_EMULATOR_MB=20000")
        doc = sample(client)
        g0 = doc["gpus"][0]
        assert g0["name"] == "NVIDIA A100-SXM4-80GB" and g0["mig_enabled"] is True
        assert g0["utilization_gpu"] is None  # not reported in MIG mode
        assert [d["profile"] for d in g0["mig_devices"]] == [
            "3g.40gb",
            "2g.20gb",
            "1g.10gb",
            "1g.10gb",
        ]
        slice_doc = g0["mig_devices"][2]
        assert slice_doc["uuid"].startswith("MIG-") and slice_doc["memory_total_mb"] == 9728
        # the hardware partition caps the container: 20000 MiB asked, the slice holds 9728
        assert slice_doc["memory_used_mb"] == proc_mb(doc, cid) == 9728
        assert doc["gpus"][1]["mig_enabled"] is False
        status, out, _ = run(client, "nvidia-smi -L")
        assert status == 0
        assert f"  MIG 1g.10gb     Device  2: (UUID: {mig['uuid']})" in out.splitlines()
    finally:
        client.close()
        mig_node.reset()


def test_sampler_needs_its_marker_and_reports_missing_nvml(ssh, node) -> None:
    status, _, err = run(ssh, "python3 -", b"print('hello')\n")
    assert status == 1 and "GPUPLATFORM_SAMPLER" in err

    node.set_nvml_available(False, "NVML Shared Library Not Found")
    status, out, _ = run(ssh, "python3 - --discover", SAMPLER)
    assert status == telemetry.SAMPLER_UNAVAILABLE_EXIT == 3
    assert json.loads(out) == {
        "schema": 1,
        "source": "unavailable",
        "error": "NVML Shared Library Not Found",
    }
    status, out, _ = run(ssh, "nvidia-smi --query-gpu=index --format=csv,noheader")
    assert (status, out) == (0, "0\n1\n")  # the fallback still works

    node.set_driver_loaded(False)
    status, out, _ = run(ssh, "nvidia-smi -L")
    assert status == 9 and "couldn't communicate with the NVIDIA driver" in out


# --- nvidia-smi


def test_nvidia_smi_query_gpu_csv(ssh, node, fleet, client_key) -> None:
    fields = ",".join(smi.GPU_QUERY_FIELDS)
    status, out, err = run(ssh, f"nvidia-smi --query-gpu={fields} --format=csv,noheader,nounits")
    assert status == 0, err
    rows = [line.split(", ") for line in out.splitlines()]
    assert len(rows) == 2 and all(len(r) == len(smi.GPU_QUERY_FIELDS) for r in rows)
    row = dict(zip(smi.GPU_QUERY_FIELDS, rows[1], strict=True))
    assert row["index"] == "1" and row["uuid"] == node.gpus[1].uuid and row["name"] == "NVIDIA A30"
    assert (
        row["memory.total"] == "24576"
        and int(row["memory.used"]) + int(row["memory.free"]) == 24576
    )
    assert re.match(r"^\d+\.\d\d$", row["power.draw"])
    assert row["mig.mode.current"] == "Disabled" and row["driver_version"] == "550.54.15"

    # any subset, any order; units and a header without nounits/noheader
    status, out, _ = run(
        ssh, "nvidia-smi --query-gpu=memory.used,index,power.draw --format=csv -i 0"
    )
    header, line = out.splitlines()
    assert header == "memory.used [MiB], index, power.draw [W]"
    assert re.match(r"^0 MiB, 0, \d+\.\d\d W$", line)
    status, out, _ = run(ssh, "nvidia-smi --query-gpu=bogus --format=csv")
    assert status == 2 and 'Field "bogus" is not a valid field to query.' in out

    # no MIG on an L4: [N/A]; power not reported: [N/A]
    l4 = fleet.nodes[1]
    l4.reset()
    l4.set_power_supported(0, False)
    client = connect(l4, client_key)
    try:
        status, out, _ = run(
            client,
            "nvidia-smi --query-gpu=name,memory.total,power.draw,mig.mode.current "
            "--format=csv,noheader,nounits",
        )
        assert out == "NVIDIA L4, 23034, [N/A], [N/A]\n"
    finally:
        client.close()
        l4.reset()


def test_nvidia_smi_compute_apps(ssh, node) -> None:
    fields = ",".join(smi.APP_QUERY_FIELDS)
    query = f"nvidia-smi --query-compute-apps={fields} --format=csv,noheader,nounits"
    assert run(ssh, query) == (0, "", "")  # no processes: no output at all
    cid = docker_run(ssh, node.gpus[1].uuid, "GPUPLATFORM_EMULATOR_MB=1536")
    status, out, _ = run(ssh, query)
    uuid, pid, used, name = out.strip().split(", ")
    assert (uuid, used, name) == (node.gpus[1].uuid, "1536", "/usr/bin/python3")
    assert node.container(cid).pid == int(pid)
    status, out, _ = run(ssh, query.replace(",nounits", "").replace("csv,noheader", "csv"))
    assert out.splitlines()[0] == "gpu_uuid, pid, used_gpu_memory [MiB], process_name"
    assert out.splitlines()[1].endswith(", 1536 MiB, /usr/bin/python3")


# --- docker


def test_docker_run_inspect_ps_logs_stop_rm(ssh, node) -> None:
    gpu = node.gpus[0].uuid
    argv = [
        "docker",
        "run",
        "-d",
        "--name",
        "slice-42",
        "--gpus",
        f"device={gpu}",
        "--cpus",
        "4",
        "--memory",
        "16g",
        "--pids-limit",
        "512",
        "--cap-drop",
        "ALL",
        "--security-opt",
        "no-new-privileges",
        "--label",
        "gpuplatform.owner=slice-42",
        "--label",
        "gpuplatform.tier=8",
        "-e",
        "GPUPLATFORM_VRAM_LIMIT_MB=8192",
        "-p",
        "8888",
        "registry.local/ml/torch:2.3",
        "python3",
        "serve.py",
        "--port",
        "8888",
    ]
    status, out, err = run(ssh, shlex.join(argv))
    assert status == 0, err
    cid = out.strip()
    assert HEX64.match(cid)

    status, out, _ = run(ssh, f"docker inspect {cid[:12]}")
    (doc,) = json.loads(out)
    assert doc["Id"] == cid and doc["Name"] == "/slice-42"
    state = doc["State"]
    assert state["Status"] == "running" and state["Running"] is True and state["Pid"] > 0
    assert state["ExitCode"] == 0 and state["OOMKilled"] is False
    assert state["FinishedAt"] == "0001-01-01T00:00:00Z"
    assert doc["Config"]["Image"] == "registry.local/ml/torch:2.3"
    assert doc["Config"]["Cmd"] == ["python3", "serve.py", "--port", "8888"]
    assert doc["Config"]["Labels"] == {"gpuplatform.owner": "slice-42", "gpuplatform.tier": "8"}
    assert "GPUPLATFORM_VRAM_LIMIT_MB=8192" in doc["Config"]["Env"]
    hc = doc["HostConfig"]
    assert (
        hc["NanoCpus"] == 4_000_000_000 and hc["Memory"] == 16 * 1024**3 and hc["PidsLimit"] == 512
    )
    assert hc["CapDrop"] == ["ALL"] and hc["SecurityOpt"] == ["no-new-privileges"]
    assert hc["DeviceRequests"] == [
        {"Driver": "", "Count": 0, "DeviceIDs": [gpu], "Capabilities": [["gpu"]], "Options": {}}
    ]
    status, out, _ = run(
        ssh,
        "docker inspect --format "
        "'{{.State.Status}} {{index .Config.Labels \"gpuplatform.tier\"}}' slice-42",
    )
    assert out == "running 8\n"

    status, out, _ = run(
        ssh, "docker ps --no-trunc --filter label=gpuplatform.owner=slice-42 --format '{{json .}}'"
    )
    (line,) = out.splitlines()
    ps = json.loads(line)
    assert ps["ID"] == cid and ps["Names"] == "slice-42" and ps["State"] == "running"
    assert ps["Status"].startswith("Up ") and "gpuplatform.tier=8" in ps["Labels"]
    assert "->8888/tcp" in ps["Ports"]
    assert run(ssh, "docker ps -q --filter label=gpuplatform.owner=nobody") == (0, "", "")
    status, out, _ = run(ssh, "docker ps")
    assert out.startswith("CONTAINER ID   IMAGE") and cid[:12] in out

    status, out, _ = run(ssh, "docker logs --tail 5 slice-42")
    assert status == 0 and "profile=steady" in out

    assert run(ssh, f"docker rm {cid}")[0] == 1  # still running
    assert run(ssh, "docker stop slice-42") == (0, "slice-42\n", "")
    status, out, _ = run(ssh, "docker inspect --format '{{json .State}}' slice-42")
    state = json.loads(out)
    assert state["Status"] == "exited" and state["ExitCode"] == 137 and state["Running"] is False
    assert run(ssh, "docker ps -q") == (0, "", "")
    assert run(ssh, "docker ps -a -q") == (0, cid[:12] + "\n", "")
    assert run(ssh, f"docker rm {cid}") == (0, cid + "\n", "")
    status, out, err = run(ssh, f"docker inspect {cid}")
    assert (status, out, err) == (1, "[]\n", f"Error: No such object: {cid}\n")
    status, _, err = run(ssh, "docker stop nope")
    assert status == 1 and err == "Error response from daemon: No such container: nope\n"

    status, out, _ = run(ssh, "docker info --format '{{json .Runtimes}}'")
    assert "nvidia" in json.loads(out)


def test_docker_run_errors_like_the_real_cli(ssh, node) -> None:
    status, out, err = run(
        ssh, "docker run -d --gpus device=GPU-00000000-0000-0000-0000-000000000000 img"
    )
    assert status == 125 and out == ""
    assert (
        "nvidia-container-cli: device error: "
        "GPU-00000000-0000-0000-0000-000000000000: unknown device" in err
    )
    assert err.startswith("docker: Error response from daemon: failed to create task for container")
    status, _, err = run(ssh, "docker run -d --cpus 2")
    assert status == 1 and err.startswith('"docker run" requires at least 1 argument.')
    docker_run(ssh, node.gpus[0].uuid, name="taken")
    status, _, err = run(ssh, "docker run -d --name taken img")
    assert status == 125 and 'Conflict. The container name "/taken" is already in use' in err
    status, _, err = run(ssh, "docker run -d --bogus img")
    assert status == 125 and err.startswith("unknown flag: --bogus")


# --- VRAM profiles and quotas


def test_container_vram_follows_its_profile(ssh, node, fleet) -> None:
    g0, g1 = node.gpus[0].uuid, node.gpus[1].uuid
    ramp = docker_run(
        ssh,
        g0,
        "GPUPLATFORM_EMULATOR_PROFILE=ramp",
        "GPUPLATFORM_EMULATOR_MB=1000",
        "GPUPLATFORM_EMULATOR_RATE_MB_PER_MIN=600",
        "GPUPLATFORM_EMULATOR_PEAK_MB=4000",
    )
    leak = docker_run(
        ssh,
        g0,
        "GPUPLATFORM_EMULATOR_PROFILE=leak",
        "GPUPLATFORM_EMULATOR_MB=500",
        "GPUPLATFORM_EMULATOR_RATE_MB_PER_MIN=100",
    )
    idle = docker_run(ssh, g1, "GPUPLATFORM_EMULATOR_PROFILE=idle", "GPUPLATFORM_EMULATOR_MB=2048")
    # cooperative code (a serving engine sizing its cache) holds at the framework cap ...
    capped = docker_run(
        ssh,
        g1,
        "GPUPLATFORM_EMULATOR_PROFILE=leak",
        "GPUPLATFORM_EMULATOR_COOPERATIVE=1",
        "GPUPLATFORM_EMULATOR_MB=3000",
        "GPUPLATFORM_EMULATOR_RATE_MB_PER_MIN=1000",
        "GPUPLATFORM_VRAM_LIMIT_MB=4096",
    )
    # ... a leak does not: the framework cap is advisory, only a hard limit stops it
    advisory = docker_run(
        ssh,
        g1,
        "GPUPLATFORM_EMULATOR_PROFILE=leak",
        "GPUPLATFORM_EMULATOR_MB=3000",
        "GPUPLATFORM_EMULATOR_RATE_MB_PER_MIN=1000",
        "GPUPLATFORM_VRAM_LIMIT_MB=4096",
    )
    doc = sample(ssh)
    assert proc_mb(doc, ramp) < 1100 and proc_mb(doc, leak) < 600 and proc_mb(doc, capped) < 3100
    fleet.advance(120)
    doc = sample(ssh)
    assert 2150 <= proc_mb(doc, ramp) <= 2300 and 690 <= proc_mb(doc, leak) <= 720
    assert proc_mb(doc, capped) == 4096
    assert 5000 <= proc_mb(doc, advisory) <= 5100
    idle_proc = next(p for p in doc["processes"] if p["container_id"] == idle)
    assert idle_proc["used_memory_mb"] == 2048 and idle_proc["sm_utilization"] == 0
    fleet.advance(600)
    doc = sample(ssh)
    assert proc_mb(doc, ramp) == 4000  # its peak
    assert proc_mb(doc, leak) >= 1700  # still growing
    assert proc_mb(doc, capped) == 4096
    assert proc_mb(doc, advisory) >= 15000  # far past its 4096 MiB framework cap
    assert doc["gpus"][0]["memory_used_mb"] == proc_mb(doc, ramp) + proc_mb(doc, leak)
    assert "refused" in "\n".join(node.container(capped).logs)
    info = node.container(advisory)
    assert info is not None and info.limit_source == "framework" and info.hard_limit_mb is None


def test_oom_profile_exits_137_at_the_quota(ssh, node, fleet) -> None:
    cid = docker_run(
        ssh,
        node.gpus[0].uuid,
        "GPUPLATFORM_EMULATOR_PROFILE=oom",
        "GPUPLATFORM_EMULATOR_MB=2048",
        "GPUPLATFORM_EMULATOR_RATE_MB_PER_MIN=1024",
        "CUDA_DEVICE_MEMORY_LIMIT=4096m",  # the software quota library's variable ...
        "LD_PRELOAD=/usr/lib/gpuplatform/libvramquota.so",  # ... read once it is preloaded
    )
    assert 2048 <= proc_mb(sample(ssh), cid) < 2100
    fleet.advance(60)
    assert 3072 <= proc_mb(sample(ssh), cid) < 3150
    fleet.advance(90)  # 2048 + 1024/min crosses 4096 MiB at t=120 s
    doc = sample(ssh)
    assert all(p["container_id"] != cid for p in doc["processes"])
    status, out, _ = run(ssh, f"docker inspect --format '{{{{json .State}}}}' {cid}")
    state = json.loads(out)
    assert state["Status"] == "exited" and state["ExitCode"] == 137 and state["OOMKilled"] is False
    status, out, err = run(ssh, f"docker logs {cid}")
    assert "CUDA out of memory" in err
    info = node.container(cid)
    assert info is not None and info.limit_source == "quota-library" and info.limit_mb == 4096


def test_quota_library_variable_needs_the_library() -> None:
    spec = NodeSpec("emu-gaming", (GpuSpec("NVIDIA GeForce RTX 4090"),), quota_library=None)
    with EmulatedFleet.start(nodes=[spec]) as no_lib:
        n = no_lib.nodes[0]
        argv = [
            "docker",
            "run",
            "-d",
            "--gpus",
            "device=0",
            "-e",
            "CUDA_DEVICE_MEMORY_LIMIT=1g",
            "-e",
            "GPUPLATFORM_EMULATOR_MB=3000",
            "img",
        ]
        assert n.execute(shlex.join(argv)).status == 0
        (c,) = n.containers
        assert c.used_mb == 3000 and c.limit_mb is None  # nothing enforces the variable here
        doc = json.loads(n.execute("python3 - --discover", SAMPLER).stdout)
        assert doc["capabilities"]["vram_quota_library"] is None
        assert doc["gpus"][0]["ecc_uncorrected_volatile"] is None  # GeForce: no ECC


QUOTA_LIB = "/usr/lib/gpuplatform/libvramquota.so"


def inspect_state(client: paramiko.SSHClient, ref: str) -> dict:
    status, out, err = run(client, f"docker inspect --format '{{{{json .State}}}}' {ref}")
    assert status == 0, err
    return json.loads(out)


def test_leak_under_the_quota_library_dies_alone_with_cuda_oom(ssh, node, fleet) -> None:
    g0 = node.gpus[0].uuid
    neighbour = docker_run(ssh, g0, "GPUPLATFORM_EMULATOR_MB=6000")
    leak_env = (
        "GPUPLATFORM_EMULATOR_PROFILE=leak",
        "GPUPLATFORM_EMULATOR_MB=3000",
        "GPUPLATFORM_EMULATOR_RATE_MB_PER_MIN=1000",
        "GPUPLATFORM_VRAM_LIMIT_MB=4096",
        "CUDA_DEVICE_MEMORY_LIMIT=4096m",
    )
    leak = docker_run(ssh, g0, *leak_env, f"LD_PRELOAD={QUOTA_LIB}")
    unloaded = docker_run(ssh, g0, *leak_env)  # the variable alone: no library intercepts
    info = node.container(leak)
    assert info is not None and info.hard_limit_mb == 4096 == info.limit_mb
    assert node.container(unloaded).hard_limit_mb is None
    fleet.advance(50)
    assert 3800 <= proc_mb(sample(ssh), leak) < 4096
    fleet.advance(30)  # 3000 MiB + 1000 MiB/min passes 4096 MiB at t=65.8 s
    doc = sample(ssh)
    assert all(p["container_id"] != leak for p in doc["processes"])
    assert proc_mb(doc, neighbour) == 6000  # untouched
    assert proc_mb(doc, unloaded) > 4096  # nothing stopped this one
    state = inspect_state(ssh, leak)
    # an uncaught torch.OutOfMemoryError: Python's exit 1, not the kernel's OOM killer
    assert state["Status"] == "exited" and state["ExitCode"] == 1 and state["OOMKilled"] is False
    _, _, err = run(ssh, f"docker logs --tail 5 {leak}")
    assert "torch.OutOfMemoryError: CUDA out of memory" in err


def test_leak_without_a_hard_limit_fills_the_card_and_dies_neighbours_keep_theirs(
    ssh, node, fleet
) -> None:
    g1 = node.gpus[1].uuid  # an A30: 24576 MiB
    leak = docker_run(
        ssh,
        g1,
        "GPUPLATFORM_EMULATOR_PROFILE=leak",
        "GPUPLATFORM_EMULATOR_MB=4000",
        "GPUPLATFORM_EMULATOR_RATE_MB_PER_MIN=6000",
        "GPUPLATFORM_VRAM_LIMIT_MB=8192",  # advisory
    )
    later = docker_run(ssh, g1, "GPUPLATFORM_EMULATOR_MB=12000")  # started after the leak
    assert proc_mb(sample(ssh), later) == 12000
    fleet.advance(60)
    doc = sample(ssh)
    assert 10000 <= proc_mb(doc, leak) < 10200 and proc_mb(doc, later) == 12000
    fleet.advance(60)  # it wants 16000 MiB; 12576 MiB is all the card has left
    doc = sample(ssh)
    assert all(p["container_id"] != leak for p in doc["processes"])
    assert proc_mb(doc, later) == 12000  # never shrunk to make room
    assert doc["gpus"][1]["memory_used_mb"] == 12000
    state = inspect_state(ssh, leak)
    assert state["Status"] == "exited" and state["ExitCode"] == 1
    _, _, err = run(ssh, f"docker logs {leak}")
    assert "CUDA out of memory" in err


def test_pause_keeps_memory_stops_compute_and_the_workload_clock(ssh, node, fleet) -> None:
    cid = docker_run(
        ssh,
        node.gpus[0].uuid,
        "GPUPLATFORM_EMULATOR_PROFILE=leak",
        "GPUPLATFORM_EMULATOR_MB=2000",
        "GPUPLATFORM_EMULATOR_RATE_MB_PER_MIN=600",
        "GPUPLATFORM_EMULATOR_SM_UTIL=80",
        "EMULATOR_MEM_UTIL=75",  # a tenant's own knob: a memory-bandwidth hog
        name="hog",
    )

    def proc() -> dict:
        doc = sample(ssh)
        return next(p for p in doc["processes"] if p["container_id"] == cid) | {
            "gpu": doc["gpus"][0]
        }

    p = proc()
    assert (p["sm_utilization"], p["memory_utilization"]) == (80, 75)
    assert run(ssh, "docker pause hog") == (0, "hog\n", "")
    fleet.advance(60)
    p = proc()
    assert 2000 <= p["used_memory_mb"] < 2030  # kept its memory; did not grow
    assert (p["sm_utilization"], p["memory_utilization"]) == (0, 0)
    assert p["gpu"]["utilization_gpu"] == 0 and p["gpu"]["utilization_memory"] == 0
    state = inspect_state(ssh, cid)
    assert (state["Status"], state["Running"], state["Paused"]) == ("paused", True, True)
    _, out, _ = run(ssh, "docker ps --format '{{.State}}|{{.Status}}'")
    assert out == "paused|Up About a minute (Paused)\n"
    assert run(ssh, "docker pause hog") == (
        1,
        "",
        f"Error response from daemon: Container {cid} is already paused\n",
    )
    assert run(ssh, "docker unpause hog")[:2] == (0, "hog\n")
    fleet.advance(60)
    p = proc()
    assert 2600 <= p["used_memory_mb"] < 2640 and p["sm_utilization"] == 80  # one minute on
    assert inspect_state(ssh, cid)["Paused"] is False
    assert run(ssh, "docker unpause hog") == (
        1,
        "",
        f"Error response from daemon: Container {cid} is not paused\n",
    )
    assert run(ssh, "docker pause nope") == (
        1,
        "",
        "Error response from daemon: No such container: nope\n",
    )
    run(ssh, "docker pause hog")
    assert run(ssh, "docker stop hog")[0] == 0  # a paused container can be stopped
    assert inspect_state(ssh, cid)["Status"] == "exited"
    assert run(ssh, "docker pause hog") == (
        1,
        "",
        f"Error response from daemon: Container {cid} is not running\n",
    )


# --- the shell and its audit log


def test_unquoted_input_runs_as_two_commands_quoted_as_one(ssh, node) -> None:
    status, out, _ = run(ssh, f"echo a; touch {PWNED}")
    assert status == 0 and out == "a\n"
    assert node.audit_log[-2:] == [["echo", "a"], ["touch", PWNED]]
    assert PWNED in node.files

    node.reset()
    tenant_input = f"a; touch {PWNED} && $(touch /tmp/x) `touch /tmp/y` | cat"
    status, out, _ = run(ssh, shlex.join(["echo", tenant_input]))
    assert out == tenant_input + "\n"
    assert node.audit_log == [["echo", tenant_input]]
    assert PWNED not in node.files

    node.reset()
    run(ssh, 'echo "$(touch /tmp/a)" `touch /tmp/b` && false || touch /tmp/c\ntouch /tmp/d')
    assert [a[0] for a in node.audit_log] == ["touch", "touch", "echo", "false", "touch", "touch"]
    assert run(ssh, "frobnicate --now") == (127, "", "bash: frobnicate: command not found\n")


def test_shell_parsing_rules() -> None:
    files: dict[str, bytes] = {}
    audit: list[list[str]] = []

    def sh(script: str, stdin: bytes = b"") -> tuple[int, str]:
        shell = Shell(
            lambda n: None, {"HOME": "/home/u", "X": "a b"}, audit.append, files, max_output=64
        )
        r = shell.run(script, StdinSource(data=stdin))
        return r.status, r.stdout.decode()

    sh("cmd 'a;b' \"c|d\" e\\;f")
    assert audit[-1] == ["cmd", "a;b", "c|d", "e;f"]
    sh('cmd $X "$X" ~/f')
    assert audit[-1] == ["cmd", "a", "b", "a b", "/home/u/f"]
    audit.clear()
    assert sh("a && b || c; d | e & f")[0] == 127
    assert audit == [["a"], ["c"], ["d"], ["e"], ["f"]]
    assert sh("'unterminated")[0] == 2
    assert (
        len(
            Shell(lambda n: None, {}, audit.append, files, max_output=64)
            .run("x" * 10_000, StdinSource())
            .stderr
        )
        == 64
    )


def test_many_concurrent_channels_on_one_transport(ssh, node) -> None:
    results: list[tuple[int, str, str]] = []
    lock = threading.Lock()

    def worker(i: int) -> None:
        r = run(ssh, f"echo {i}" if i % 2 else "python3 -", None if i % 2 else SAMPLER)
        with lock:
            results.append(r)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(40)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(20)
    assert len(results) == 40 and all(r[0] == 0 for r in results)


# --- auth, faults, host keys


def test_only_authorized_public_keys_get_in(node) -> None:
    with pytest.raises(paramiko.AuthenticationException):
        connect(node, generate_ed25519())
    with pytest.raises(paramiko.AuthenticationException):
        client = paramiko.SSHClient()
        client.set_missing_host_key_policy(paramiko.RejectPolicy())
        client.get_host_keys().add(
            f"[{node.address}]:{node.port}", node.host_key.get_name(), node.host_key
        )
        client.connect(
            node.address,
            port=node.port,
            username="gpuplatform",
            password="hunter2",
            look_for_keys=False,
            allow_agent=False,
            timeout=5,
        )


def test_xid_shows_once_in_the_sampler_and_in_dmesg(ssh, node) -> None:
    sample(ssh)  # consume anything older
    line = node.inject_xid(gpu=1, code=79)
    doc = sample(ssh)
    (event,) = doc["xid_events"]
    bus = node.gpus[1].pci_bus_id[9:14].lower()  # "2a:00"
    assert event == {
        "pci_bus_id": f"0000:{bus}",
        "xid": 79,
        "pid": None,
        "raw": f"NVRM: Xid (PCI:0000:{bus}): 79, GPU has fallen off the bus.",
    }
    assert sample(ssh)["xid_events"] == []
    status, out, _ = run(ssh, "dmesg")
    assert status == 0 and out.rstrip().endswith(line)

    node.inject_ecc(
        0, uncorrected=2, remapped_rows_pending=True, remapped_rows_failure=True, xid=64
    )
    doc = sample(ssh)
    g0 = doc["gpus"][0]
    assert (
        g0["ecc_uncorrected_volatile"] == 2
        and g0["remapped_rows_pending"]
        and g0["remapped_rows_failure"]
    )
    assert [e["xid"] for e in doc["xid_events"]] == [64]


def test_left_behind_memory_and_processes_show_as_a_real_card_would(ssh, node) -> None:
    before = sample(ssh)["gpus"][1]["memory_used_mb"]
    node.hold_memory(1, 2000)  # the driver kept it: used, with no process
    doc = sample(ssh)
    assert doc["gpus"][1]["memory_used_mb"] == before + 2000
    assert [p for p in doc["processes"] if p["gpu_uuid"] == doc["gpus"][1]["uuid"]] == []
    node.hold_memory(1, 0)
    cid = "e" * 64
    pid = node.add_gpu_process(1, 1500, container_id=cid)  # its container left it behind
    (proc,) = [p for p in sample(ssh)["processes"] if p["pid"] == pid]
    assert proc["container_id"] == cid and proc["used_memory_mb"] == 1500
    assert node.kill_pid(pid)
    doc = sample(ssh)
    assert all(p["pid"] != pid for p in doc["processes"])
    assert doc["gpus"][1]["memory_used_mb"] == before


def test_idle_window_of_a_workload() -> None:
    w = Workload.from_env(
        {"EMULATOR_SM_UTIL": "70", "EMULATOR_IDLE_FROM_S": "60", "EMULATOR_IDLE_UNTIL_S": "660"}
    )
    assert w.util(30)[0] == 70
    assert w.util(60) == (0, 0) and w.util(659) == (0, 0)
    assert w.util(660)[0] == 70  # it computes again
    assert Workload.from_env({"EMULATOR_IDLE_FROM_S": "10"}).util(10**6) == (0, 0)


def test_node_down_refuses_and_comes_back(node, client_key) -> None:
    client = connect(node, client_key)
    node.set_down(True)
    with pytest.raises((paramiko.SSHException, EOFError, OSError)):
        run(client, "echo hi")
    with pytest.raises(paramiko.ssh_exception.NoValidConnectionsError):
        connect(node, client_key)
    node.set_down(False)
    client = connect(node, client_key)
    assert run(client, "echo back") == (0, "back\n", "")
    client.close()

    node.set_down(True, mode="hang")  # a partition: TCP connects, SSH never answers
    with pytest.raises((paramiko.SSHException, TimeoutError, OSError)):
        connect(node, client_key, banner_timeout=0.5, auth_timeout=0.5)
    node.set_down(False)


def test_slow_answers(ssh, node) -> None:
    node.set_delay(0.3)
    t0 = time.monotonic()
    assert run(ssh, "true")[0] == 0
    assert time.monotonic() - t0 >= 0.3


def test_host_key_rotation_and_persistence(fleet, client_key) -> None:
    node = fleet.nodes[1]
    old_line, old_fp = node.host_key_line(), node.host_key_fingerprint()
    assert old_line.startswith(f"[127.0.0.1]:{node.port} ssh-ed25519 AAAA")
    assert old_fp.startswith("SHA256:")
    client = connect(node, client_key)
    assert run(client, "hostname") == (0, "emu-02\n", "")

    new_line = node.rotate_host_key()
    assert new_line != old_line and node.host_key_fingerprint() != old_fp
    with pytest.raises((paramiko.SSHException, EOFError, OSError)):
        run(client, "hostname")  # sshd restarted: the session is gone
    stale = paramiko.SSHClient()
    stale.get_host_keys().add(
        f"[127.0.0.1]:{node.port}",
        "ssh-ed25519",
        paramiko.hostkeys.HostKeyEntry.from_line(old_line).key,
    )
    stale.set_missing_host_key_policy(paramiko.RejectPolicy())
    with pytest.raises(paramiko.BadHostKeyException):
        stale.connect(
            "127.0.0.1",
            port=node.port,
            username="gpuplatform",
            pkey=client_key,
            look_for_keys=False,
            allow_agent=False,
            timeout=5,
        )
    client = connect(node, client_key)  # pinned to the new key: fine
    assert run(client, "hostname")[0] == 0
    client.close()
    fleet_file = json.loads((fleet.state_dir / "fleet.json").read_text())
    assert fleet_file["nodes"][1]["host_key"] == new_line

    # a restart on the same state dir keeps every node's key
    restarted = EmulatedFleet.start(count=2, state_dir=fleet.state_dir)
    try:
        assert restarted.nodes[1].host_key_fingerprint() == node.host_key_fingerprint()
        assert restarted.nodes[0].host_key_fingerprint() == fleet.nodes[0].host_key_fingerprint()
    finally:
        restarted.stop()
        fleet.write_fleet_file()


# --- control API and commands


def test_control_api_and_emulator_ctl(fleet, ssh, node) -> None:
    client = ControlClient(f"http://127.0.0.1:{fleet.control_port}")
    assert [n["name"] for n in client.get("/fleet")["nodes"]] == ["emu-01", "emu-02", "emu-03"]
    sample(ssh)
    client.post("/nodes/emu-01/xid", gpu=0, code=48)
    assert [e["xid"] for e in sample(ssh)["xid_events"]] == [48]

    out = io.StringIO()
    ctl = ["ctl", "--control-port", str(fleet.control_port)]
    assert cli.main([*ctl, "xid", "emu-01", "--gpu", "1", "--code", "13"], out=out) == 0
    assert json.loads(out.getvalue())["ok"] is True
    assert [e["xid"] for e in sample(ssh)["xid_events"]] == [13]
    out = io.StringIO()
    assert cli.main([*ctl, "delay", "emu-01", "0.2"], out=out) == 0
    assert node.server.delay == 0.2
    audit = client.get("/nodes/emu-01/audit")
    assert ["python3", "-"] in [e["argv"] for e in audit]


def test_emulate_nodes_prints_nodes_and_host_keys(tmp_path) -> None:
    out = io.StringIO()
    stop = threading.Event()
    options = {
        "count": 2,
        "base_port": 0,
        "state_dir": str(tmp_path),
        "control_port": -1,
        "gpus_per_node": 8,
    }
    t = threading.Thread(target=cli.serve, args=(options, out, stop))
    t.start()
    try:
        for _ in range(100):
            if out.getvalue().count("\n") >= 4:
                break
            time.sleep(0.05)
        lines = [
            line.split("\t") for line in out.getvalue().splitlines() if not line.startswith("#")
        ]
        assert [line[0] for line in lines] == ["emu-01", "emu-02"]
        assert all(line[3].startswith(f"[127.0.0.1]:{line[2]} ssh-ed25519 ") for line in lines)
        fleet_doc = json.loads((tmp_path / "fleet.json").read_text())
        assert len(fleet_doc["nodes"][0]["gpus"]) == 8
        assert (tmp_path / "authorized_keys").exists()
    finally:
        stop.set()
        t.join(10)
