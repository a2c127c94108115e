"""The framework caps are fractions of what the device reports inside the slice (the quota
library's limit, the MIG instance, or the whole card), every fraction against the same
denominator as the engines' flags; and a login gets the same platform variables through
a read-only file the node writes (nodes/login_env.py), quoted so no value runs anything."""

from __future__ import annotations

import json
import shlex
import subprocess
from decimal import Decimal

import pytest

from nodes import engines, isolation, login_env, runtime
from nodes.services import containers
from tests.conftest import SSH_KEY
from tests.gateway.support import running_slice

GPU = "GPU-8f1c2a3b-0000-4000-8000-000000000001"
MIG = "MIG-8f1c2a3b-0000-4000-8000-000000000002"
LIB = "/usr/lib/gpuplatform/libvramquota.so"


def spec(**kw) -> runtime.ContainerSpec:
    base = {
        "name": "gpp-slice-7",
        "image": "gpuplatform-lab/ssh:1",
        "owner_key": "slice-7",
        "device": GPU,
        "vram_mb": 8192,
        "gpu_total_mb": 81920,
        "cpus": Decimal("2.00"),
        "memory_mb": 16384,
        "pids_limit": 512,
    }
    return runtime.ContainerSpec(**{**base, **kw})


def caps(s: runtime.ContainerSpec) -> dict[str, str]:
    return dict(runtime.platform_env(s))


def test_under_a_quota_library_jax_gets_the_whole_slice_not_a_tenth_of_the_card() -> None:
    # 8 GB on an 80 GB A100: the library reports 8 GB as the device's total
    env = caps(spec(quota_library=LIB))
    assert env["XLA_PYTHON_CLIENT_MEM_FRACTION"] == "1.00"  # was 0.10: a tenth of the slice
    assert env["GPUPLATFORM_MEMORY_FRACTION"] == "1.00"


def test_without_a_quota_library_the_fractions_are_of_the_physical_card() -> None:
    env = caps(spec(gpu_total_mb=24576, vram_mb=8192))
    assert env["XLA_PYTHON_CLIENT_MEM_FRACTION"] == env["GPUPLATFORM_MEMORY_FRACTION"] == "0.33"


def test_on_a_mig_instance_the_fractions_are_of_the_instance_library_or_not() -> None:
    # 8 GB tier on a 1g.10gb instance (9,984 MiB); the node's library is not used there
    env = caps(spec(device=MIG, mig=True, gpu_total_mb=9984, quota_library=LIB))
    assert env["XLA_PYTHON_CLIENT_MEM_FRACTION"] == env["GPUPLATFORM_MEMORY_FRACTION"] == "0.82"
    assert "LD_PRELOAD" not in env


@pytest.mark.parametrize(
    ("vram_mb", "total_mb", "mig", "library"),
    [
        (8192, 81920, False, True),
        (8192, 81920, False, False),
        (4096, 24576, False, True),
        (12288, 24576, False, False),
        (8192, 9984, True, False),
        (24576, 24576, False, True),
    ],
)
def test_every_fraction_shares_the_engines_denominator(
    vram_mb: int, total_mb: int, mig: bool, library: bool
) -> None:
    s = spec(
        vram_mb=vram_mb,
        gpu_total_mb=total_mb,
        mig=mig,
        device=MIG if mig else GPU,
        quota_library=LIB if library else "",
    )
    reported = engines.reported_total_mb(
        vram_mb=vram_mb, device_mb=total_mb, quota_library=library, mig=mig
    )
    env = caps(s)
    assert env["XLA_PYTHON_CLIENT_MEM_FRACTION"] == engines.fraction(vram_mb, reported)
    assert env["GPUPLATFORM_MEMORY_FRACTION"] == engines.fraction(vram_mb, reported)
    # vLLM's flag for 90% of the slice is a share of the same total
    flag = engines.engine_flags("vllm", budget_mb=vram_mb * 9 // 10, total_mb=reported)
    assert Decimal(flag[1]) <= Decimal(env["XLA_PYTHON_CLIENT_MEM_FRACTION"])
    # PyTorch's allocator setting is no fraction: nothing to size
    assert env["PYTORCH_CUDA_ALLOC_CONF"] == "expandable_segments:True"


def test_the_login_file_holds_the_caps_and_the_device_but_not_the_tenants_environment() -> None:
    s = spec(quota_library=LIB, environment=(("HF_TOKEN", "hf_secret"), ("MODEL", "llama")))
    env = login_env.login_env(runtime.platform_env(s), s.device)
    text = login_env.profile_text(env)
    assert "hf_secret" not in text and "HF_TOKEN" not in text and "MODEL" not in text
    assert dict(env) == {**caps(s), "NVIDIA_VISIBLE_DEVICES": GPU}
    assert "export XLA_PYTHON_CLIENT_MEM_FRACTION=1.00\n" in text
    assert f"export LD_PRELOAD={LIB}\n" in text


def test_a_shell_reading_the_file_gets_every_value_verbatim_and_runs_nothing(tmp_path) -> None:
    marker = tmp_path / "ran"
    hostile = {
        "A": f"$(touch {marker})",
        "B": f"`touch {marker}`; touch {marker}",
        "C": 'it\'s "quoted" \\ and $HOME',
        "D": "",
        "E": "expandable_segments:True",
    }
    path = tmp_path / "gpuplatform.sh"
    path.write_text(login_env.profile_text(hostile.items()))
    script = f'. "{path}"; for n in A B C D E; do eval "printf \'%s\\0\' \\"\\${{$n}}\\""; done'
    for shell in ("sh", "busybox"):
        argv = [shell, "-c", script] if shell == "sh" else ["busybox", "sh", "-c", script]
        out = subprocess.run(argv, capture_output=True, check=True)  # noqa: S603
        assert out.stdout.decode().split("\0")[:-1] == list(hostile.values())
    assert not marker.exists()


@pytest.mark.parametrize(
    ("name", "value"),
    [("BAD NAME", "x"), ("1ST", "x"), ("OK", "two\nlines"), ("OK", "nul\0"), ("", "x")],
)
def test_the_file_refuses_what_a_line_could_not_hold(name: str, value: str) -> None:
    with pytest.raises(ValueError, match="name|one line"):
        login_env.profile_text([(name, value)])


def test_the_file_is_mounted_read_only_at_the_profile_path_and_written_from_stdin() -> None:
    path = login_env.file_for("slice-7")
    assert path.startswith(login_env.DIRECTORY + "/slice-7-") and path.endswith(".sh")
    assert login_env.file_for("slice-7") != path  # a fresh file each start
    argv = runtime.run_argv(spec(login_env_file=path))
    mounts = [argv[i + 1] for i, a in enumerate(argv) if a == "--mount"]
    assert mounts == [f"type=bind,source={path},target=/etc/profile.d/gpuplatform.sh,readonly"]
    assert "--mount" not in runtime.run_argv(spec())  # a probe, say: no file, no mount
    # the content travels on stdin: the argv names only the platform's own path
    assert login_env.write_argv(path) == [
        "install", "-m", "0644", "-o", "0", "-g", "0", "/dev/stdin", path,
    ]  # fmt: skip
    assert login_env.directory_argv()[:4] == ["install", "-d", "-m", "0700"]


@pytest.mark.parametrize(
    "path",
    [
        "/etc/shadow",
        "/var/lib/gpuplatform/login-env/../host-keys/slice-7-0123456789abcdef",
        "/var/lib/gpuplatform/login-env/slice-7-0123456789abcdef.sh,target=/x",
        "/var/lib/gpuplatform/login-env/slice-7.sh",
        "/var/lib/gpuplatform/login-env/sub/slice-7-0123456789abcdef.sh",
        "slice-7-0123456789abcdef.sh",
    ],
)
def test_no_other_path_can_be_mounted_or_removed(path: str) -> None:
    with pytest.raises(ValueError, match="login environment file"):
        runtime.run_argv(spec(login_env_file=path))
    for argv in (login_env.remove_argv, login_env.write_argv):
        with pytest.raises(ValueError, match="login environment file"):
            argv(path)


def test_the_mounted_file_is_read_back_from_docker_inspect() -> None:
    path = login_env.file_for("slice-7")
    inspect = [
        {
            "Mounts": [
                {"Type": "volume", "Source": "/var/lib/docker/volumes/v/_data", "Target": "/d"},
                {"Type": "bind", "Source": "/etc/passwd", "Destination": "/etc/x"},
                {"Type": "bind", "Source": path, "Destination": login_env.PATH_IN_CONTAINER},
            ]
        }
    ]
    assert login_env.mounted_file(json.dumps(inspect)) == path
    # what the run asked for (`--mount` as given) is read as well
    asked = [{"Mounts": [], "HostConfig": {"Mounts": [{"Source": path, "Target": "/etc/x"}]}}]
    assert login_env.mounted_file(json.dumps(asked)) == ""  # not at the profile's path
    asked[0]["HostConfig"]["Mounts"][0]["Target"] = login_env.PATH_IN_CONTAINER
    assert login_env.mounted_file(json.dumps(asked)) == path
    forged = [{"Mounts": [{"Source": "/etc/passwd", "Target": login_env.PATH_IN_CONTAINER}]}]
    assert login_env.mounted_file(json.dumps(forged)) == ""
    assert login_env.mounted_file("not json") == login_env.mounted_file("[]") == ""


@pytest.mark.django_db(transaction=True)
def test_a_started_slice_mounts_its_login_file_and_removal_takes_it_away(
    eager, worker_fleet, funded, owner_a, image_ssh
) -> None:
    fleet = worker_fleet()
    emu, node = fleet.nodes[0], fleet.registered[0]
    s = running_slice(funded, owner_a, image_ssh, public_key=SSH_KEY)
    inspected = containers.node_run(node=node, argv=runtime.inspect_argv(s.container_id))
    path = login_env.mounted_file(inspected.stdout.decode())
    assert path.startswith(login_env.DIRECTORY + f"/{s.owner_key}-"), inspected.stdout[:300]
    text = emu.state.files[path].decode()
    lines = [shlex.split(line) for line in text.splitlines() if line.startswith("export ")]
    exported = dict(words[1].split("=", 1) for words in lines)
    container = emu.container(s.container_id)
    assert container is not None
    # every variable the platform set on the first process, with its value, and the device
    platform = {k: v for k, v in container.env.items() if isolation.reserved_reason(k)}
    assert exported.pop("NVIDIA_VISIBLE_DEVICES") == container.device_uuid
    assert exported == {k: v for k, v in platform.items() if k != "NVIDIA_VISIBLE_DEVICES"}
    assert exported["XLA_PYTHON_CLIENT_MEM_FRACTION"] == "1.00"  # 4 GB under the library
    assert "WORKLOAD_MB" not in text  # the tenant's launch environment stays off the node
    assert containers.container_remove(node=node, container=s.container_id, grace_s=0)
    assert path not in emu.state.files
