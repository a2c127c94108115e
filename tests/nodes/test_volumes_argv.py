"""The docker volume commands and a slice's --mount, as argv: only the platform's own
volume names, only paths under /data or /workspace, never a bind mount; pure, no node."""

from __future__ import annotations

import pytest

from nodes import runtime, volumes
from tests.nodes.test_runtime import flag_values, options, spec

NAME = "gpp-vol-12-0a1b2c3d"


@pytest.mark.parametrize(
    "path",
    ["/data", "/data/ckpt", "/workspace", "/workspace/a.b_c-d/e", "/data/" + "x" * 60],
)
def test_paths_under_data_or_workspace_are_mount_points(path: str) -> None:
    assert volumes.mount_path_refusal(path) is None
    assert volumes.mount_arg(NAME, path) == f"type=volume,source={NAME},target={path}"


@pytest.mark.parametrize(
    "path",
    ["", "/", "data", "/etc", "/data/..", "/data/../etc", "/data//x", "/data/x/", "/data/./x",
     "/dataset", "/data/a,b", "/data/a=b", "/data/a b", "/data/$(id)", "/proc", "/var/run",
     "/data/-x", None, 5, "/data/" + "x" * 300],
)  # fmt: skip
def test_anything_else_is_refused_with_a_reason(path: object) -> None:
    assert volumes.mount_path_refusal(path)
    with pytest.raises(ValueError, match="mount path"):
        volumes.mount_arg(NAME, path)


@pytest.mark.parametrize(
    "name", ["data", "/var/lib/docker", "gpp-vol-1", "gpp-vol-1-0A1B2C3D", "gpp-vol-1-abc;x", ""]
)
def test_only_the_platforms_own_volume_names_reach_docker(name: str) -> None:
    with pytest.raises(ValueError):
        volumes.create_argv(name, {"gpuplatform.owner": "volume-1"})
    with pytest.raises(ValueError):
        volumes.remove_argv(name)
    with pytest.raises(ValueError):
        volumes.mount_arg(name, "/data")


def test_create_labels_the_volume_and_rm_never_forces() -> None:
    argv = volumes.create_argv(NAME, {"gpuplatform.owner": "volume-12", "gpuplatform.managed": "1"})
    assert argv == ["docker", "volume", "create", "--label", "gpuplatform.managed=1",
                    "--label", "gpuplatform.owner=volume-12", NAME]  # fmt: skip
    assert volumes.remove_argv(NAME) == ["docker", "volume", "rm", NAME]
    with pytest.raises(ValueError):
        volumes.create_argv(NAME, {"gpuplatform.owner": "a b"})


def test_du_reads_a_mountpoint_docker_gave_and_its_byte_count() -> None:
    where = volumes.parse_mountpoint(f"/srv/docker/volumes/{NAME}/_data\n")
    assert volumes.usage_argv(where)[-2:] == ["--", where]
    assert volumes.parse_usage(f"123456\t{where}\n") == 123456
    for bad in ("", "/etc/passwd", "relative/_data", "/a/../b/_data", "/a b/_data"):
        with pytest.raises(ValueError):
            volumes.parse_mountpoint(bad)
    with pytest.raises(ValueError):
        volumes.parse_usage("du: cannot access")


def test_a_slice_gets_one_mount_per_volume_and_never_a_bind() -> None:
    argv = runtime.run_argv(
        spec(mounts=((NAME, "/data/ckpt"), ("gpp-vol-13-0a1b2c3e", "/workspace")))
    )
    before = options(argv, "registry.local/ml/torch:2.3")
    assert flag_values(before, "--mount") == [
        f"type=volume,source={NAME},target=/data/ckpt",
        "type=volume,source=gpp-vol-13-0a1b2c3e,target=/workspace",
    ]
    assert "--volume" not in before and "-v" not in before
    assert not any("type=bind" in item for item in argv)


@pytest.mark.parametrize(
    "mounts",
    [
        ((NAME, "/etc"),),
        (("/var/lib/docker", "/data"),),
        ((NAME, "/data"), ("gpp-vol-13-0a1b2c3e", "/data")),
        tuple((f"gpp-vol-{i}-0a1b2c3d", f"/data/{i}") for i in range(volumes.MAX_MOUNTS + 1)),
        [(NAME, "/data")],
    ],
)
def test_run_argv_refuses_a_mount_it_should_not_make(mounts) -> None:
    with pytest.raises(ValueError):
        runtime.run_argv(spec(mounts=mounts))
