"""Volumes belong to whoever works in the slice, proven with the real OpenSSH client
through the gateway (`ssh -J`): a renter logged into the lab's SSH image (its sshd runs
as the image's user, uid 1000, with every capability dropped) writes to a volume at
/data and to a volume that is their home, the slice stops and resumes in a new container,
and a second login, which must find the same host key (StrictHostKeyChecking=yes against
the known_hosts file the first login filled), reads both files back."""

from __future__ import annotations

import shlex

import pytest

from nodelab import SSH_USER_IN_IMAGE
from tenants import services
from tenants.models import Slice
from tests.conftest import ready_volume
from tests.gateway.support import client_config, client_key, ssh_run
from tests.incidents.test_chaos import MODEL

pytestmark = [pytest.mark.lab, pytest.mark.django_db(transaction=True)]

HOME = f"/home/{SSH_USER_IN_IMAGE}"


def test_a_renter_writes_to_volumes_over_ssh_and_reads_them_back_after_stop_and_resume(
    eager, lab_fleet, funded, lab_ssh_image, owner_a, gateway, tmp_path
):
    lab_fleet()
    key, line = client_key(tmp_path)
    services.ssh_key_add(user=owner_a.user, name="laptop", public_key=line)
    work, home = ready_volume(owner_a, "work"), ready_volume(owner_a, "home")
    s, _ = services.slice_launch(
        membership=owner_a, purchase=funded(owner_a, vram_gb=4, hours=1), image=lab_ssh_image,
        model_request=MODEL, environment={"WORKLOAD_MB": "200"}, ssh_public_key=line,
        volumes=[{"volume": work.pk, "path": "/data/work"}, {"volume": home.pk, "path": HOME}],
    )  # fmt: skip
    s.refresh_from_db()
    assert s.state == Slice.State.RUNNING, s.state_reason
    jump = shlex.split(s.connection["gateway"]["jump"])
    # a fresh known_hosts: the first login learns the slice's host key
    config = client_config(tmp_path, gateway, key)
    assert not any(f"slice-{s.pk}" in entry for entry in (tmp_path / "known_hosts").read_text())

    wrote = ssh_run(
        config, *jump,
        "id -u; echo kept > /data/work/note && echo mine > ~/note && cat /data/work/note ~/note",
    )  # fmt: skip
    assert wrote.returncode == 0, wrote.stderr
    assert wrote.stdout.split() == ["1000", "kept", "mine"]

    services.slice_stop(slice=s, actor=owner_a.user)
    services.slice_resume(membership=owner_a, slice=s, purchase=funded(owner_a, vram_gb=4, hours=1))
    s.refresh_from_db()
    assert s.state == Slice.State.RUNNING and s.runs == 2, s.state_reason

    # the same known_hosts, and no prompt allowed: the resumed slice keeps its host key
    read = ssh_run(
        config, "ssh", "-o", "StrictHostKeyChecking=yes", *jump[1:],
        "cat /data/work/note ~/note; ls -ln /data/work/note ~/note",
    )  # fmt: skip
    assert read.returncode == 0, read.stderr
    kept, mine, *listing = read.stdout.splitlines()
    assert (kept, mine) == ("kept", "mine")
    assert all(entry.split()[2:4] == ["1000", "1000"] for entry in listing), listing
