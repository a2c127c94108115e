"""The watchdog-quality benchmark's preemption-for-room figures (bench/_preemption.py), run
short: interruptible slices fill an idle card sold at its memory, and a full-price launch
waits no longer than the notice for the newest one's room."""

from __future__ import annotations

import importlib

import pytest
from django.apps import apps

from tenants.models import Tier
from tests.bench_support import load_bench

pytestmark = pytest.mark.django_db(transaction=True)


def test_interruptible_time_runs_idle_and_a_full_price_launch_waits_at_most_the_notice(
    settings, tmp_path
):
    if not Tier.objects.exists():  # a transactional test's flush emptied the seeded tiers
        importlib.import_module("tenants.migrations.0002_seed_tiers").seed(apps, None)
    settings.NODES_CONTAINER_SETTLE_S = 0
    wq = load_bench("watchdog_quality")
    from _preemption import preemption_for_room_day  # noqa: PLC0415 - bench/ on sys.path now

    report = preemption_for_room_day(tmp_path, emulated_time=wq.emulated_time)
    lines = "\n".join(report.lines())
    assert report.ran_idle == 3, lines  # all of them, on a card sold at its memory
    assert report.newest_only and report.signalled == 1 and report.webhooks == 1, lines
    assert 0 <= report.wait_s <= report.notice_s + 5, lines  # at the deadline at the latest
    assert "RESULT preemption_interruptible_ran_idle=3 slices" in lines
    assert "RESULT preemption_fullprice_wait_s=" in lines and "baseline=30 ratio=" in lines
