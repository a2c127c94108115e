"""How a run ends when its container stops without the platform asking, against the node
emulator: exit 0 by itself is `completed`, anything else `failed` with the exit in its
reason, each charged up to the container's exit (docker's FinishedAt), not to when
reconcile noticed, and each recorded with who ended it (the KPIs read that). The judging
and the minute arithmetic are tested on their own in tests/tenants/test_run_ends.py.
States are spelled as the API spells them."""

from datetime import UTC, datetime, timedelta

import pytest
from django.core import mail
from django.utils import timezone

from nodes import runtime
from nodes import services as node_services
from nodes.models import Allocation, Gpu, Node
from tenants import services
from tenants.models import Slice, UsageRecord
from tests.conftest import launch
from tests.worker_harness import wait_for

pytestmark = pytest.mark.django_db(transaction=True)

LATE = timedelta(minutes=3, seconds=5)  # how long after the start the minute meter ran


def docker_moment(text: str) -> datetime:
    """A docker timestamp ("2031-03-01T10:00:21.987654321Z"), to the microsecond."""
    head, _, fraction = text.removesuffix("Z").partition(".")
    return datetime.fromisoformat(head).replace(
        microsecond=int((fraction + "000000")[:6]), tzinfo=UTC
    )


def started(fleet, owner, funded, image, **env: str) -> tuple[Slice, Node]:
    s = launch(owner, funded(owner, vram_gb=8, hours=2), image, environment=env)
    assert s.state == "running", s.state_reason
    return s, fleet.registered[0]


def exited(node: Node, s: Slice) -> runtime.ContainerInfo:
    """The slice's container once docker says it is no longer running."""

    def dead() -> runtime.ContainerInfo | None:
        info = node_services.container_inspect(node=node, container=s.container_id)
        return info if info is not None and not info.running else None

    info = wait_for(dead, timeout=15)
    assert info is not None, "the container did not end"
    return info


def noticed_late(s: Slice) -> None:
    """The minute meter ran three minutes after the start before reconcile saw the
    container dead (reconcile lagged, or could not list the node for a few rounds)."""
    services.running_slices_meter(now=s.started_at + LATE)
    s.refresh_from_db()
    assert s.minutes_used == 3 and s.state == "running"


def charged(s: Slice) -> tuple[int, int, int]:
    """(the slice's minutes, its records' minutes, minutes its purchase has left)."""
    s.refresh_from_db()
    records = sum(UsageRecord.objects.filter(slice=s).values_list("minutes", flat=True))
    s.purchase.refresh_from_db()
    return s.minutes_used, records, s.purchase.minutes_left


def test_a_job_that_exits_0_by_itself_is_completed_and_charged_to_its_exit(
    eager, worker_fleet, owner_a, funded, image_ssh
):
    fleet = worker_fleet()
    s, node = started(fleet, owner_a, funded, image_ssh, EMULATOR_EXIT_AFTER_S="1")
    info = exited(node, s)
    assert (info.status, info.exit_code) == ("exited", 0)
    finished = docker_moment(info.finished_at)
    assert s.started_at < finished < timezone.now()
    noticed_late(s)

    counts = services.slices_reconcile()
    s.refresh_from_db()
    assert s.state == "completed" and s.exit_code == 0, s.state_reason
    assert "exited with code 0" in s.state_reason
    assert (counts.get("completed"), counts["failed"]) == (1, 0)
    assert [t.to_state for t in s.transitions.all()] == [
        "requested",
        "provisioning",
        "running",
        "completed",
    ]
    # it ran about a second: one started minute, and the minutes the meter took after its
    # exit went back to the purchase
    assert s.stopped_at == finished
    assert charged(s) == (1, 1, 119)
    assert s.allocation.state == Allocation.State.RELEASED
    assert Gpu.objects.get(pk=s.allocation.gpu_id).allocated_mb == 0
    assert fleet.nodes[0].container(s.container_id) is None  # removed
    assert any(f"Slice {s.pk} completed" in m.subject for m in mail.outbox)
    assert not any(f"Slice {s.pk} failed" in m.subject for m in mail.outbox)
    assert s.ended_by == "job"

    # tasks run at least once: a second round, and the meter, charge nothing again
    assert services.slices_reconcile()["completed"] == 0
    services.running_slices_meter(now=s.started_at + LATE * 2)
    assert charged(s) == (1, 1, 119)
    assert s.transitions.count() == 4


def test_a_job_that_exits_3_fails_with_its_code_charged_to_its_exit(
    eager, worker_fleet, owner_a, funded, image_ssh
):
    fleet = worker_fleet()
    s, node = started(
        fleet, owner_a, funded, image_ssh, EMULATOR_EXIT_AFTER_S="1", EMULATOR_EXIT_CODE="3"
    )
    assert exited(node, s).exit_code == 3
    noticed_late(s)

    assert services.slices_reconcile()["failed"] == 1
    s.refresh_from_db()
    assert s.state == "failed" and s.exit_code == 3
    assert "exited with code 3" in s.state_reason, s.state_reason
    assert any(f"Slice {s.pk} failed" in m.subject for m in mail.outbox)
    assert charged(s) == (1, 1, 119)
    assert s.ended_by == "job"  # its own exit: not the platform's doing


@pytest.mark.parametrize(
    ("exit_code", "oom_killed", "ended_by", "words"),
    [
        (137, True, "job", "killed out of memory (exit 137)"),  # its own host RAM
        (137, False, "platform", "exited with code 137"),  # killed from outside
        (143, False, "platform", "exited with code 143"),
        (1, False, "job", "exited with code 1"),
    ],
)
def test_who_ended_a_failed_run_is_recorded_with_its_reason(
    eager, worker_fleet, owner_a, funded, image_ssh, exit_code, oom_killed, ended_by, words
):
    fleet = worker_fleet()
    s, _ = started(fleet, owner_a, funded, image_ssh)
    fleet.nodes[0].kill_container(s.container_id, exit_code, oom_killed=oom_killed)
    assert services.slices_reconcile()["failed"] == 1
    s.refresh_from_db()
    assert s.state == "failed" and s.exit_code == exit_code
    assert words in s.state_reason and s.ended_by == ended_by


def test_a_container_gone_from_the_node_fails_its_slice_as_the_platforms_doing(
    eager, worker_fleet, owner_a, funded, image_ssh
):
    fleet = worker_fleet()
    s, _ = started(fleet, owner_a, funded, image_ssh)
    assert fleet.nodes[0].execute(f"docker rm -f {s.container_id}").status == 0
    assert services.slices_reconcile()["failed"] == 1
    s.refresh_from_db()
    assert s.state == "failed" and s.exit_code is None
    assert "gone from the node" in s.state_reason
    assert s.ended_by == "platform"


def test_a_job_done_before_the_start_check_looked_is_completed_not_failed(
    eager, worker_fleet, owner_a, funded, image_ssh
):
    worker_fleet()
    purchase = funded(owner_a, vram_gb=8, hours=2)
    s = launch(owner_a, purchase, image_ssh, environment={"EMULATOR_EXIT_AFTER_S": "0"})
    assert s.state == "completed", s.state_reason
    assert [t.to_state for t in s.transitions.all()] == ["requested", "provisioning", "completed"]
    assert s.exit_code == 0 and s.ended_by == "job"
    # it ran: from docker's StartedAt to its FinishedAt, a started minute charged
    assert s.started_at is not None and s.started_at <= s.stopped_at
    assert charged(s) == (1, 1, 119)
    assert s.allocation.state == Allocation.State.RELEASED


def test_a_completed_slice_can_be_resumed_as_a_new_run(
    eager, worker_fleet, owner_a, funded, image_ssh
):
    fleet = worker_fleet()
    s, node = started(fleet, owner_a, funded, image_ssh, EMULATOR_EXIT_AFTER_S="5")
    exited(node, s)
    services.slices_reconcile()
    s.refresh_from_db()
    assert s.state == "completed"
    services.slice_resume(slice=s, membership=owner_a, purchase=s.purchase)
    s.refresh_from_db()
    assert (s.runs, s.state, s.exit_code, s.ended_by) == (2, "running", None, "")
    assert s.transitions.filter(from_state="completed", to_state="requested").exists()
