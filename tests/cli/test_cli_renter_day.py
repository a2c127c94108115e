"""What a new renter met with `gpp` on a first day, each fixed: the first `gpp logs` of a
running slice prints what it printed (or says plainly that nothing came yet), `gpp ps`
keeps a slice to one line at 80 columns, a refused launch lists the estimate's
suggestions, `gpp resume` pays from the purchase the resume page preselects, and
`gpp usage` marks interruptible purchases."""

from __future__ import annotations

import threading

import pytest
from django.db import connection

from tenants import selectors, services
from tenants.models import Image, Purchase, Slice, SliceLogLine
from tenants.services import logs as log_service
from tests.conftest import SSH_KEY

pytestmark = pytest.mark.django_db(transaction=True)


def _launch(gpp) -> dict:
    done = gpp("launch", "--image", "CUDA base", "--model", "Qwen/Qwen2.5-1.5B", "--tier", "4",
               "--context", "2048", "--ssh-key", SSH_KEY, "--wait", "--json")  # fmt: skip
    assert done.code == 0, done.stderr
    return done.json()


@pytest.fixture
def slow_worker(monkeypatch):
    """Make the worker that reads a running slice's output off its node answer `delay_s`
    after the API asked it (as a real one does, unlike the eager test setting), or never
    (None). Its reads still pending when the test ends are cancelled or waited for."""
    timers: list[threading.Timer] = []

    def collect(slice_id: int) -> None:
        try:
            services.slice_logs_collect(slice_id=slice_id)
        finally:
            connection.close()

    def start(delay_s: float | None) -> None:
        def collect_later(name: str, slice_id: int) -> None:
            if delay_s is not None:
                timers.append(threading.Timer(delay_s, collect, args=(slice_id,)))
                timers[-1].start()

        monkeypatch.setattr(log_service, "enqueue", collect_later)

    yield start
    for timer in timers:
        timer.cancel()
        timer.join(10)


def test_the_first_logs_of_a_running_slice_print_what_it_printed(
    gpp, owner, fleet, credit, slow_worker
):
    gpp("buy", "4", "--hours", "1", "--yes")
    ident = _launch(gpp)["id"]
    slice = Slice.objects.get(pk=ident)
    fleet.nodes[0].container_print(slice.container_id, "loading weights\nready on :8000")
    assert not SliceLogLine.objects.filter(slice=slice, text="ready on :8000").exists()
    slow_worker(1.5)
    first = gpp("logs", str(ident))
    assert first.code == 0, first.stderr
    assert first.stdout.index("loading weights") < first.stdout.index("ready on :8000")
    assert "-- up to line" in first.stderr


def test_logs_say_on_stderr_when_a_running_slice_printed_nothing_yet(
    gpp, owner, fleet, credit, slow_worker
):
    gpp("buy", "4", "--hours", "1", "--yes")
    ident = _launch(gpp)["id"]
    slow_worker(None)  # the node is never read: nothing is kept
    SliceLogLine.objects.filter(slice_id=ident).delete()
    quiet = gpp("logs", str(ident))
    assert quiet.code == 0 and quiet.stdout == ""
    assert f"Slice {ident} has printed nothing yet" in quiet.stderr


def test_ps_keeps_each_slice_to_one_line_at_80_columns_and_json_whole(
    gpp, owner, fleet, credit, image_ssh
):
    gpp("buy", "4", "--hours", "1", "--yes")
    ident = _launch(gpp)["id"]
    long_name = "pytorch-cuda-12.4-devel-ubuntu22.04-with-flash-attention"
    Image.objects.filter(pk=image_ssh.pk).update(name=long_name)
    reason = "Started again after the node came back; its GPU was drained and refilled."
    Slice.objects.filter(pk=ident).update(state_reason=reason)
    table = gpp("ps", COLUMNS="80")
    assert table.code == 0, table.stderr
    lines = table.stdout.splitlines()
    assert len(lines) == 2 and all(len(line) <= 80 for line in lines), lines
    assert lines[1].startswith(f"{ident} ") and "running" in lines[1] and "…" in lines[1]
    assert lines[0].split()[:3] == ["ID", "STATE", "TIER"]
    [row] = gpp("ps", "--json", COLUMNS="80").json()
    assert row["image_name"] == long_name and row["state_reason"] == reason
    assert {"minutes_used", "peak_vram_mb", "started_at", "image_reference"} <= set(row)


def test_a_refused_launch_lists_the_estimates_suggestions(gpp, owner, credit, image_ssh):
    bought = gpp("buy", "4", "--hours", "1", "--yes", "--json").json()
    args = ("launch", "--image", "CUDA base", "--purchase", str(bought["id"]),
            "--model", "meta-llama/Llama-3.1-8B", "--ssh-key", SSH_KEY)  # fmt: skip
    done = gpp(*args)
    assert done.code == 1 and "estimate_exceeds_tier" in done.stderr
    estimate = Slice.objects.get().estimate
    assert estimate["suggestions"], "the estimator offers changes for this job"
    first = estimate["suggestions"][0]
    assert f"try: {first['label']}" in done.stderr
    assert "the smallest tier that fits is 24 GB: gpp buy 24 --hours N" in done.stderr
    assert done.stderr.count("Nothing was reserved") == 1  # said once, not again per field
    error = gpp(*args, "--json").error()
    assert error["code"] == "estimate_exceeds_tier"
    assert [s["label"] for s in error["suggestions"]] == [
        s["label"] for s in estimate["suggestions"]
    ]
    assert error["smallest_fitting_tier_mib"] == estimate["smallest_fitting_tier_mib"]


def test_resume_pays_from_the_default_purchase_and_usage_marks_interruptible(
    gpp, owner, fleet, credit
):
    own = gpp("buy", "4", "--hours", "1", "--yes", "--json").json()
    ident = _launch(gpp)["id"]
    assert gpp("stop", str(ident), "--yes", "--wait").code == 0
    Purchase.objects.filter(pk=own["id"]).update(minutes_left=0)
    full = gpp("buy", "4", "--hours", "1", "--yes", "--json").json()
    cheap = gpp("buy", "4", "--hours", "1", "--interruptible", "--yes", "--json").json()
    slice = Slice.objects.get(pk=ident)
    assert selectors.purchase_resume_default(slice=slice).pk == full["id"]
    resumed = gpp("resume", str(ident))
    assert resumed.code == 0, resumed.stderr
    assert f"paid by purchase {full['id']}" in resumed.stdout
    assert Slice.objects.get(pk=ident).purchase_id == full["id"]

    usage = gpp("usage")
    assert usage.code == 0, usage.stderr
    [row] = [
        line for line in usage.stdout.splitlines() if line.strip().startswith(str(cheap["id"]))
    ]
    assert "interruptible" in row
    assert gpp("usage", "--json").json()["minutes_interruptible"] == 0

    assert gpp("stop", str(ident), "--yes", "--wait").code == 0
    Purchase.objects.filter(tenant=owner.tenant).update(minutes_left=0)
    none_left = gpp("resume", str(ident), "--json")
    assert none_left.code == 1 and none_left.error()["code"] == "no_free_purchase"
    assert "buy one" in none_left.error()["message"]
