"""The commands that give each volume a filesystem of its size on the node, as argv: where
they live (beside docker's data root, shifted ids on a userns-remap daemon), the steps
that make, mount, hand over and remove one, whom an image runs as, and the one home
directory a volume may take. Pure: no node."""

from __future__ import annotations

import pytest

from nodes import runtime, volumes
from tests.nodes.test_runtime import flag_values, options, spec

NAME = "gpp-vol-12-0a1b2c3d"
DISKS = volumes.NodeDisks(base="/var/lib/gpuplatform-volumes")


def test_the_volumes_live_beside_dockers_data_root_and_a_remapped_root_shifts_ids() -> None:
    assert volumes.parse_docker_root("/var/lib/docker\n") == DISKS
    remapped = volumes.parse_docker_root("/srv/docker/1500000000.1500000000")
    assert remapped.base == "/srv/gpuplatform-volumes"
    assert remapped.host_owner(1000, 1000) == "1500001000:1500001000"
    assert DISKS.host_owner(1000, 100) == "1000:100"
    with pytest.raises(ValueError, match="remapped range"):
        remapped.host_owner(70000, 0)
    for bad in ("", "/", "docker", "/var/lib/../docker", "/var/lib/docker; rm -rf /", "/a b"):
        with pytest.raises(ValueError):
            volumes.parse_docker_root(bad)


def test_a_volume_is_a_sparse_file_formatted_then_renamed_into_place() -> None:
    truncate, mkfs, rename = volumes.image_make_argvs(DISKS, NAME, 2)
    part = f"/var/lib/gpuplatform-volumes/{NAME}.ext4.part"
    assert truncate == ["truncate", "-s", "2000000000", "--", part]
    assert mkfs == ["mkfs.ext4", "-q", "-F", "-m", "0", "--", part]
    assert rename == ["mv", "-f", "--", part, DISKS.image(NAME)]
    assert volumes.base_dir_argv(DISKS) == ["mkdir", "-p", "-m", "0700", "--", DISKS.base]
    for size in (0, -1, True, 1.5, "1"):
        with pytest.raises(ValueError):
            volumes.image_make_argvs(DISKS, NAME, size)  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        DISKS.image("../../etc/passwd")


def test_the_bare_mount_point_is_made_immutable_before_the_loop_mount() -> None:
    where = f"/var/lib/gpuplatform-volumes/{NAME}"
    assert volumes.mount_argvs(DISKS, NAME) == [
        ["chattr", "+i", "--", where],
        ["mount", "-o", "loop,nosuid,nodev", "--", DISKS.image(NAME), where],
    ]
    assert volumes.is_mounted_argv(DISKS, NAME) == ["mountpoint", "-q", "--", where]
    assert volumes.files_remove_argvs(DISKS, NAME)[-2:] == [
        ["chattr", "-i", "--", where],
        ["rmdir", "--", where],
    ]


def test_only_the_volumes_root_directory_is_given_never_recursively_nor_through_a_link() -> None:
    chown, chmod = volumes.owner_argvs(DISKS, NAME, 1000, 1000, home=False)
    where = DISKS.mountpoint(NAME)
    assert chown == ["chown", "--no-dereference", "--", "1000:1000", where]
    assert chmod == ["chmod", "--", "0777", where]
    assert not any(flag in chown + chmod for flag in ("-R", "--recursive", "-L"))
    # a home sshd accepts (StrictModes): not writable by group or others
    assert volumes.owner_argvs(DISKS, NAME, 1000, 1000, home=True)[1][2] == "0755"


def test_the_docker_volume_binds_the_mounted_filesystem() -> None:
    labels = {"gpuplatform.owner": "volume-12"}
    argv = volumes.create_argv(NAME, labels, device=DISKS.mountpoint(NAME))
    assert argv[3:11] == ["--driver", "local", "--opt", "type=none", "--opt", "o=bind",
                          "--opt", f"device={DISKS.mountpoint(NAME)}"]  # fmt: skip
    assert argv[-1] == NAME
    with pytest.raises(ValueError):
        volumes.create_argv(NAME, {}, device="/tmp/x,o=ro")


def test_only_the_platforms_own_directory_is_read_back_as_a_volumes_device() -> None:
    mine = f"/var/lib/docker/volumes/{NAME}/_data " + '{"device":"%s","o":"bind","type":"none"}'
    assert volumes.parse_device(mine % DISKS.mountpoint(NAME), NAME) == DISKS.mountpoint(NAME)
    assert volumes.parse_device(f"/var/lib/docker/volumes/{NAME}/_data null", NAME) == ""
    assert volumes.parse_device(f"/var/lib/docker/volumes/{NAME}/_data {{}}", NAME) == ""
    for device in ("/etc", f"/var/lib/gpuplatform-volumes/{NAME}/../x", "/srv/other/" + NAME,
                   "/var/lib/gpuplatform-volumes/gpp-vol-13-0a1b2c3d"):  # fmt: skip
        with pytest.raises(ValueError):
            volumes.parse_device(mine % device, NAME)
    assert volumes.parse_mountpoint(mine % "/x") == f"/var/lib/docker/volumes/{NAME}/_data"


def test_root_commands_go_through_sudo_for_an_ordinary_ssh_user() -> None:
    assert volumes.as_root(["mount", "x"], "root") == ["mount", "x"]
    assert volumes.as_root(["mount", "x"], "gpuplatform") == ["sudo", "-n", "--", "mount", "x"]


@pytest.mark.parametrize(
    ("user", "needs", "ids"),
    [("", False, (0, 0)), ("root", False, (0, 0)), ("0", False, (0, 0)),
     ("1000:1000", False, (1000, 1000)), ("1000", True, (1000, 100)),
     ("renter", True, (1000, 100)), ("renter:staff", True, (1000, 50)),
     ("1000:root", False, (1000, 0)), ("4242", True, (4242, 0))],
)  # fmt: skip
def test_whom_an_image_runs_as_is_resolved_as_docker_does(user, needs, ids) -> None:
    passwd = "root:x:0:0::/root:/bin/sh\nrenter:x:1000:100::/home/renter:/bin/sh\nbad:x:y:z\n"
    group = "root:x:0:\nstaff:x:50:\nusers:x:100:\n"
    assert volumes.needs_account_files(user) is needs
    assert volumes.resolve_image_user(user, passwd, group) == ids


@pytest.mark.parametrize("user", ["ghost", "renter:ghosts", "a b", "$(id)", "1000:x;y"])
def test_an_image_user_that_cannot_be_resolved_is_refused(user) -> None:
    with pytest.raises(ValueError):
        volumes.resolve_image_user(user, "renter:x:1000:100::/:/bin/sh\n", "users:x:100:\n")


def test_an_ssh_logins_home_is_a_mount_point_and_nothing_beside_it() -> None:
    home = volumes.home_of("renter")
    assert home == "/home/renter"
    assert volumes.mount_path_refusal("/home/renter", home=home) is None
    for path in ("/home/renter/x", "/home", "/home/other", "/home/renter/../root"):
        assert volumes.mount_path_refusal(path, home=home), path
    assert volumes.mount_path_refusal("/home/renter")  # not without the SSH image's user
    for user in ("root", "", "a/b", "..", "-x", "Renter", None, "x" * 40):
        assert volumes.home_of(user) == "", user
    argv = runtime.run_argv(spec(mounts=((NAME, "/home/renter"),), mount_home="/home/renter"))
    assert flag_values(options(argv, "registry.local/ml/torch:2.3"), "--mount")[0] == (
        f"type=volume,source={NAME},target=/home/renter"
    )
    with pytest.raises(ValueError):
        runtime.run_argv(spec(mounts=((NAME, "/home/renter"),)))
