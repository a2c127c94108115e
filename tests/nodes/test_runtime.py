"""The docker commands the platform runs on nodes (`nodes.runtime`): the argv it builds is
the boundary for tenant input, the parsers read Docker 26 output, and both work end to end
over real SSH against the node emulator."""

from __future__ import annotations

import json
import re
import shlex
from collections.abc import Iterator
from decimal import Decimal
from typing import Any

import paramiko
import pytest

from emulator import EmulatedFleet, EmulatedNode
from emulator.containers import parse_size_mb
from emulator.keys import public_line
from nodes import runtime, ssh
from nodes.runtime import (
    LABEL_MANAGED,
    LABEL_OWNER,
    LABEL_VRAM,
    VRAM_ENV,
    ContainerInfo,
    ContainerSpec,
    RuntimeParseError,
)

GPU = "GPU-5a1c0f3e-8d2b-4c47-9e6a-0b3f1d2c4e01"
MIG = "MIG-2f0c8d55-6b1e-5a3f-9d47-1e0a6c3b8f01"
LIB = "/usr/lib/gpuplatform/libvramquota.so"
DIGEST = "sha256:" + "0123456789abcdef" * 4
HEX64 = re.compile(r"^[0-9a-f]{64}$")
PWNED = "/tmp/pwned"  # a path in the emulated node's fake filesystem
HOSTILE = (
    "$(touch /tmp/pwned)",
    "; touch /tmp/pwned",
    "`touch /tmp/pwned`",
    "&& touch /tmp/pwned || true",
    'it\'s "quoted" \\ back',
    "line one\nline two",
    "--privileged",
    "-v=/:/host",
    "*",
    "",
)
# "gpu-workload: profile=steady base=2048MiB device=GPU-... quota=8192MiB (framework)"
QUOTA_LINE = re.compile(
    r"gpu-workload: profile=(?P<profile>\w+) base=\d+MiB device=(?P<device>\S+) "
    r"quota=(?:(?P<mb>\d+)MiB \((?P<source>[\w-]+)\)|none)"
)


def spec(**overrides: Any) -> ContainerSpec:
    base: dict[str, Any] = {
        "name": "gpp-slice-42",
        "image": "registry.local/ml/torch:2.3",
        "owner_key": "slice-42",
        "device": GPU,
        "vram_mb": 8192,
        "gpu_total_mb": 24576,
        "cpus": Decimal("3.00"),
        "memory_mb": 16384,
        "pids_limit": 512,
    }
    return ContainerSpec(**{**base, **overrides})


def options(argv: list[str], image: str) -> list[str]:
    """The argv items before the image: what docker reads as its own options."""
    return argv[: argv.index(image)]


def flag_values(argv: list[str], flag: str) -> list[str]:
    return [argv[i + 1] for i, a in enumerate(argv[:-1]) if a == flag]


def env_of(argv: list[str], image: str) -> dict[str, str]:
    items = flag_values(options(argv, image), "--env")
    return dict(item.split("=", 1) for item in items)


# --- run_argv: what a container gets


def test_run_argv_has_every_limit_and_security_flag() -> None:
    argv = runtime.run_argv(spec(command=("python3", "serve.py"), ports=(8888, 6006)))
    head = options(argv, "registry.local/ml/torch:2.3")
    assert argv[:3] == ["docker", "run", "--detach"]
    assert argv[-3:] == ["registry.local/ml/torch:2.3", "python3", "serve.py"]
    expected = {
        "--name": ["gpp-slice-42"],
        "--gpus": [f"device={GPU}"],
        "--cpu-period": ["100000"],
        "--cpu-quota": ["300000"],
        "--network": ["bridge"],
        "--memory": ["16384m"],
        "--memory-swap": ["16384m"],
        "--pids-limit": ["512"],
        "--cap-drop": ["ALL"],
        "--security-opt": ["no-new-privileges"],
        # the node agent's record of the quota (nodes/agent.py), which the container cannot change
        "--label": [f"{LABEL_OWNER}=slice-42", f"{LABEL_MANAGED}=1", f"{LABEL_VRAM}=8192"],
        "--restart": ["no"],
        "--publish": ["8888", "6006"],
    }
    for flag, values in expected.items():
        assert flag_values(head, flag) == values, flag
    assert "--init" in head


def test_run_argv_publishes_nothing_on_a_node_whose_containers_have_no_network() -> None:
    argv = runtime.run_argv(spec(ports=(8888, 22), network="none"))
    head = options(argv, "registry.local/ml/torch:2.3")
    assert flag_values(head, "--network") == ["none"]
    assert "--publish" not in head


def test_run_argv_never_grants_the_host() -> None:
    # tenant command items that look like options stay after the image, where they are
    # the container's arguments
    argv = runtime.run_argv(spec(command=HOSTILE, environment=(("OPTS", "--privileged"),)))
    head = options(argv, "registry.local/ml/torch:2.3")
    forbidden = (
        "--privileged",
        "-v",
        "--volume",
        "--mount",
        "--device",
        "--cap-add",
        "--net",
        "--pid",
        "--ipc",
        "--uts",
        "--userns",
        "--read-only",
        "--rm",
        "-p",
    )
    flags = [a for a in head if a.startswith("-")]
    assert not [f for f in flags if f.split("=")[0] in forbidden]
    # the network is the node's own setting, never the host's namespace
    assert flag_values(head, "--network") == ["bridge"]
    # every option that takes a value is followed by exactly its value
    assert all(not v.startswith("-") for v in flag_values(head, "--env"))
    assert argv[len(head) + 1 :] == list(HOSTILE)


def test_platform_env_caps_vram_for_every_framework() -> None:
    env = env_of(runtime.run_argv(spec(environment=(("MODEL", "llama"),))), spec().image)
    assert env == {
        "MODEL": "llama",
        VRAM_ENV: "8192",
        "GPUPLATFORM_MEMORY_FRACTION": "0.33",  # no quota library: the card is the total
        "XLA_PYTHON_CLIENT_MEM_FRACTION": "0.33",
        "XLA_PYTHON_CLIENT_PREALLOCATE": "false",
        "PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True",
        "TF_FORCE_GPU_ALLOW_GROWTH": "true",
        # display, video and graphics libraries stay out, whatever the image says
        "NVIDIA_DRIVER_CAPABILITIES": "compute,utility",
    }


@pytest.mark.parametrize(
    ("vram_mb", "total_mb", "fraction"),
    [
        (8192, 24576, "0.33"),
        (12287, 24576, "0.49"),  # 0.49996: rounded down, never past the quota
        (40960, 81920, "0.50"),
        (24576, 24576, "1.00"),
        (10, 81920, "0.01"),  # 0.0001: the floor keeps JAX usable
        (1, 1, "1.00"),
    ],
)
def test_xla_fraction_rounds_down_to_hundredths(vram_mb: int, total_mb: int, fraction: str) -> None:
    argv = runtime.run_argv(spec(vram_mb=vram_mb, gpu_total_mb=total_mb))
    assert env_of(argv, spec().image)["XLA_PYTHON_CLIENT_MEM_FRACTION"] == fraction


def test_quota_library_is_preloaded_only_on_a_full_gpu() -> None:
    full = env_of(runtime.run_argv(spec(quota_library=LIB)), spec().image)
    assert full["CUDA_DEVICE_MEMORY_LIMIT"] == full["CUDA_DEVICE_MEMORY_LIMIT_0"] == "8192m"
    assert full["LD_PRELOAD"] == LIB and full[VRAM_ENV] == "8192"
    mig = env_of(
        runtime.run_argv(spec(device=MIG, mig=True, gpu_total_mb=9984, quota_library=LIB)),
        spec().image,
    )
    none = env_of(runtime.run_argv(spec()), spec().image)
    for env in (mig, none):
        assert not {"CUDA_DEVICE_MEMORY_LIMIT", "CUDA_DEVICE_MEMORY_LIMIT_0", "LD_PRELOAD"} & set(
            env
        )
        assert env[VRAM_ENV] == "8192"
    assert mig["XLA_PYTHON_CLIENT_MEM_FRACTION"] == "0.82"


@pytest.mark.parametrize(
    "name",
    [
        VRAM_ENV,
        "GPUPLATFORM_EMULATOR_PROFILE",
        "XLA_PYTHON_CLIENT_MEM_FRACTION",
        "XLA_PYTHON_CLIENT_PREALLOCATE",
        "PYTORCH_CUDA_ALLOC_CONF",
        "TF_FORCE_GPU_ALLOW_GROWTH",
        "CUDA_DEVICE_MEMORY_LIMIT",
        "CUDA_DEVICE_MEMORY_LIMIT_0",
        "CUDA_DEVICE_MEMORY_SHARED_CACHE",
        "LD_PRELOAD",
        "NVIDIA_VISIBLE_DEVICES",
        "NVIDIA_DRIVER_CAPABILITIES",
        "NVIDIA_MIG_CONFIG_DEVICES",
        "NVIDIA_GDS",
        "CUDA_VISIBLE_DEVICES",
        "CUDA_DISABLE_CONTROL",
        "CUDA_DEVICE_SM_LIMIT",
        "CUDA_OVERSUBSCRIBE",
        "LD_LIBRARY_PATH",
        "LD_AUDIT",
        "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT",
    ],
)
def test_tenant_env_cannot_set_platform_variables(name: str) -> None:
    with pytest.raises(ValueError, match=f"variable {name} cannot be set: "):
        runtime.run_argv(spec(environment=(("OK", "1"), (name, "all"))))


def test_tenant_env_near_reserved_names_is_the_tenants() -> None:
    env = (("CUDA_DEVICE_ORDER", "PCI_BUS_ID"), ("MY_NVIDIA_KEY", "x"), ("ld_preload", "y"))
    argv = runtime.run_argv(spec(environment=env))
    assert set(env) <= set(env_of(argv, spec().image).items())


@pytest.mark.parametrize(
    ("environment", "message"),
    [
        ((("1ST", "x"),), "'1ST' is not a valid name"),
        ((("A-B", "x"),), "'A-B' is not a valid name"),
        ((("A B", "x"),), "'A B' is not a valid name"),
        ((("", "x"),), "'' is not a valid name"),
        ((("A=B", "x"),), "'A=B' is not a valid name"),
        ((("X" * 129, "x"),), "is not a valid name"),
        ((("TOKEN", "a\nb"),), "TOKEN must not contain NUL or line breaks"),
        ((("TOKEN", "a\rb"),), "TOKEN must not contain NUL or line breaks"),
        ((("TOKEN", "a\0b"),), "TOKEN must not contain NUL or line breaks"),
        ((("TOKEN", 5),), "TOKEN must be a string"),
        ((("A", "1"), ("A", "2")), "A is given twice"),
        ((("A", "1", "2"),), "must be \\(name, value\\) pairs"),
    ],
)
def test_bad_tenant_env_is_refused(environment: tuple[Any, ...], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        runtime.run_argv(spec(environment=environment))


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("name", "-x"),
        ("name", "a"),
        ("name", "a b"),
        ("name", "../etc"),
        ("name", ""),
        ("name", "gpp-slice-42\n"),
        ("image", "-e"),
        ("image", "--privileged"),
        ("image", ""),
        ("image", "Registry.local/UPPER/x"),
        ("image", "torch:tag with space"),
        ("image", "torch;reboot"),
        ("image", "torch@sha256:abc"),
        ("image", "torch:" + "t" * 129),
        ("image", "x/" + "a" * 260),
        ("owner_key", ""),
        ("owner_key", "slice,42"),
        ("owner_key", "slice=42"),
        ("owner_key", "-slice"),
        ("owner_key", "slice\n42"),
        ("device", "0"),
        ("device", "all"),
        ("device", "GPU-xyz"),
        ("device", f"{GPU},GPU-1"),
        ("device", f"{GPU}\n"),
        ("device", "MIG-GPU-abc/1"),
        ("vram_mb", 0),
        ("vram_mb", -1),
        ("vram_mb", True),
        ("vram_mb", 1.5),
        ("vram_mb", 24577),  # more than gpu_total_mb
        ("gpu_total_mb", 0),
        ("cpus", Decimal(0)),
        ("cpus", Decimal("-1")),
        ("cpus", Decimal("NaN")),
        ("cpus", Decimal("Infinity")),
        ("cpus", Decimal("0.0000000001")),
        ("cpus", Decimal("0.001")),  # under the kernel's 1 ms quota
        ("cpus", Decimal("0.000015")),  # not whole microseconds
        ("network", "host"),  # the node's own network namespace
        ("network", "container:other"),
        ("network", "--privileged"),
        ("network", ""),
        ("cpus", 2.5),
        ("cpus", "2"),
        ("memory_mb", 0),
        ("memory_mb", 5),
        ("memory_mb", "16g"),
        ("pids_limit", 0),
        ("pids_limit", None),
        ("command", ["python3"]),
        ("command", ("a\0b",)),
        ("command", (1,)),
        ("environment", [("A", "b")]),
        ("ports", (0,)),
        ("ports", (65536,)),
        ("ports", (80, 80)),
        ("ports", ("80",)),
        ("ports", [80]),
        ("quota_library", "libvramquota.so"),
        ("quota_library", "/usr/lib/a b.so"),
        ("quota_library", "/usr/lib/a.so:/tmp/b.so"),
        ("quota_library", "/usr/lib/readme.txt"),
        ("mig", 1),
    ],
)
def test_each_bad_field_is_refused_by_name(field: str, value: Any) -> None:
    with pytest.raises(ValueError, match=field):
        runtime.run_argv(spec(**{field: value}))


def test_mig_flag_must_agree_with_the_device() -> None:
    with pytest.raises(ValueError, match="device .* does not agree with mig=True"):
        runtime.run_argv(spec(mig=True))
    with pytest.raises(ValueError, match="device .* does not agree with mig=False"):
        runtime.run_argv(spec(device=MIG))


@pytest.mark.parametrize(
    "image",
    [
        "ubuntu",
        "pytorch/pytorch:2.4.0-cuda12.1-cudnn9-runtime",
        "nvcr.io/nvidia/pytorch:24.05-py3",
        "localhost:5000/team/img",
        "registry.local:5000/a/b__c/d-e:v1.2_3",
        f"ghcr.io/org/trainer@{DIGEST}",
        f"registry.local/ml/torch:2.3@{DIGEST}",
        "[::1]:5000/x:y",
    ],
)
def test_valid_image_references_are_accepted(image: str) -> None:
    argv = runtime.run_argv(spec(image=image, command=("python3",)))
    assert argv[-2:] == [image, "python3"]


@pytest.mark.parametrize(
    ("device", "mig"),
    [
        (GPU, False),
        (GPU.upper(), False),
        (MIG, True),
        ("MIG-GPU-5a1c0f3e-8d2b-4c47-9e6a-0b3f1d2c4e01/7/0", True),  # pre-R470 drivers
    ],
)
def test_gpu_and_both_mig_uuid_forms_are_accepted(device: str, mig: bool) -> None:
    argv = runtime.run_argv(spec(device=device, mig=mig))
    assert flag_values(argv, "--gpus") == [f"device={device}"]


def test_hostile_input_survives_shell_quoting_as_single_items() -> None:
    hostile_env = "$(reboot); `id` 'single' \"double\" \\ * ~ $HOME"
    argv = runtime.run_argv(spec(command=HOSTILE, environment=(("PROMPT", hostile_env),)))
    joined = shlex.join(argv)
    assert shlex.split(joined) == argv
    assert f"PROMPT={hostile_env}" in argv
    assert argv[-len(HOSTILE) :] == list(HOSTILE)


# --- the other commands


def test_ps_argv_lists_managed_containers_with_exact_owner_labels() -> None:
    argv = runtime.ps_argv()
    assert argv[:-2] == [
        "docker",
        "ps",
        "--all",
        "--no-trunc",
        "--filter",
        "label=gpuplatform.managed=1",
    ]
    assert argv[-2] == "--format"
    fmt = argv[-1]
    assert "{{json .}}" in fmt and '{{.Label "gpuplatform.owner" | json}}' in fmt
    owned = runtime.ps_argv("slice-42")
    # docker ANDs label filters: the platform's own container of that owner
    assert flag_values(owned, "--filter") == [
        "label=gpuplatform.managed=1",
        "label=gpuplatform.owner=slice-42",
    ]
    with pytest.raises(ValueError, match="owner_key"):
        runtime.ps_argv("a,b")


def test_container_command_argvs() -> None:
    cid = "3f" * 32
    assert runtime.inspect_argv(cid) == ["docker", "inspect", "--type", "container", cid]
    assert runtime.stop_argv("gpp-slice-42") == ["docker", "stop", "-t", "10", "gpp-slice-42"]
    assert runtime.stop_argv("gpp-slice-42", timeout_s=0)[3] == "0"
    assert runtime.rm_argv(cid) == ["docker", "rm", "--force", cid]
    assert runtime.logs_tail_argv(cid, lines=20) == ["docker", "logs", "--tail", "20", cid]
    for build in (runtime.inspect_argv, runtime.stop_argv, runtime.rm_argv):
        for bad in ("-f", "--all", "", "a b", "x;y", "/name"):
            with pytest.raises(ValueError, match="container"):
                build(bad)
    with pytest.raises(ValueError, match="timeout_s"):
        runtime.stop_argv("c1", timeout_s=-1)
    with pytest.raises(ValueError, match="lines"):
        runtime.logs_tail_argv("c1", lines=0)


# --- parsers, on Docker 26 output

CID = "5e6b1f0c0a9d4d0f8b7a6c5d4e3f2a1b0c9d8e7f6a5b4c3d2e1f0a9b8c7d6e5f"
# `docker ps --no-trunc --format '{{json .}}'`: labels in Go map order, NVIDIA's image
# labels with commas and spaces, Docker 26's ":::" IPv6 port form
PS_RUNNING = json.dumps(
    {
        "Command": '"/opt/nvidia/nvidia_entrypoint.sh python3 serve.py --port 8888"',
        "CreatedAt": "2024-06-05 10:12:01 +0000 UTC",
        "ID": CID,
        "Image": "nvcr.io/nvidia/pytorch:24.05-py3",
        "Labels": "maintainer=NVIDIA CORPORATION <cudatools@nvidia.com>,"
        "gpuplatform.owner=slice-42,com.nvidia.volumes.needed=nvidia_driver,"
        "com.nvidia.cudnn.version=9.1.0.70,com.example.list=a,b,c,gpuplatform.managed=1",
        "LocalVolumes": "0",
        "Mounts": "",
        "Names": "gpp-slice-42",
        "Networks": "bridge",
        "Ports": "0.0.0.0:32768->8888/tcp, :::32768->8888/tcp, 6006/tcp, 0.0.0.0:32770->5353/udp",
        "RunningFor": "2 minutes ago",
        "Size": "0B",
        "State": "running",
        "Status": "Up 2 minutes",
    },
    separators=(",", ":"),
)


def ps_row(**fields: str) -> dict[str, str]:
    row = json.loads(PS_RUNNING)
    row.update(fields)
    return row


def test_parse_ps_reads_docker_26_json_lines() -> None:
    (info,) = runtime.parse_ps(PS_RUNNING + "\n")
    assert info == ContainerInfo(
        id=CID,
        name="gpp-slice-42",
        image="nvcr.io/nvidia/pytorch:24.05-py3",
        owner_key="slice-42",
        running=True,
        status="running",
        exit_code=None,
        oom_killed=False,
        error="",
        started_at="",
        finished_at="",
        ports={8888: 32768},
        labels={
            "maintainer": "NVIDIA CORPORATION <cudatools@nvidia.com>",
            "gpuplatform.owner": "slice-42",
            "com.nvidia.volumes.needed": "nvidia_driver",
            "com.nvidia.cudnn.version": "9.1.0.70",
            "com.example.list": "a,b,c",
            "gpuplatform.managed": "1",
        },
    )


def test_parse_ps_takes_the_owner_from_the_exact_label_fields() -> None:
    # the platform's own format: the row, plus the labels asked for one by one; the
    # comma-joined text alone would read this owner as "slice-42" + a label "x"
    row = ps_row(Labels="gpuplatform.managed=1,gpuplatform.owner=slice-42,x=1")
    line = json.dumps({"container": row, "owner": "slice-42,x=1", "managed": "1"})
    (info,) = runtime.parse_ps(line)
    assert info.owner_key == "slice-42,x=1" and info.labels[LABEL_OWNER] == "slice-42,x=1"


@pytest.mark.parametrize(
    ("state", "status", "running", "exit_code"),
    [
        ("exited", "Exited (137) 2 minutes ago", False, 137),
        ("exited", "Exited (0) About an hour ago", False, 0),
        ("created", "Created", False, None),
        ("paused", "Up 3 minutes (Paused)", True, None),
        ("restarting", "Restarting (1) 4 seconds ago", True, 1),
        ("dead", "Dead", False, None),
        ("running", "Up 5 seconds (healthy)", True, None),
    ],
)
def test_parse_ps_reads_state_and_exit_code(
    state: str, status: str, running: bool, exit_code: int | None
) -> None:
    (info,) = runtime.parse_ps(json.dumps(ps_row(State=state, Status=status, Ports="")))
    assert (info.status, info.running, info.exit_code, info.ports) == (
        state,
        running,
        exit_code,
        {},
    )


@pytest.mark.parametrize(
    ("text", "ports"),
    [
        ("", {}),
        ("8888/tcp", {}),
        ("0.0.0.0:32768->8888/tcp, :::32768->8888/tcp", {8888: 32768}),
        ("[::]:32771->22/tcp", {22: 32771}),  # Docker 27+ brackets IPv6
        ("127.0.0.1:40000->8888/tcp", {8888: 40000}),
        ("0.0.0.0:32768-32769->8000-8001/tcp", {8000: 32768, 8001: 32769}),
        ("0.0.0.0:32770->5353/udp", {}),
    ],
)
def test_parse_ps_ports(text: str, ports: dict[int, int]) -> None:
    assert runtime.parse_ps_ports(text) == ports


def test_parse_ps_tolerates_no_containers_and_unknown_fields() -> None:
    assert runtime.parse_ps("") == []
    assert runtime.parse_ps("\n  \n") == []
    (info,) = runtime.parse_ps(json.dumps(ps_row(Platform="linux/amd64", Extra={"a": 1})))
    assert info.id == CID


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("CONTAINER ID   IMAGE", "line 1 is not JSON"),
        ("[]", "not a JSON object"),
        ('{"ID": 5, "State": "running"}', "ID is missing or not str"),
        (json.dumps({"ID": CID}), "State is missing"),
        (json.dumps({"ID": "", "State": "running"}), "ID is empty"),
        (json.dumps({"container": [], "owner": ""}), "container is not a JSON object"),
        (json.dumps(ps_row(Ports="0.0.0.0:x->8888/tcp")), "unreadable port binding"),
        (PS_RUNNING + "\n{", "line 2 is not JSON"),
    ],
)
def test_parse_ps_refuses_malformed_output(text: str, message: str) -> None:
    with pytest.raises(RuntimeParseError, match=message):
        runtime.parse_ps(text)


# `docker inspect <id>` of a running container, trimmed of fields the parser ignores
INSPECT_RUNNING = f"""[
    {{
        "Id": "{CID}",
        "Created": "2024-06-05T10:12:01.123456789Z",
        "Path": "/sbin/docker-init",
        "Args": ["--", "python3", "serve.py"],
        "State": {{
            "Status": "running",
            "Running": true,
            "Paused": false,
            "Restarting": false,
            "OOMKilled": false,
            "Dead": false,
            "Pid": 41873,
            "ExitCode": 0,
            "Error": "",
            "StartedAt": "2024-06-05T10:12:01.87210436Z",
            "FinishedAt": "0001-01-01T00:00:00Z"
        }},
        "Image": "sha256:9f3bb2d1c4e5a6b7c8d9e0f1a2b3c4d5e6f7a8b9c0d1e2f3a4b5c6d7e8f9a0b1",
        "Name": "/gpp-slice-42",
        "RestartCount": 0,
        "HostConfig": {{"CapDrop": ["ALL"], "SecurityOpt": ["no-new-privileges"]}},
        "Config": {{
            "Hostname": "5e6b1f0c0a9d",
            "Env": ["GPUPLATFORM_VRAM_LIMIT_MB=8192", "PATH=/usr/local/bin:/usr/bin"],
            "Cmd": ["python3", "serve.py"],
            "Image": "nvcr.io/nvidia/pytorch:24.05-py3",
            "Labels": {{
                "com.nvidia.volumes.needed": "nvidia_driver",
                "gpuplatform.managed": "1",
                "gpuplatform.owner": "slice-42"
            }}
        }},
        "NetworkSettings": {{
            "Bridge": "",
            "Ports": {{
                "6006/tcp": null,
                "8888/tcp": [
                    {{"HostIp": "0.0.0.0", "HostPort": "32768"}},
                    {{"HostIp": "::", "HostPort": "32768"}}
                ]
            }},
            "IPAddress": "172.17.0.2"
        }}
    }}
]
"""


def inspect_doc(**state: Any) -> list[dict[str, Any]]:
    docs = json.loads(INSPECT_RUNNING)
    docs[0]["State"].update(state)
    return docs


def test_parse_inspect_reads_a_running_container() -> None:
    (info,) = runtime.parse_inspect(INSPECT_RUNNING)
    assert info == ContainerInfo(
        id=CID,
        name="gpp-slice-42",
        image="nvcr.io/nvidia/pytorch:24.05-py3",
        owner_key="slice-42",
        running=True,
        status="running",
        exit_code=None,
        oom_killed=False,
        error="",
        started_at="2024-06-05T10:12:01.87210436Z",
        finished_at="",
        ports={8888: 32768},
        labels={
            "com.nvidia.volumes.needed": "nvidia_driver",
            "gpuplatform.managed": "1",
            "gpuplatform.owner": "slice-42",
        },
        # the effective environment, the image's merged in: the post-start check reads it
        env=("GPUPLATFORM_VRAM_LIMIT_MB=8192", "PATH=/usr/local/bin:/usr/bin"),
    )


def test_parse_inspect_reads_an_oom_killed_container() -> None:
    docs = inspect_doc(
        Status="exited",
        Running=False,
        OOMKilled=True,
        Pid=0,
        ExitCode=137,
        FinishedAt="2024-06-05T10:20:44.5Z",
    )
    docs[0]["NetworkSettings"]["Ports"] = {}  # docker drops the bindings of a stopped one
    docs[0]["Config"]["Labels"] = None
    (info,) = runtime.parse_inspect(json.dumps(docs))
    assert (info.running, info.status, info.exit_code, info.oom_killed) == (
        False,
        "exited",
        137,
        True,
    )
    assert info.finished_at == "2024-06-05T10:20:44.5Z"
    assert info.ports == {} and info.labels == {} and info.owner_key == ""


def test_parse_inspect_reads_a_container_that_never_started() -> None:
    error = (
        "failed to create task for container: failed to create shim task: OCI runtime "
        "create failed: ... nvidia-container-cli: device error: GPU-x: unknown device"
    )
    docs = inspect_doc(Status="created", Running=False, ExitCode=128, Error=error, StartedAt="")
    (info,) = runtime.parse_inspect(json.dumps(docs))
    assert (info.status, info.exit_code, info.error, info.started_at) == (
        "created",
        128,
        error,
        "",
    )


def test_parse_inspect_tolerates_no_containers_and_unknown_fields() -> None:
    assert runtime.parse_inspect("[]\n") == []
    assert runtime.parse_inspect("") == []
    docs = inspect_doc(Health={"Status": "healthy"})
    docs[0]["GraphDriver"] = {"Name": "overlay2"}
    assert runtime.parse_inspect(json.dumps(docs))[0].id == CID


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("Error: No such object: x", "not JSON"),
        ("{}", "not a JSON array"),
        ("[1]", "item 0 is not a JSON object"),
        ('[{"Id": "x"}]', "State is missing"),
        (json.dumps(inspect_doc(Running="yes")), "Running is missing or not bool"),
        (json.dumps(inspect_doc(ExitCode=None)), "ExitCode is missing or not int"),
        (json.dumps(inspect_doc(Status=None)), "Status is missing or not str"),
    ],
)
def test_parse_inspect_refuses_malformed_output(text: str, message: str) -> None:
    # a ValueError, so callers that treat bad node output as bad input catch it too
    with pytest.raises(ValueError, match=message) as raised:
        runtime.parse_inspect(text)
    assert raised.type is RuntimeParseError


# --- end to end: real SSH to the node emulator


@pytest.fixture(scope="module")
def emulated(platform_key: paramiko.PKey, tmp_path_factory) -> Iterator[EmulatedFleet]:
    # emu-01: 2x A30 with the quota library / emu-02: L4 / emu-03: A100-80GB with MIG on
    fleet = EmulatedFleet.start(
        count=3,
        authorized_keys=[public_line(platform_key)],
        state_dir=tmp_path_factory.mktemp("runtime-emu"),
    )
    yield fleet
    fleet.stop()


@pytest.fixture
def node(emulated: EmulatedFleet) -> Iterator[EmulatedNode]:
    n = emulated.nodes[0]
    n.reset()
    yield n
    n.reset()


@pytest.fixture
def mig_node(emulated: EmulatedFleet) -> Iterator[EmulatedNode]:
    n = emulated.nodes[2]
    n.reset()
    yield n
    n.reset()


def endpoint(node: EmulatedNode) -> ssh.Endpoint:
    return ssh.Endpoint(node.address, node.port, "gpuplatform", node.host_public_key())


def docker(pool: ssh.SSHPool, node: EmulatedNode, argv: list[str]) -> str:
    result = pool.run(endpoint(node), argv)
    assert result.ok, result.stderr.decode()
    return result.stdout.decode()


def node_spec(node: EmulatedNode, gpu: int = 0, **overrides: Any) -> ContainerSpec:
    g = node.gpus[gpu]
    lib = node.state.quota_library or ""
    fields = {"device": g.uuid, "gpu_total_mb": g.memory_total_mb, "quota_library": lib}
    return spec(**{**fields, **overrides})


def with_emulator_env(argv: list[str], s: ContainerSpec, **env: str) -> list[str]:
    """The emulator's workload knobs (GPUPLATFORM_EMULATOR_*) are platform-reserved names a
    tenant cannot pass, so the test (the emulator's operator) adds them before the image."""
    at = len(argv) - len(s.command) - 1
    assert argv[at] == s.image
    extra = [x for k, v in env.items() for x in ("--env", f"GPUPLATFORM_EMULATOR_{k}={v}")]
    return argv[:at] + extra + argv[at:]


def quota_line(logs: str) -> re.Match[str]:
    m = QUOTA_LINE.search(logs)
    assert m is not None, logs
    return m


def logs_of(pool: ssh.SSHPool, node: EmulatedNode, container: str) -> str:
    result = pool.run(endpoint(node), runtime.logs_tail_argv(container, lines=50))
    assert result.ok, result.stderr.decode()
    return result.stdout.decode() + result.stderr.decode()


def inspect_one(pool: ssh.SSHPool, node: EmulatedNode, container: str) -> ContainerInfo:
    (info,) = runtime.parse_inspect(docker(pool, node, runtime.inspect_argv(container)))
    return info


def test_slice_container_lifecycle_on_an_emulated_gpu(
    pool: ssh.SSHPool, node: EmulatedNode
) -> None:
    s = node_spec(node, environment=(("MODEL", "llama"),), ports=(8888,))
    argv = runtime.run_argv(s)
    cid = docker(pool, node, argv).strip()
    assert HEX64.match(cid)

    (listed,) = runtime.parse_ps(docker(pool, node, runtime.ps_argv("slice-42")))
    assert (listed.id, listed.name, listed.owner_key) == (cid, "gpp-slice-42", "slice-42")
    assert listed.running and listed.status == "running" and listed.exit_code is None
    assert listed.labels[LABEL_MANAGED] == "1" and listed.image == s.image
    host_port = listed.ports[8888]

    info = inspect_one(pool, node, cid)
    assert (info.id, info.name, info.image, info.owner_key) == (
        cid,
        "gpp-slice-42",
        s.image,
        "slice-42",
    )
    assert info.running and info.status == "running" and info.exit_code is None
    assert info.ports == {8888: host_port} and info.started_at and info.finished_at == ""
    assert info.labels == {LABEL_OWNER: "slice-42", LABEL_MANAGED: "1", LABEL_VRAM: "8192"}

    # what the node applied
    emu = node.container(cid)
    assert emu is not None
    hc = emu.host_config
    assert hc["CapDrop"] == ["ALL"] and hc["SecurityOpt"] == ["no-new-privileges"]
    assert hc["Privileged"] is False and hc["Binds"] is None and hc["CapAdd"] is None
    assert hc["NetworkMode"] == "bridge" and hc["Init"] is True
    assert hc["RestartPolicy"]["Name"] == "no" and hc["AutoRemove"] is False
    assert hc["CpuQuota"] == 300_000 and hc["CpuPeriod"] == 100_000 and hc["NanoCpus"] == 0
    assert hc["Memory"] == 16384 * 1024**2
    assert hc["PidsLimit"] == 512
    assert hc["DeviceRequests"][0]["DeviceIDs"] == [s.device]
    assert emu.device_uuid == s.device and emu.env["MODEL"] == "llama"
    assert emu.env["LD_PRELOAD"] == node.state.quota_library
    assert parse_size_mb(emu.env["CUDA_DEVICE_MEMORY_LIMIT"]) == s.vram_mb
    assert emu.limit_mb == s.vram_mb
    line = quota_line(logs_of(pool, node, cid))
    assert line["device"] == s.device and int(line["mb"]) == s.vram_mb
    # framework and quota library set the same cap; which name the emulator logs for a
    # tie is its choice
    assert line["source"] in ("framework", "quota-library")

    assert docker(pool, node, runtime.stop_argv(cid, timeout_s=5)) == cid + "\n"
    stopped = inspect_one(pool, node, cid)
    assert not stopped.running and stopped.status == "exited"
    # 143 when the workload exits on SIGTERM (tini forwards it), 137 after the timeout's
    # SIGKILL; the emulator always answers 137
    assert stopped.exit_code in (137, 143) and stopped.finished_at
    assert stopped.ports == {} and stopped.oom_killed is False
    (listed,) = runtime.parse_ps(docker(pool, node, runtime.ps_argv()))
    assert listed.id == cid and not listed.running and listed.exit_code == stopped.exit_code

    assert docker(pool, node, runtime.rm_argv(cid)) == cid + "\n"
    assert runtime.parse_ps(docker(pool, node, runtime.ps_argv())) == []
    gone = pool.run(endpoint(node), runtime.inspect_argv(cid))
    assert gone.exit_status == 1 and runtime.parse_inspect(gone.stdout.decode()) == []


def test_ps_lists_only_managed_containers_by_owner(pool: ssh.SSHPool, node: EmulatedNode) -> None:
    a = docker(pool, node, runtime.run_argv(node_spec(node, name="gpp-a", owner_key="slice-a")))
    b = docker(pool, node, runtime.run_argv(node_spec(node, 1, name="gpp-b", owner_key="slice-b")))
    # containers the platform did not start
    docker(pool, node, ["docker", "run", "-d", "--label", f"{LABEL_OWNER}=slice-z", "busybox"])
    docker(pool, node, ["docker", "run", "-d", "--label", f"{LABEL_MANAGED}=0", "busybox"])
    every = runtime.parse_ps(docker(pool, node, runtime.ps_argv()))
    assert sorted(i.id for i in every) == sorted([a.strip(), b.strip()])
    (only_a,) = runtime.parse_ps(docker(pool, node, runtime.ps_argv("slice-a")))
    assert only_a.id == a.strip() and only_a.owner_key == "slice-a"
    assert runtime.parse_ps(docker(pool, node, runtime.ps_argv("slice-c"))) == []


def test_node_without_quota_library_caps_by_framework_only(
    pool: ssh.SSHPool, node: EmulatedNode
) -> None:
    s = node_spec(node, quota_library="", vram_mb=6144)
    cid = docker(pool, node, runtime.run_argv(s)).strip()
    emu = node.container(cid)
    assert emu is not None and "LD_PRELOAD" not in emu.env
    assert "CUDA_DEVICE_MEMORY_LIMIT" not in emu.env
    line = quota_line(logs_of(pool, node, cid))
    assert (int(line["mb"]), line["source"]) == (6144, "framework")


def test_mig_slice_gets_its_device_and_no_quota_library(
    pool: ssh.SSHPool, mig_node: EmulatedNode
) -> None:
    gpu = mig_node.gpus[0]
    assert gpu.mig_enabled
    dev = next(d for d in gpu.mig_devices if d["profile"] == "1g.10gb")
    s = spec(
        device=dev["uuid"],
        mig=True,
        vram_mb=dev["memory_mb"],
        gpu_total_mb=dev["memory_mb"],
        quota_library=mig_node.state.quota_library or "",
    )
    assert s.quota_library  # the node has one; a MIG slice does not use it
    cid = docker(pool, mig_node, runtime.run_argv(s)).strip()
    emu = mig_node.container(cid)
    assert emu is not None and emu.device_uuid == dev["uuid"] and emu.gpu_uuid == gpu.uuid
    assert "LD_PRELOAD" not in emu.env and emu.env["XLA_PYTHON_CLIENT_MEM_FRACTION"] == "1.00"
    assert emu.limit_mb == dev["memory_mb"]
    line = quota_line(logs_of(pool, mig_node, cid))
    assert line["device"] == dev["uuid"] and int(line["mb"]) == dev["memory_mb"]
    assert line["source"] in ("mig", "framework")  # the same cap twice: a tie
    info = inspect_one(pool, mig_node, cid)
    assert info.running and info.owner_key == "slice-42"


def test_workload_past_its_quota_dies_with_cuda_oom(
    pool: ssh.SSHPool, node: EmulatedNode, emulated: EmulatedFleet
) -> None:
    s = node_spec(node, vram_mb=4096)
    argv = with_emulator_env(
        runtime.run_argv(s), s, PROFILE="oom", MB="2048", RATE_MB_PER_MIN="1024"
    )
    cid = docker(pool, node, argv).strip()
    assert inspect_one(pool, node, cid).running
    emulated.advance(150)  # 2048 MiB + 1024 MiB/min passes 4096 MiB at t=120 s
    info = inspect_one(pool, node, cid)
    assert not info.running and info.status == "exited"
    # a CUDA OOM is the workload's own error, not the kernel's OOM killer
    assert info.exit_code == 137 and info.oom_killed is False
    assert "CUDA out of memory" in logs_of(pool, node, cid)
    (listed,) = runtime.parse_ps(docker(pool, node, runtime.ps_argv()))
    assert listed.exit_code == 137 and listed.oom_killed is False  # ps cannot tell


def test_kernel_oom_kill_shows_in_inspect(pool: ssh.SSHPool, node: EmulatedNode) -> None:
    cid = docker(pool, node, runtime.run_argv(node_spec(node))).strip()
    assert node.kill_container(cid, 137, oom_killed=True)
    info = inspect_one(pool, node, cid)
    assert (info.running, info.exit_code, info.oom_killed) == (False, 137, True)


def test_hostile_command_and_env_reach_docker_as_single_items(
    pool: ssh.SSHPool, node: EmulatedNode
) -> None:
    hostile_env = "$(touch /tmp/pwned); `touch /tmp/pwned` 'q' \"d\" \\ *"
    s = node_spec(node, command=("python3", "-c", *HOSTILE), environment=(("X", hostile_env),))
    argv = runtime.run_argv(s)
    node.clear_audit()
    cid = docker(pool, node, argv).strip()
    assert node.audit_log == [argv]  # one simple command, every item intact
    assert PWNED not in node.files
    (doc,) = json.loads(docker(pool, node, runtime.inspect_argv(cid)))
    assert doc["Config"]["Cmd"] == ["python3", "-c", *HOSTILE]
    assert f"X={hostile_env}" in doc["Config"]["Env"]
