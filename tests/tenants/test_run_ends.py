"""The parts of ending a run on their own: judging how it ended from what `docker
inspect` says and what it printed, holding a node's exit time within the run, and giving
back the minutes the minute meter charged after the exit (tests/tenants/test_exit_codes.py
and tests/tenants/test_lab_exit_codes.py run them end to end)."""

from datetime import UTC, datetime, timedelta

import pytest
from django.db import transaction

from nodes import runtime
from nodes.models import Allocation, Gpu, Node
from tenants.locks import slice_lock
from tenants.models import Slice, UsageRecord
from tenants.run_ends import run_end_of, within_run
from tenants.services.billing import slice_meter, slice_meter_to_end

pytestmark = pytest.mark.django_db


def charged(s: Slice) -> tuple[int, int, int]:
    """(the slice's minutes, its records' minutes, minutes its purchase has left)."""
    s.refresh_from_db()
    records = sum(UsageRecord.objects.filter(slice=s).values_list("minutes", flat=True))
    s.purchase.refresh_from_db()
    return s.minutes_used, records, s.purchase.minutes_left


@pytest.mark.parametrize(
    ("text", "moment"),
    [
        ("2031-03-01T10:00:21.987654321Z", datetime(2031, 3, 1, 10, 0, 21, 987654, tzinfo=UTC)),
        ("2031-03-01T10:00:21Z", datetime(2031, 3, 1, 10, 0, 21, tzinfo=UTC)),
        ("2031-03-01T12:00:21.5+02:00", datetime(2031, 3, 1, 10, 0, 21, 500000, tzinfo=UTC)),
        ("0001-01-01T00:00:00Z", None),  # docker's "never"
        ("", None),
        ("2031-03-01T10:00:21", None),  # no zone: not docker's
        ("soon", None),
    ],
)
def test_dockers_timestamps_are_read_to_the_microsecond(text, moment):
    assert runtime.docker_time(text) == moment


def info(**kw) -> runtime.ContainerInfo:
    values = {
        "id": "c" * 64,
        "name": "gpp-slice-1",
        "image": "x/y:1",
        "owner_key": "slice-1",
        "running": False,
        "status": "exited",
        "exit_code": 0,
        "oom_killed": False,
        "error": "",
        "started_at": "2031-03-01T10:00:00.123456789Z",
        "finished_at": "2031-03-01T10:00:21.987654321Z",
        "ports": {},
        "labels": {},
    }
    return runtime.ContainerInfo(**(values | kw))


OOM_LOG = "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB"


@pytest.mark.parametrize(
    ("container", "logs", "peak_mb", "completed", "ended_by"),
    [
        (info(), "done", None, True, "job"),
        (info(exit_code=3), "", None, False, "job"),
        (info(exit_code=1), OOM_LOG, 7900, False, "job"),  # ran out inside its own 8 GB
        (info(exit_code=1), OOM_LOG, 3000, False, "platform"),  # the card ran out first
        (info(exit_code=1), OOM_LOG, None, False, "platform"),
        (info(exit_code=137, oom_killed=True), "", None, False, "job"),
        (info(exit_code=137), "", None, False, "platform"),
        (info(exit_code=127, error="exec: not found"), "", None, False, "platform"),
        (info(status="created", started_at="", finished_at=""), "", None, False, "platform"),
        (info(status="dead", exit_code=0), "", None, False, "platform"),
        (None, "", None, False, "platform"),
    ],
)
def test_how_a_run_ended_is_judged_from_docker_and_its_output(
    container, logs, peak_mb, completed, ended_by
):
    end = run_end_of(container, logs=logs, quota_mb=8192, peak_mb=peak_mb)
    assert (end.completed, end.ended_by) == (completed, ended_by)
    if container is not None and container.status == "exited":
        assert end.exited_at == datetime(2031, 3, 1, 10, 0, 21, 987654, tzinfo=UTC)
        assert end.started_at == datetime(2031, 3, 1, 10, 0, 0, 123456, tzinfo=UTC)
    if "CUDA out of memory" in logs:
        assert "ran out of GPU memory" in end.reason


def test_a_nodes_exit_time_is_held_within_the_run():
    began = datetime(2031, 3, 1, 10, 0, tzinfo=UTC)
    now = began + timedelta(minutes=5)
    exit_at = began + timedelta(seconds=21)
    assert within_run(exit_at, began=began, now=now) == exit_at
    assert within_run(began - timedelta(minutes=1), began=began, now=now) == began  # slow clock
    assert within_run(now + timedelta(minutes=1), began=began, now=now) == now  # fast clock
    assert within_run(None, began=began, now=now) == now  # docker did not say


def metered_slice(owner, funded) -> Slice:
    """A running slice, metered twice by the minute meter: 2 minutes, then 1."""
    purchase = funded(owner, vram_gb=8, hours=1)
    node = Node.objects.create(name="n", address="10.0.0.9", status="active", host_key="k")
    gpu = Gpu.objects.create(node=node, uuid="GPU-n-0", index=0, model="A30", vram_total_mb=24576)
    allocation = Allocation.objects.create(gpu=gpu, vram_mb=8192, owner_key="x", state="active")
    t0 = datetime(2031, 3, 1, 10, 0, tzinfo=UTC)
    s = Slice.objects.create(
        tenant=owner.tenant, purchase=purchase, image="x/y:1", vram_mb=8192, state="running",
        allocation=allocation, started_at=t0, last_metered_at=t0,
    )  # fmt: skip
    with transaction.atomic():
        slice_meter(slice=slice_lock(s.pk), now=t0 + timedelta(minutes=2, seconds=10))
    with transaction.atomic():
        slice_meter(slice=slice_lock(s.pk), now=t0 + timedelta(minutes=3, seconds=10))
    assert charged(s) == (3, 3, 57)
    return s


@pytest.mark.parametrize(
    ("after", "kept", "records"),
    [
        (timedelta(seconds=30), 1, [(1, 59)]),  # the 2-minute record is cut to 1
        (timedelta(seconds=70), 2, [(2, 58)]),  # the later record is dropped
        (timedelta(minutes=2, seconds=1), 3, [(2, 58), (1, 57)]),  # nothing after its minute
    ],
)
def test_minutes_metered_after_the_exit_go_back_to_the_purchase(
    owner_a, funded, after, kept, records
):
    s = metered_slice(owner_a, funded)
    end = s.started_at + after
    with transaction.atomic():
        returned = slice_meter_to_end(slice=slice_lock(s.pk), end=end)
    assert returned == kept - 3
    assert charged(s) == (kept, kept, 60 - kept)
    rows = UsageRecord.objects.filter(slice=s).order_by("period_start")
    assert [(r.minutes, r.minutes_left_after) for r in rows] == records
    assert all(r.period_end == r.period_start + timedelta(minutes=r.minutes) for r in rows)
    with transaction.atomic():  # a retry of the same end charges and returns nothing
        assert slice_meter_to_end(slice=slice_lock(s.pk), end=end) == 0
    assert charged(s) == (kept, kept, 60 - kept)
