"""How a run ends on real node software (the node lab: a real sshd and Docker Engine, only
the GPU emulated): the lab's GPU job finishes by itself after two seconds, with the exit
code it is given. Exit 0 is `completed`, exit 3 `failed` with the code in its reason; both
are charged to the container's exit as the node's dockerd recorded it (`State.FinishedAt`),
not to when the platform noticed, after the minute meter had run on for three minutes."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from nodes.models import Allocation
from tenants import services
from tenants.models import Slice, UsageRecord
from tests.incidents.test_chaos import launcher
from tests.worker_harness import wait_for

pytestmark = [pytest.mark.lab, pytest.mark.django_db(transaction=True)]

TIER_GB = 4
LATE = timedelta(minutes=3, seconds=5)  # when the minute meter ran, after the start


def docker_moment(text: str) -> datetime:
    """A docker timestamp ("2031-03-01T10:00:21.987654321Z"), to the microsecond."""
    head, _, fraction = text.removesuffix("Z").partition(".")
    return datetime.fromisoformat(head).replace(
        microsecond=int((fraction + "000000")[:6]), tzinfo=UTC
    )


def ran_to_its_end(fleet, funded, image, owner, code: int):
    """A slice whose job exits with `code` two seconds in, charged by the minute meter
    three minutes on before reconcile looks; with when dockerd says it ended."""
    lab = fleet.nodes[0]
    s = launcher(funded, image)(
        owner,
        TIER_GB,
        WORKLOAD_MB="500",
        WORKLOAD_EXIT_AFTER_S="2",
        WORKLOAD_EXIT_CODE=str(code),
    )
    s.refresh_from_db()
    assert s.state == "running", s.state_reason
    assert wait_for(lambda: not lab.container(s.container_id).running, timeout=30)
    seen = lab.container(s.container_id)
    assert (seen.status, seen.exit_code, seen.oom_killed) == ("exited", code, False)
    finished = docker_moment(seen.raw["State"]["FinishedAt"])
    assert s.started_at < finished < s.started_at + timedelta(minutes=1)
    services.running_slices_meter(now=s.started_at + LATE)
    s.refresh_from_db()
    assert s.minutes_used == 3 and s.state == "running"
    return s, finished


def charged(s: Slice) -> tuple[int, int, int]:
    s.refresh_from_db()
    s.purchase.refresh_from_db()
    records = sum(UsageRecord.objects.filter(slice=s).values_list("minutes", flat=True))
    return s.minutes_used, records, s.purchase.minutes_left


def test_a_job_that_exits_0_is_completed_and_billed_to_its_exit(
    eager, lab_fleet, funded, lab_image, owner_a
):
    fleet = lab_fleet()
    s, finished = ran_to_its_end(fleet, funded, lab_image, owner_a, 0)

    counts = services.slices_reconcile()
    s.refresh_from_db()
    assert s.state == "completed", s.state_reason
    assert s.exit_code == 0 and "exited with code 0" in s.state_reason
    assert (counts.get("completed"), counts["failed"]) == (1, 0)
    assert list(s.transitions.values_list("to_state", flat=True)) == [
        "requested",
        "provisioning",
        "running",
        "completed",
    ]
    # it ran two seconds: its started minute, to dockerd's own FinishedAt
    assert s.stopped_at == finished
    assert charged(s) == (1, 1, 119)
    assert Allocation.objects.get(pk=s.allocation_id).state == Allocation.State.RELEASED
    assert wait_for(lambda: fleet.nodes[0].container(s.container_id) is None, timeout=10)
    assert s.ended_by == "job"

    assert services.slices_reconcile()["completed"] == 0  # a second round: nothing again
    assert charged(s) == (1, 1, 119)


def test_a_job_that_exits_3_is_failed_with_its_code_and_billed_to_its_exit(
    eager, lab_fleet, funded, lab_image, owner_a
):
    fleet = lab_fleet()
    s, finished = ran_to_its_end(fleet, funded, lab_image, owner_a, 3)

    assert services.slices_reconcile()["failed"] == 1
    s.refresh_from_db()
    assert s.state == "failed" and s.exit_code == 3
    assert "exited with code 3" in s.state_reason, s.state_reason
    assert Allocation.objects.get(pk=s.allocation_id).state == Allocation.State.RELEASED
    # billed to dockerd's FinishedAt, not to when reconcile looked
    assert s.stopped_at == finished
    assert charged(s) == (1, 1, 119)
    assert s.ended_by == "job"  # its own exit, nothing the platform did
